package wasmhost

import (
	"sort"
	"sync"
	"time"
)

// Clock is the host's time source, Envoy's TimeSource: the wall clock behind
// proxy_get_current_time_nanoseconds and WASI's realtime clock, the
// monotonic clock behind WASI's monotonic clock, and the timers behind HTTP
// call timeouts and tick periods.
type Clock interface {
	Now() time.Time
	// Monotonic is time elapsed since an arbitrary fixed origin.
	Monotonic() time.Duration
	// AfterFunc runs f on its own goroutine once d has passed; stop reports
	// whether it stopped f from running.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the real clock. It is the default.
type SystemClock struct{}

var processStart = time.Now()

// Now returns the wall-clock time.
func (SystemClock) Now() time.Time { return time.Now() }

// monotonicOrigin keeps the monotonic clock away from zero, which the Go
// runtime refuses ("nanotime returning zero"), as a real host's never is.
const monotonicOrigin = time.Hour

// Monotonic returns the time since the process started, plus an origin.
func (SystemClock) Monotonic() time.Duration { return monotonicOrigin + time.Since(processStart) }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// ManualClock is a clock that moves only when told to, like Envoy's
// simulated time in its tests: Advance moves both clocks and fires the
// timers that fall due, in order.
type ManualClock struct {
	mu     sync.Mutex
	wall   time.Time
	mono   time.Duration
	seq    int
	timers map[int]*manualTimer
}

type manualTimer struct {
	at  time.Duration // on the monotonic clock
	seq int
	f   func()
}

// NewManualClock returns a clock that reads start until advanced.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{wall: start, mono: monotonicOrigin, timers: map[int]*manualTimer{}}
}

// Now returns the clock's wall time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

// Monotonic returns how far the clock was advanced in total, plus an
// origin.
func (c *ManualClock) Monotonic() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// AfterFunc schedules f for when the clock has been advanced by d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	id := c.seq
	c.timers[id] = &manualTimer{at: c.mono + d, seq: id, f: f}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.timers[id]
		delete(c.timers, id)
		return ok
	}
}

// StepWall moves the wall clock alone by d, forward or back, as an NTP step
// or an operator's date does: the monotonic clock and the timers do not
// move.
func (c *ManualClock) StepWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
}

// Advance moves the clock forward by d and runs, on the calling goroutine
// and in time order, every timer that falls due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mono += d
	var due []*manualTimer
	for id, t := range c.timers {
		if t.at <= c.mono {
			due = append(due, t)
			delete(c.timers, id)
		}
	}
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if due[i].at != due[j].at {
			return due[i].at < due[j].at
		}
		return due[i].seq < due[j].seq
	})
	for _, t := range due {
		t.f()
	}
}
