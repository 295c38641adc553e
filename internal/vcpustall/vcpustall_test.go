package vcpustall

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

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
	from := time.Now()
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
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
	testkit.PollErr(t, 5*time.Second, "every CPU's report of the hold", func() error {
		seen := map[int]bool{}
		for _, s := range w.Stalls(held - period) {
			if s.To.After(from) {
				seen[s.CPU] = true
			}
		}
		if len(seen) < set.Count() {
			return fmt.Errorf("%d of %d CPUs reported it; stalls: %v", len(seen), set.Count(), w.Stalls(least))
		}
		return nil
	})
	if !w.During(from, to.Add(time.Second), held-period) {
		t.Errorf("During does not find the hold between %v and %v", from, to)
	}
	if w.During(from.Add(-time.Hour), from.Add(-time.Minute), least) {
		t.Errorf("During finds a stall an hour before the watch began")
	}
}
