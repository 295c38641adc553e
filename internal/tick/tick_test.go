package tick

import (
	"context"
	"testing"
	"time"
)

func TestEveryStopsWhenToldTo(t *testing.T) {
	calls := 0
	Every(context.Background(), time.Millisecond, func() bool {
		calls++
		return calls < 3
	})
	if calls != 3 {
		t.Fatalf("f called %d times, want 3: the third returned false", calls)
	}
}

func TestEveryEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	Every(ctx, time.Millisecond, func() bool {
		calls++
		if calls == 2 {
			cancel()
		}
		return true
	})
	if calls != 2 {
		t.Fatalf("f called %d times, want 2: the context ended during the second", calls)
	}
}

// TestEveryWaitsAnIntervalFirst: the first call comes one interval after
// Every is called, not at once. A Go ticker never fires before its
// interval has passed on the monotonic clock, so the first call is at
// least interval after start however loaded the machine; a call made
// before the first tick comes a few microseconds after start, far below
// the 50 ms interval.
func TestEveryWaitsAnIntervalFirst(t *testing.T) {
	const interval = 50 * time.Millisecond
	var first time.Duration
	start := time.Now()
	Every(context.Background(), interval, func() bool {
		first = time.Since(start)
		return false
	})
	if first < interval {
		t.Fatalf("first call %v after Every was called, want at least the interval, %v", first, interval)
	}
}

func TestEveryNeverCallsWithTheContextDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Every(ctx, time.Millisecond, func() bool {
		t.Error("f called with the context already done")
		return false
	})
}
