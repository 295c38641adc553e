// Package faillog throttles the log lines of a failure that repeats (Redis
// down, refusing writes, a hot client's reconcile failing round after
// round, go-redis's own dial errors) and says when it ends. The first
// failure after a quiet spell is logged at once, then at most one line per
// interval with the number of failures held back since the last, callers
// that read the clock a little before that line included; a failure whose
// error says why, right after a line that said only that one timed out, is
// logged at once too. The end is logged once, at the first success that
// comes a whole interval after the last failure, with the failures held
// back since the last line; a failure that came alone (one decision past
// its deadline on a busy machine) ends without a line, its own line having
// said all there was. During an outage the log then says when it began,
// what Redis answered, roughly how many times, and when it ended, in a few
// lines however much traffic or how many hot clients fail.
package faillog

import (
	"sync/atomic"
	"time"
)

// Log is one failure's throttle. The zero value is not usable: set Every.
// It is safe for concurrent use.
type Log struct {
	Every time.Duration // least time between two failure lines, and the quiet spell that ends a failure

	next    atomic.Int64 // unix nanoseconds when the next failure line may go out
	last    atomic.Int64 // unix nanoseconds of the latest failure
	held    atomic.Int64 // failures not in any line yet
	count   atomic.Int64 // failures since the last end
	failing atomic.Bool  // a failure line went out and its end has not
	vague   atomic.Bool  // the last line was for a failure that said only that it timed out
}

// Failed records n failures at now whose error says what went wrong
// (Redis's reply, a refused connection). It says to log them (log true)
// for the first failure after a quiet spell and then at most once every
// Every, with the number of failures held back before these n; and at
// once, within the interval, when the last line was for a failure that
// only timed out (TimedOut): a line that says only "timeout" must not
// hold back for a whole interval, nor for good when the failures stop
// within it, the error that says why.
func (l *Log) Failed(now time.Time, n int64) (held int64, log bool) {
	return l.failed(now, n, false)
}

// TimedOut is Failed for n failures that say only that they timed out.
func (l *Log) TimedOut(now time.Time, n int64) (held int64, log bool) {
	return l.failed(now, n, true)
}

func (l *Log) failed(now time.Time, n int64, vague bool) (held int64, log bool) {
	t := now.UnixNano()
	l.last.Store(t)
	l.count.Add(n)
	next := l.next.Load()
	// The last line went out at next - Every. A time up to an interval
	// before it is a caller that read the clock before that line went out
	// (checks fail together, each stamped when it began): held with the
	// rest, or a burst of failures would give a line per caller that read
	// the clock first. A time further back is a wall clock that stepped
	// back since: held, every failure would be held until the clock was
	// back there, an hour of silence after a step of an hour.
	within := t < next && t >= next-2*int64(l.Every)
	if within && (vague || !l.vague.Load()) || !l.next.CompareAndSwap(next, t+int64(l.Every)) {
		l.held.Add(n)
		return 0, false
	}
	l.failing.Store(true)
	l.vague.Store(vague)
	return l.held.Swap(0), true
}

// Succeeded records a success at now. If a failure was logged and none
// came in the Every before now, the failure has ended: it says so (ended
// true) once, with the failures held back since the last line, unless the
// failure came alone (ended quietly: nothing to add to its line). A success
// among failures (a Redis Cluster with one master down, a Redis out of
// memory that still denies) ends nothing. Without a failure logged it is
// one atomic load.
func (l *Log) Succeeded(now time.Time) (held int64, ended bool) {
	if !l.failing.Load() {
		return 0, false
	}
	t := now.UnixNano()
	// A time up to an interval before the last failure is a success read
	// from the clock before that failure was: the failure goes on. One
	// further back is a clock stepped back: the end is not held until the
	// clock is back there (a failure after this one is logged at once, as
	// a new one).
	if d := t - l.last.Load(); d > -int64(l.Every) && d < int64(l.Every) || !l.failing.CompareAndSwap(true, false) {
		return 0, false
	}
	l.next.Store(0)
	held = l.held.Swap(0)
	if l.count.Swap(0) <= 1 {
		return 0, false
	}
	return held, true
}
