package wasmhost

import (
	"syscall"
	"unsafe"
)

// socketUnread is the number of bytes waiting in a socket (SIOCINQ, the
// same request as FIONREAD), 0 if it cannot be asked.
func socketUnread(fd int) int {
	var n int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
		return 0
	}
	return int(n)
}
