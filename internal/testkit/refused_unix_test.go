//go:build unix

package testkit

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// RefusedAddr's port refuses connections, and a listener cannot take it
// while the test runs (net.Listen sets SO_REUSEADDR, which would let it
// share a port with a socket that also set it).
func TestRefusedAddr(t *testing.T) {
	addr := RefusedAddr(t)
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("dialing %s connected, want refused", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dialing %s: %v, want connection refused", addr, err)
		}
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("a listener took %s", addr)
	}
}
