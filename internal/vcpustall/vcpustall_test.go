package vcpustall

import (
	"bufio"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// A watcher stopped by SIGSTOP is a CPU that does not run its threads:
// each of them wakes, once continued, as late as it was held, and reports
// it. That is the measurement a hypervisor's stall goes through.
func TestWatchReportsTheTimeItWasHeld(t *testing.T) {
	w, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	if why := w.Unavailable(); why != "" {
		t.Skipf("no real-time priority here, so no watch: %s", why)
	}
	const held = 30 * time.Millisecond
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The stop takes hold when a thread of the watcher takes the signal,
	// and on a busy machine that thread may wait for a CPU for
	// milliseconds while the watching threads go on: the hold is timed
	// from when every thread is seen stopped, not from the signal.
	pid := w.cmd.Process.Pid
	testkit.PollErr(t, 5*time.Second, "every thread of the watcher stopped", func() error { return testkit.ThreadsStopped(pid) })
	from := time.Now()
	time.Sleep(held) // the stall itself, not a wait for readiness
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	to := time.Now()
	// Every CPU's thread reports the hold: at least held less one period
	// (a thread may have been about to be due when the signal came).
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	// A thread's stall ends when it runs again, and on a vCPU that was idle
	// that can come after this goroutine has gone on: polled.
	testkit.PollErr(t, 5*time.Second, "every CPU's report of the hold", func() error {
		seen := map[int]bool{}
		for _, s := range w.Within(from, time.Now(), held-period) {
			seen[s.CPU] = true
		}
		if len(seen) < set.Count() {
			return fmt.Errorf("%d of %d CPUs reported it; stalls: %v", len(seen), set.Count(), w.Stalls(least))
		}
		return nil
	})
	// Sync's answer comes on the stalls' output, and is not taken for one.
	n := len(w.Stalls(least))
	w.Sync()
	if why := w.Unavailable(); why != "" {
		t.Errorf("after Sync the watch is unavailable: %s", why)
	}
	if got := len(w.Stalls(least)); got < n {
		t.Errorf("after Sync %d stalls, before it %d", got, n)
	}
	if !w.During(from, to.Add(time.Second), held-period) {
		t.Errorf("During does not find the hold between %v and %v", from, to)
	}
	if w.During(from.Add(-time.Hour), from.Add(-time.Minute), least) {
		t.Errorf("During finds a stall an hour before the watch began")
	}
	if got := w.Within(from.Add(-time.Hour), from.Add(-time.Minute), least); len(got) != 0 {
		t.Errorf("Within finds %v an hour before the watch began", got)
	}
	w.Close()
	w.Sync() // returns at once on a closed watch
}

// The watcher's first lines can be stalls, before "ready": on a loaded
// machine its threads can report one before its ordinary goroutine writes
// the line. They are kept, and only a line that is none of the three
// stops the start.
func TestReadStart(t *testing.T) {
	for _, c := range []struct {
		out, unavailable, err string
		stalls                int
	}{
		{out: "ready\n"},
		{out: "0 1000 2500\n1 1000 3000\nready\n", stalls: 2},
		{out: "0 1000 2500\nunavailable: cpu 1: real-time priority: operation not permitted\n", stalls: 1, unavailable: "cpu 1: real-time priority: operation not permitted"},
		{out: "0 1000 2500\nPASS\n", err: `the watcher said "PASS"`},
		{out: "", err: `the watcher said ""`},
	} {
		stalls, why, err := readStart(bufio.NewScanner(strings.NewReader(c.out)))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one with %q", c.out, err, c.err)
			}
			continue
		}
		if err != nil || len(stalls) != c.stalls || why != c.unavailable {
			t.Errorf("%q: %d stalls, unavailable %q, error %v; want %d, %q", c.out, len(stalls), why, err, c.stalls, c.unavailable)
		}
	}
	if s, _, _ := readStart(bufio.NewScanner(strings.NewReader("1 1000 2500\nready\n"))); len(s) != 1 || s[0].CPU != 1 || s[0].Len() != 1500*time.Microsecond {
		t.Errorf("the stall before ready read as %v", s)
	}
}
