package server

import (
	"math"
	"sync/atomic"
	"time"
)

// sendLag tells how long a check waited between the proxy sending it
// (x-ratelimit-sent, the proxy's clock) and the sidecar reading it, without
// trusting the two clocks to agree: the least lag seen lately (transit
// plus whatever the clocks differ by) is the lag of a check that did not
// wait, and a check waited by what its lag exceeds it. The proxy and the
// sidecar run side by side, so the clocks are one, and the least lag is
// the quickest trip over loopback; sidecar/RATIONALE.md, "Why does the
// sidecar not decide a check the proxy has given up on?".
//
// The least lag is kept over two windows of lagWindow, the current and the
// one before, so it follows a clock that drifts and forgets a step within
// two windows.
type sendLag struct {
	window    atomic.Int64 // the current window's number: Unix time / lagWindow
	cur, prev atomic.Int64 // least lag in µs seen in that window and the one before; noLag: none
}

const (
	lagWindow = 10 * time.Second
	noLag     = math.MaxInt64
	// maxLag bounds a lag taken for a wait: a proxy clock further off than
	// this is not a queue, and its checks are taken as not having waited.
	maxLag = int64(time.Minute / time.Microsecond)
)

func newSendLag() *sendLag {
	l := &sendLag{}
	l.cur.Store(noLag)
	l.prev.Store(noLag)
	return l
}

// waited returns how long a check sent at sentUs (µs since the epoch, the
// proxy's clock) and read at now waited beyond the least lag seen lately,
// and records its lag.
func (l *sendLag) waited(now time.Time, sentUs int64) time.Duration {
	lag := now.UnixMicro() - sentUs
	if lag > maxLag || lag < -maxLag {
		return 0
	}
	if w := now.UnixNano() / int64(lagWindow); w != l.window.Load() {
		l.turn(w)
	}
	for {
		c := l.cur.Load()
		if lag >= c || l.cur.CompareAndSwap(c, lag) {
			break
		}
	}
	least := min(l.cur.Load(), l.prev.Load())
	return time.Duration(lag-least) * time.Microsecond
}

// turn starts window w. Checks racing it may record a lag in either
// window: the least lag moves by no more than those lags differ.
func (l *sendLag) turn(w int64) {
	old := l.window.Load()
	if old == w || !l.window.CompareAndSwap(old, w) {
		return
	}
	if w == old+1 {
		l.prev.Store(l.cur.Load())
	} else {
		l.prev.Store(noLag)
	}
	l.cur.Store(noLag)
}
