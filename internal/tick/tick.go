// Package tick runs a function at a fixed interval until it is told to
// stop: the sidecar's background loops (the plans file's poll, the hot
// clients' reconciling, waiting for Redis at start).
package tick

import (
	"context"
	"time"
)

// Every calls f once every interval, the first time one interval from now,
// until ctx is done or f returns false; f is never called once ctx is done.
// A call that takes longer than the interval delays the next; ticks missed
// meanwhile are dropped, not queued.
func Every(ctx context.Context, interval time.Duration, f func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Both cases may be ready at once, and select picks either.
		if ctx.Err() != nil || !f() {
			return
		}
	}
}
