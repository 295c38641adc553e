package testkit

import (
	"context"
	"testing"
	"time"
)

// First and longest pause between two calls of a polled condition. The
// pause starts short, so that a condition about to hold is seen at once,
// and doubles up to the longest, so that a slow one does not take a core
// from the processes the test is waiting for.
const (
	firstPause = time.Millisecond
	maxPause   = 20 * time.Millisecond
)

// Wait calls cond until it returns true or ctx is done, and returns nil
// or, when ctx ended first, ctx's error. cond is called at once, then after
// pauses of a few milliseconds. It is the poller for code that reports
// errors rather than failing a test, and can be cancelled.
func Wait(ctx context.Context, cond func() bool) error {
	pause := firstPause
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if cond() {
			return nil
		}
		timer.Reset(pause)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		pause = min(2*pause, maxPause)
	}
}

// Until calls cond until it returns true or within has passed, and reports
// whether it held. It calls cond once more when within has passed, so a
// condition that holds by then is never reported false.
func Until(within time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return Wait(ctx, cond) == nil || cond()
}

// Poll waits until cond returns true, and fails t if within passes first,
// with a message naming what was awaited ("waiting for <what>: not within
// <within>"). It must be called from the test's own goroutine.
func Poll(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(within, cond) {
		t.Fatalf("waiting for %s: not within %v", what, within)
	}
}

// PollErr is Poll for a check that says what it saw: it waits until check
// returns nil, and a failure reports the last error along with what was
// awaited.
func PollErr(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	var last error
	if !Until(within, func() bool { last = check(); return last == nil }) {
		t.Fatalf("waiting for %s: not within %v: %v", what, within, last)
	}
}
