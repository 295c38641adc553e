package wasmhost

import "golang.org/x/sys/unix"

// socketUnread is the number of bytes waiting in a socket (SIOCINQ, the
// same request as FIONREAD), 0 if it cannot be asked.
func socketUnread(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		return 0
	}
	return n
}

// socketEnded reports whether the peer ended the connection (its close,
// or a reset) and the socket has not been closed here: a read now would
// return at once, with the end or the reset. The TCP state is read, not
// the socket, so the connection's reader still sees what it would have.
func socketEnded(fd int) bool {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return false
	}
	// The kernel's TCP states (x/sys names them BPF_TCP_*): CLOSE_WAIT,
	// the peer's FIN came; CLOSE, a reset came.
	return info.State == unix.BPF_TCP_CLOSE_WAIT || info.State == unix.BPF_TCP_CLOSE
}
