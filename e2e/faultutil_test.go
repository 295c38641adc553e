package e2e_test

import (
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// Helpers shared by the fault, security and hammer tests.

// tinyPlans gives every client a bucket of 2 that practically never
// refills (one token per 1000 s), so "limited" is 200, 200, 429.
const tinyPlans = "default_plan: tiny\nplans:\n  tiny: {capacity: 2, rate: 0.001}\n"

// on returns a copy of the stack whose failures are reported to t (a
// subtest): a test may only fail from its own goroutine.
func (s *stack) on(t *testing.T) *stack {
	c := *s
	c.t = t
	return &c
}

// timedDo is do that fails the test when the request takes longer than
// hangBound (2 s): far above any timeout in play, so it only catches a
// request left waiting on a broken sidecar or Redis.
func (s *stack) timedDo(g int, method, path string, headers ...string) reply {
	s.t.Helper()
	start := time.Now()
	r := s.do(g, method, path, headers...)
	if d := time.Since(start); d > hangBound {
		s.t.Fatalf("%s %s took %v: more than the hang bound %v", method, path, d, hangBound)
	}
	return r
}

// decisions returns the filter's edgelimit.requests.* counters summed over
// every gateway, by the name after "edgelimit.requests." (allowed,
// failed_open.timeout, ...). Reasons the test does not know of are included.
func (s *stack) decisions() counts {
	s.t.Helper()
	return decisionsIn(s.gatewayStats())
}

// decisionsIn is decisions from stats already read (s.gatewayStats).
func decisionsIn(stats []map[string]int64) counts {
	out := counts{}
	for _, st := range stats {
		for name, v := range st {
			if n, ok := strings.CutPrefix(name, counter("")); ok {
				out[n] += v
			}
		}
	}
	return out
}

// vmFailures is how many worker VMs of every gateway have failed.
func (s *stack) vmFailures() int64 {
	s.t.Helper()
	var n int64
	for _, g := range s.gateways {
		f, err := g.VMFailures()
		if err != nil {
			s.t.Fatal(err)
		}
		n += f
	}
	return n
}

// counts are counter values by name.
type counts map[string]int64

// minus returns c - before, keeping only the names that changed.
func (c counts) minus(before counts) counts {
	out := counts{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// failedOpen sums the failed_open.* counters.
func (c counts) failedOpen() int64 {
	var n int64
	for k, v := range c {
		if strings.HasPrefix(k, "failed_open.") {
			n += v
		}
	}
	return n
}

// total sums every counter: each request the filter decides is counted in
// exactly one.
func (c counts) total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

func (c counts) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.FormatInt(c[k], 10)
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// breakerOpen is the fail-open reason of requests the filter's circuit
// breaker lets through without a callout while the sidecar is failing. A
// fault that makes callouts fail may show its own reason for the first
// requests and this one for the rest.
const breakerOpen = "failed_open.circuit_open"

// expectFailedOpen checks that the n requests of a fault all failed open
// and that each was counted under one of the reasons given (or the
// breaker's), with at least one under the fault's own reasons.
func expectFailedOpen(t *testing.T, d counts, n int64, reasons ...string) {
	t.Helper()
	allowed := map[string]bool{breakerOpen: true}
	var own int64
	for _, r := range reasons {
		allowed["failed_open."+r] = true
		own += d["failed_open."+r]
	}
	if got := d.total(); got != n {
		t.Errorf("the gateways counted %d decisions %v, want %d", got, d, n)
	}
	for k := range d {
		if !allowed[k] {
			t.Errorf("counter %s rose (%v); want only failed_open.%v", k, d, reasons)
		}
	}
	if own == 0 {
		t.Errorf("no request counted as failed_open.%v: %v", reasons, d)
	}
}

// expectLimited checks that limiting works: a fresh client of the tiny
// plan is admitted twice and then denied. Right after a fault, requests
// may still fail open (reconnecting, or the breaker waiting to probe), so
// it retries with a new client until one sees exactly that, within 30 s.
func (s *stack) expectLimited(g int, client string) {
	s.t.Helper()
	try := 0
	testkit.Poll(s.t, 30*time.Second, "limiting works ("+client+")", func() bool {
		try++
		c := client + "-" + strconv.Itoa(try)
		for _, want := range []int{200, 200, 429} {
			r := s.timedDo(g, "GET", "/orders/1", "x-api-key", c)
			if r.status != want {
				return false
			}
			if want == 200 && r.header.Get("ratelimit-limit") != "2" {
				return false // failed open: no decision, no headers
			}
		}
		return true
	})
}

// sidecarMetrics reads sidecar i's /metrics.
func (s *stack) sidecarMetrics(i int) testkit.Metrics {
	s.t.Helper()
	m, err := testkit.GetMetrics("http://" + s.scAddrs[i] + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	return m
}

// sidecarMetric reads one sample of the sidecar's /metrics by its full
// name with labels, e.g. `sidecar_decisions_total{result="allowed"}`.
func (s *stack) sidecarMetric(i int, name string) float64 {
	s.t.Helper()
	v, ok := s.sidecarMetrics(i)[name]
	if !ok {
		s.t.Fatalf("sidecar /metrics has no %s", name)
	}
	return v
}

// get fetches url and returns its body.
func get(t *testing.T, url string) string {
	t.Helper()
	_, body := testkit.Get(t, url)
	return body
}
