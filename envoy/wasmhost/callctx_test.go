package wasmhost

import (
	"context"
	"testing"
	"time"
)

type testKey struct{}

// TestCallContextIsAContext checks a call's context against what
// context.WithCancel gives: Value from the VM's context, Done and Err once
// ended, and AfterFunc, asked directly (whenDone) or through
// context.AfterFunc, running each function not stopped once, on its own
// goroutine, stop reporting whether it stopped one.
func TestCallContextIsAContext(t *testing.T) {
	var c callContext
	c.init(context.WithValue(context.Background(), testKey{}, "vm"))
	if got := c.Value(testKey{}); got != "vm" {
		t.Errorf("Value = %v, want the VM context's", got)
	}
	if _, ok := c.Deadline(); ok {
		t.Error("a call's context has a deadline")
	}
	if c.Err() != nil {
		t.Fatalf("Err before the end = %v", c.Err())
	}
	done := c.Done()
	select {
	case <-done:
		t.Fatal("Done closed before the end")
	default:
	}

	ran := make(chan string, 8)
	stopped := whenDone(&c, func() { ran <- "stopped" })
	kept := whenDone(&c, func() { ran <- "direct" })
	viaContext := context.AfterFunc(&c, func() { ran <- "context.AfterFunc" })
	stoppedViaContext := context.AfterFunc(&c, func() { ran <- "stopped via context.AfterFunc" })
	if !stopped() || stopped() {
		t.Error("stop: want true once, then false")
	}
	if !stoppedViaContext() {
		t.Error("context.AfterFunc's stop did not stop it")
	}

	c.end()
	c.end() // a second end changes nothing
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed by the end")
	}
	if c.Err() != context.Canceled {
		t.Errorf("Err = %v, want context.Canceled", c.Err())
	}
	got := map[string]bool{}
	for range 2 {
		select {
		case f := <-ran:
			got[f] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("functions run: %v; want direct and context.AfterFunc", got)
		}
	}
	if !got["direct"] || !got["context.AfterFunc"] {
		t.Errorf("functions run: %v; want direct and context.AfterFunc", got)
	}
	if kept() || viaContext() {
		t.Error("stop after the function ran reported true")
	}

	// Registered after the end: runs at once; Done made after the end
	// is closed.
	whenDone(&c, func() { ran <- "late" })
	select {
	case f := <-ran:
		if f != "late" {
			t.Errorf("ran %q, want late (a stopped function ran)", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a function registered after the end did not run")
	}
	var d callContext
	d.init(context.Background())
	d.end()
	select {
	case <-d.Done():
	default:
		t.Error("Done asked after the end is not closed")
	}
	select {
	case f := <-ran:
		t.Errorf("%q ran after it was stopped", f)
	default:
	}
}
