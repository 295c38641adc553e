package e2e_test

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/internal/vcpustall"
)

// The design lets at most 1% of the requests fail open, and the tests hold
// the product to it. On this machine a second cause makes requests miss
// the 5 ms: the hypervisor runs other tenants on its two vCPUs, stalling
// one for up to tens of ms at a time, and whatever part of a request's path
// was on it waits with it. /proc/stat counts that time as steal. The
// evidence, and the runs it decided, are in RATIONALE.md ("Why do the tests
// allow for the host's steal?").
//
// How many requests the host's stalls can put at risk:
//
//   - Undisturbed, a burst's callouts leave most of their 5 ms: p90 1.8–2.5
//     ms on a quiet host, through one gateway or three. A stall of 2.5 ms
//     or less delays such a request without breaking its budget. The
//     design's 1% is for the product's own slowest.
//   - A longer stall, of length l, puts at risk the requests that arrive
//     during it or in the 5 ms before it: l + 5 ms of arrivals, less than 3
//     times the stall's own length.
//   - The hypervisor took steal × 2 × W of the two vCPUs' time over a run of
//     W, so at most 2 × 3 × steal of the run's arrivals were at risk.
//
// The failures measured stayed near a tenth of that.
const stallShare = 2 * 3

// hostMeter measures what the hypervisor took from this machine from its
// start.
type hostMeter struct{ start report.CPUTime }

func watchHost() hostMeter { return hostMeter{report.ReadCPUTime()} }

// steal is the share of the machine's CPU time the hypervisor took since
// the meter started; 0 where /proc/stat cannot say.
func (h hostMeter) steal() float64 {
	if s := report.ReadCPUTime().StealSince(h.start); s != nil {
		return *s
	}
	return 0
}

// failOpenBudget is how many of sent requests may fail open in the run
// the meter watched: the design's 1%, plus the requests the host's stalls
// can account for (stallShare × steal).
func (h hostMeter) failOpenBudget(sent int64) failOpenBound {
	steal := h.steal()
	b := failOpenBound{
		design: int64(0.01 * float64(sent)),
		host:   int64(math.Ceil(stallShare * steal * float64(sent))),
	}
	b.why = fmt.Sprintf("1%% of %d is %d; the hypervisor took %.2f%% of the CPU time (steal), which can account for %d more", sent, b.design, 100*steal, b.host)
	return b
}

// Where the hypervisor does not report steal, /proc/stat reads 0% while
// the vCPUs stand still. A test that knows when each of its failed-open
// requests waited can instead ask a watch of the vCPUs (package
// vcpustall) whether one stood still during that wait, for long enough to
// break the request's budget: past the 2.5 ms a burst's callout has left
// at p90, as above. Only such requests are the host's; a product that
// made its callouts slow would fail open outside the stalls too, and
// those still count against the design's 1% (vcpustall.BreaksACallout).

// watchVCPUs starts a watch of this machine's vCPUs, stopped when t ends.
func watchVCPUs(t *testing.T) *vcpustall.Watch {
	t.Helper()
	w, err := vcpustall.Start()
	if err != nil {
		t.Fatalf("watching the vCPUs: %v", err)
	}
	t.Cleanup(w.Close)
	return w
}

// stallBudget is how many of sent requests may fail open: the design's
// 1%, plus those of the failed-open requests (the 200s without the
// limiter's decision, timed in undecided) during whose wait the watch w
// saw a vCPU stand still for vcpustall.BreaksACallout or more. Where w
// could not watch, it is h's steal budget. Call it once w is closed, or
// after w.Sync where the watch goes on, so that it has every stall of the
// run.
func stallBudget(w *vcpustall.Watch, h hostMeter, sent int64, undecided load.Spans) failOpenBound {
	if why := w.Unavailable(); why != "" {
		b := h.failOpenBudget(sent)
		b.why += "; no watch of the vCPUs: " + why
		return b
	}
	b := failOpenBound{design: int64(0.01 * float64(sent)), host: undecided.During(w.Broke)}
	stalls := report.StallsOf(w)
	b.why = fmt.Sprintf("1%% of %d is %d; %d of the %d requests let through undecided waited while a vCPU stood still for %v or more (%d such stalls in the run, the longest %v; steal %.2f%%)",
		sent, b.design, b.host, len(undecided), vcpustall.BreaksACallout, stalls.Count, stalls.Longest.Round(100*time.Microsecond), 100*h.steal())
	return b
}

// undecidedLog times the requests of a test's load that came back 200
// without the limiter's decision, from any goroutine.
type undecidedLog struct {
	mu    sync.Mutex
	spans load.Spans
}

// add records a request sent at sent and answered now.
func (l *undecidedLog) add(sent time.Time) {
	span := load.Span{Sent: sent, Answered: time.Now()}
	l.mu.Lock()
	l.spans = append(l.spans, span)
	l.mu.Unlock()
}

func (l *undecidedLog) all() load.Spans {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spans
}

// failOpenBound is the requests of a run that may fail open, and why, for
// the test's log.
type failOpenBound struct {
	design, host int64
	why          string
}

func (b failOpenBound) total() int64 { return b.design + b.host }

// excused is how many of failedOpen requests went past the design's 1%
// within the host's share. Each was admitted unlimited, so a test of the
// admissions does not hold them against the limiter.
func (b failOpenBound) excused(failedOpen int64) int64 {
	return min(max(failedOpen-b.design, 0), b.host)
}
