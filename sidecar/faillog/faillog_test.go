package faillog

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestLog walks one failure through its lines at set times: the first at
// once, the rest held back within the interval, a success among failures
// ending nothing, the end logged once a whole interval after the last
// failure, and the next failure logged at once again.
func TestLog(t *testing.T) {
	l := Log{Every: time.Second}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var failed, ended []int64
	fail := func(ms int, n int64) {
		if h, log := l.Failed(at(ms), n); log {
			failed = append(failed, h)
		}
	}
	succeed := func(ms int) {
		if h, end := l.Succeeded(at(ms)); end {
			ended = append(ended, h)
		}
	}

	succeed(0) // nothing failed: nothing to end
	fail(0, 1) // the first: logged, nothing held
	for ms := 100; ms < 1000; ms += 100 {
		fail(ms, 2) // 9 rounds of 2 within the second: held
		succeed(ms + 50)
	}
	if !slices.Equal(failed, []int64{0}) || len(ended) != 0 {
		t.Fatalf("within the first second: failure lines %v, end lines %v; want [0] and none", failed, ended)
	}
	fail(1000, 1) // a second after the first line: logged with the 18 held
	fail(1500, 3) // held
	succeed(2400) // 0.9 s after the last failure: not over yet
	if !slices.Equal(failed, []int64{0, 18}) || len(ended) != 0 {
		t.Fatalf("failure lines %v, end lines %v; want [0 18] and none", failed, ended)
	}
	succeed(2500) // a whole second without a failure: the end, with the 3 held
	succeed(2600) // once only
	if !slices.Equal(ended, []int64{3}) {
		t.Fatalf("end lines %v, want [3]", ended)
	}
	fail(2700, 1) // a new failure: logged at once, with nothing held
	if !slices.Equal(failed, []int64{0, 18, 0}) {
		t.Fatalf("failure lines %v, want a third, at once", failed)
	}
	succeed(3800) // it came alone: it ends without a line
	fail(3900, 1) // and the next is logged at once
	if !slices.Equal(ended, []int64{3}) || !slices.Equal(failed, []int64{0, 18, 0, 0}) {
		t.Fatalf("after a failure alone: end lines %v, failure lines %v; want [3] and a fourth failure line", ended, failed)
	}
}

// TestLogClockSteppedBack: the times are the host's wall clock, and a step
// back (NTP, an operator's date) in the middle of a failure neither
// silences it nor holds its end until the clock is back where it was: the
// first failure after the step is logged at once, with what was held, and
// so is the end, a whole interval after the last failure on the new clock.
func TestLogClockSteppedBack(t *testing.T) {
	l := Log{Every: 10 * time.Second}
	t0 := time.Unix(100000, 0)
	if _, log := l.Failed(t0, 1); !log {
		t.Fatal("first failure not logged")
	}
	if _, log := l.Failed(t0.Add(time.Second), 2); log {
		t.Fatal("a failure within the interval logged")
	}
	back := t0.Add(-time.Hour)
	if held, log := l.Failed(back, 1); !log || held != 2 {
		t.Fatalf("first failure after a step back of an hour: log %v with %d held, want logged with the 2 held", log, held)
	}
	if _, log := l.Failed(back.Add(time.Second), 1); log {
		t.Fatal("a failure within the interval after the step logged")
	}
	if held, ended := l.Succeeded(back.Add(11 * time.Second)); !ended || held != 1 {
		t.Fatalf("success 10 s after the last failure, on the stepped clock: ended %v with %d held, want ended with 1", ended, held)
	}
	// A step back between a failure's last line and the success that ends
	// it: the end is said at that success.
	t1 := back.Add(time.Minute)
	l.Failed(t1, 1)
	l.Failed(t1.Add(time.Second), 4)
	if held, ended := l.Succeeded(t1.Add(-time.Hour + 20*time.Second)); !ended || held != 4 {
		t.Fatalf("success after a step back of an hour: ended %v with %d held, want ended with the 4 held", ended, held)
	}
}

// A line that says only that a failure timed out does not hold back, for
// the rest of its interval, the first failure whose error says why: that
// one is logged at once, with the failures held since, and the interval
// starts again from it. Timeouts after it, or after a line that said why,
// wait for the interval as any failure does.
func TestLogTimeoutThenWhy(t *testing.T) {
	l := Log{Every: time.Second}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var lines []string
	timedOut := func(ms int, n int64) {
		if h, log := l.TimedOut(at(ms), n); log {
			lines = append(lines, fmt.Sprintf("timeout@%d held %d", ms, h))
		}
	}
	failed := func(ms int, n int64) {
		if h, log := l.Failed(at(ms), n); log {
			lines = append(lines, fmt.Sprintf("why@%d held %d", ms, h))
		}
	}
	timedOut(0, 1)    // the first: logged
	timedOut(100, 2)  // held
	failed(200, 1)    // says why after a line that did not: at once, with the 2 held
	failed(300, 4)    // held: the line said why
	timedOut(400, 1)  // held
	failed(1100, 1)   // within a second of the last line: held
	failed(1200, 1)   // a second after it: logged with the 6 held
	timedOut(2300, 1) // a timeout a second later: logged
	timedOut(2400, 1) // held
	failed(2500, 1)   // says why: at once, with the 1 held
	want := []string{"timeout@0 held 0", "why@200 held 2", "why@1200 held 6", "timeout@2300 held 0", "why@2500 held 1"}
	if !slices.Equal(lines, want) {
		t.Fatalf("lines %q, want %q", lines, want)
	}
	if h, end := l.Succeeded(at(3600)); !end || h != 0 {
		t.Fatalf("the end: %d held, logged %v; want 0 held, logged", h, end)
	}
}

// TestLogCallersOutOfOrder: checks that fail together each stamp their
// failure with the time they began, so a failure can come in stamped a
// little before the line another has just logged, and a success a little
// before the last failure. Neither is a clock stepped back: the failure is
// held with the rest, not given a line of its own, and the success ends
// nothing.
func TestLogCallersOutOfOrder(t *testing.T) {
	l := Log{Every: time.Second}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var lines []int64
	fail := func(ms int, n int64) {
		if h, log := l.Failed(at(ms), n); log {
			lines = append(lines, h)
		}
	}
	fail(0, 1)    // logged
	fail(500, 2)  // held
	fail(1004, 1) // a second on: logged with the 2 held
	fail(1001, 3) // began before that line went out: held
	fail(1003, 1) // held
	if !slices.Equal(lines, []int64{0, 2}) {
		t.Fatalf("failure lines %v, want [0 2]: those stamped just before the second line held with the rest", lines)
	}
	if _, ended := l.Succeeded(at(1002)); ended {
		t.Fatal("a success stamped before the last failure ended it")
	}
	if held, ended := l.Succeeded(at(2003)); !ended || held != 4 {
		t.Fatalf("a second after the last failure: ended %v with %d held, want ended with the 4 held", ended, held)
	}
}
