//go:build unix

package testkit

import (
	"net"
	"syscall"
	"testing"
)

// RefusedAddr returns a loopback host:port where every connection is
// refused until the test ends. The port is held by a socket bound to it
// that does not listen: the kernel answers a connection with a reset, and
// no other socket can bind the port meanwhile. A port listened on and then
// closed, the usual way to get such an address, can be handed to any
// process or test that asks for a free port next, and a connection that
// was meant to be refused reaches its server instead.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	// No SO_REUSEADDR: Linux lets two sockets share a port only when both
	// set it, so no socket can bind this one, whether it names the port or
	// asks the kernel for any free one. Close-on-exec under ForkLock, as
	// the net package does, so that no process the test starts meanwhile
	// inherits the socket and holds the port past the test.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatalf("RefusedAddr: socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("RefusedAddr: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("RefusedAddr: getsockname: %v", err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("RefusedAddr: bound to %T", sa)
	}
	return (&net.TCPAddr{IP: net.IP(in.Addr[:]), Port: in.Port}).String()
}
