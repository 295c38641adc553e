//go:build !unix

package testkit

import (
	"net"
	"testing"
)

// RefusedAddr returns a loopback host:port nothing listens on: a port
// listened on and closed. Outside unix the port is not held, so another
// listener asking for a free port may take it meanwhile.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
