package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// filterWasm returns build/filter.wasm from EDGELIMIT_BIN_DIR (as `make
// test` leaves it), else builds the binaries into a temporary folder.
func filterWasm(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("EDGELIMIT_BIN_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	bins, err := harness.Locate(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return bins.Filter
}

// The filter's wasm memory stops growing once it has warmed up: after the
// first 120,000 requests, the next 30,000 (every path through the filter,
// in the scenarios' mix, with an outage that opens the circuit breaker
// every 5,000) add nothing to its linear memory. Under the race
// detector, which slows the host's side of each request several times, the
// next 10,000. The warm-up is past where this module's memory was measured
// to reach its plateau (`go run ./e2e/bench/memory filter -requests 400000
// -every 10000 -gogc 10`: 3.75 MiB up to 10,000 requests, 4.5 MiB from
// 20,000, 5 MiB from 100,000 on, unchanged through 400,000; with outages
// of 12 requests, before the breaker's default went from 5 failures to 20,
// 5 MiB from 70,000): the filter keeps what it reuses (streams,
// scratch buffers sized by the largest message seen) and the heap settles
// at their high-water mark. How soon depends on how little the module
// allocates on the paths that may (the failures, new clients): it reached
// the same 5 MiB by 30,000 requests while its circuit breaker still
// allocated a value at every close, and by 40,000 before its hot callbacks
// stopped calling recover and its callout's clock was formatted without
// strconv.
//
// The bound is zero growth, and it is not a tolerance for noise: the run is
// deterministic (one VM, the host's manual clock is the module's only
// clock), so the same module grows its memory at the same requests every
// time. Linear memory never shrinks and grows only when the Go heap inside
// the module needs room, so it follows the live heap; GOGC=10 keeps the
// heap within 10% of the live data (the default, 100, lets it double), so
// memory left behind by requests shows as soon as it adds a tenth to the
// few MiB the filter keeps live: under 20 bytes per request over these
// 30,000 (50 bytes over 10,000). With the default GOGC, `go run ./e2e/bench/memory filter` runs a
// million requests.
func TestFilterMemoryFlat(t *testing.T) {
	const warmUp = 120000
	requests := warmUp + 30000
	if testkit.Race {
		requests = warmUp + 10000
	}
	res, err := soakFilter(context.Background(), filterWasm(t), requests, warmUp, "10")
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != nil {
		t.Fatalf("the VM failed: %v", res.Failed)
	}
	for k, n := range res.Outcomes {
		t.Logf("%-28s %d", k, n)
	}
	if res.Pending != 0 {
		t.Errorf("%d callouts still pending after every request ended", res.Pending)
	}
	for _, s := range res.Samples {
		t.Logf("after %6d requests: %d KiB", s.Requests, s.Bytes>>10)
	}
	warm := res.Samples[0]
	if warm.Requests != warmUp {
		t.Fatalf("first sample after %d requests, want %d", warm.Requests, warmUp)
	}
	for _, s := range res.Samples[1:] {
		if s.Bytes > warm.Bytes {
			t.Errorf("linear memory grew from %d KiB after %d requests to %d KiB after %d",
				warm.Bytes>>10, warm.Requests, s.Bytes>>10, s.Requests)
		}
	}
	// Every scenario ran and ended as it may: while the circuit breaker is
	// open after an outage, requests that would have been checked are
	// forwarded without a check.
	may := map[string][]string{
		"allow": {"forwarded"}, "deny": {"429", "forwarded"}, "cached": {"429", "forwarded"},
		"unavailable": {"forwarded"}, "malformed": {"forwarded"}, "reset": {"forwarded"}, "status": {"forwarded"},
		"timeout": {"forwarded"}, "gone": {"gone", "forwarded"}, "gone-timeout": {"gone", "forwarded"},
		"missing-key": {"401"}, "invalid-key": {"401"}, "outage": {"forwarded"},
	}
	for k, n := range res.Outcomes {
		scenario, got, _ := strings.Cut(k, " → ")
		if !slices.Contains(may[scenario], got) {
			t.Errorf("%d requests of scenario %s ended %s, want one of %v", n, scenario, got, may[scenario])
		}
	}
	for _, k := range []string{"allow → forwarded", "deny → 429", "cached → 429", "gone → gone", "gone-timeout → gone",
		"timeout → forwarded", "missing-key → 401", "invalid-key → 401", "outage → forwarded"} {
		if res.Outcomes[k] == 0 {
			t.Errorf("no request ended %q", k)
		}
	}
	t.Logf("filter counters: %v", res.Counters)
	if res.Counters["failed_open.circuit_open"] == 0 {
		t.Errorf("the circuit breaker never opened: %v", res.Counters)
	}
}
