package filtertest

import (
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// The cases of warm_connections: each root context's first tick, which
// comes at once after configuration, and every tick after make that many
// calls to the sidecar's /healthz at once, so that the proxy opens its
// connections to the sidecar before the traffic needs them. Their answers
// are nobody's decision.

// warmCalls requires want warm-up calls pending on h, each to cluster with
// :authority authority.
func warmCalls(t *testing.T, h Host, want int, cluster, authority string) {
	t.Helper()
	calls := h.RootCallouts()
	if len(calls) != want {
		t.Fatalf("%d calls from the root context, want %d", len(calls), want)
	}
	wantHeaders := []Header{{":method", "GET"}, {":path", "/healthz"}, {":authority", authority}}
	for _, c := range calls {
		if c.Cluster != cluster || !slices.Equal(c.Headers, wantHeaders) || len(c.Body) != 0 || c.TimeoutMs != 1000 {
			t.Fatalf("warm-up call %+v, want GET /healthz to %s with :authority %s, no body, timeout 1000 ms", c, cluster, authority)
		}
	}
}

func (r runner) warmConnections(t *testing.T) {
	h := r.host(t, "")
	if n := len(h.RootCallouts()); n != 0 {
		t.Fatalf("%d calls before the first tick, want none", n)
	}
	if got := h.TickPeriod(); got != time.Millisecond {
		t.Errorf("tick period after configuration %v, want 1ms: the warm-up goes out at once", got)
	}
	h.Tick()
	if got := h.TickPeriod(); got != 10*time.Second {
		t.Errorf("tick period after the first tick %v, want 10s", got)
	}
	warmCalls(t, h, limiter.DefaultWarmConnections, "ratelimit_sidecar", "ratelimit-sidecar")

	// Answers that would each be a failure for a check (a timeout, a
	// reset): none fails a request open, counts, or opens the breaker
	// (5 failures by default).
	h.RespondRootCallouts(timeoutAnswer)
	h.Tick()
	warmCalls(t, h, limiter.DefaultWarmConnections, "ratelimit_sidecar", "ratelimit-sidecar")
	h.RespondRootCallouts(nil)
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(allowAnswer(10, 9, 1, "basic"), nil)
	wentOn(t, s)
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricAllowed: 1})
	if n := metric(t, h, limiter.MetricBreakerOpened); n != 0 {
		t.Errorf("breaker opened %d times, want 0", n)
	}
	if n := metric(t, h, limiter.MetricCalloutLatency); n != 1 {
		t.Errorf("callout latency samples %d, want 1: the check's alone", n)
	}

	// A call the proxy refuses ends the round; the next tick tries again.
	h.RespondRootCallouts([]Header{{":status", "200"}})
	h.FailNextDispatch()
	h.Tick()
	warmCalls(t, h, 0, "", "")
	h.Tick()
	warmCalls(t, h, limiter.DefaultWarmConnections, "ratelimit_sidecar", "ratelimit-sidecar")
	h.RespondRootCallouts([]Header{{":status", "200"}})

	// The configured number, to the configured cluster and authority.
	full := r.host(t, ValidConfig("full.json"))
	full.Tick()
	warmCalls(t, full, 4, "edge_ratelimit", "ratelimit.internal:8080")
	full.RespondRootCallouts([]Header{{":status", "200"}})
}

// warmConnectionsNone: no warm-up with warm_connections 0, nor in mode off,
// which makes no callout at all; the ticks still come every 10 s.
func (r runner) warmConnectionsNone(t *testing.T) {
	for _, config := range []string{"warm-connections-off.json", "off.json"} {
		h := r.host(t, ValidConfig(config))
		h.Tick()
		h.Tick()
		if n := len(h.RootCallouts()); n != 0 {
			t.Errorf("%s: %d warm-up calls, want none", config, n)
		}
		if got := h.TickPeriod(); got != 10*time.Second {
			t.Errorf("%s: tick period %v, want 10s", config, got)
		}
	}
}
