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

func TestEveryWaitsAnIntervalFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Every(ctx, time.Millisecond, func() bool {
		t.Error("f called with the context already done")
		return false
	})
}
