package limiter

import (
	"testing"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/filtertest/sidecaranswer"
)

// benchHost is panicHost with working shared data, for the per-request
// benchmarks of the logic alone (no wasm, no host-call cost).
type benchHost struct {
	*panicHost
	shared *sharedHost
}

func (h benchHost) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	h.call("GetSharedData")
	// A view, as the wasm binding hands out: the value is good until the
	// callback returns, and the filter must not need more.
	v, ok := h.shared.data[key]
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return v, h.shared.cas[key], abi.StatusOK
}

func (h benchHost) SetSharedData(key string, value []byte, cas uint32) abi.Status {
	h.call("SetSharedData")
	return h.shared.SetSharedData(key, value, cas)
}

// benchLimiter returns a limiter configured with config on a benchHost
// whose request is a GET of client-1.
func benchLimiter(tb testing.TB, config string) (*Limiter, benchHost) {
	h := benchHost{panicHost: newPanicHost(), shared: newSharedHost()}
	h.config = []byte(config)
	l := New(h)
	l.OnContextCreate(1, 0)
	if !l.OnConfigure(1, len(h.config)) {
		tb.Fatal(h.logs)
	}
	h.request = [][2]string{{":method", "GET"}, {":path", "/v1/items"}, {"x-api-key", "client-1"}}
	return l, h
}

// requestLoop runs request once per iteration, each on a new stream
// context, and reports the host calls one request makes as hostcalls/op.
func requestLoop(b *testing.B, h benchHost, request func(id uint32)) {
	b.ReportAllocs()
	calls := 0
	for i := 0; b.Loop(); i++ {
		request(uint32(2 + i))
		calls = len(h.calls)
		h.calls = h.calls[:0]
	}
	b.ReportMetric(float64(calls), "hostcalls/op")
}

// BenchmarkAllowedPath: a request checked with the sidecar and allowed,
// from context creation to deletion. hostcalls/op counts the host calls
// it makes (each one crosses the wasm boundary in Envoy).
func BenchmarkAllowedPath(b *testing.B) {
	l, h := benchLimiter(b, "")
	allowedLoop(b, l, h, allowedAnswer)
}

// BenchmarkAllowedPathAfterOutage: the same once the circuit breaker's
// shared state exists (closed again): each read of it finds the empty
// value of the zero state (encodeBreaker), where before the key was set
// it found nothing.
func BenchmarkAllowedPathAfterOutage(b *testing.B) {
	l, h := benchLimiter(b, "")
	h.SetSharedData(l.roots.get(1).breaker.key, encodeBreaker(breakerState{}), 0)
	allowedLoop(b, l, h, allowedAnswer)
}

// allowedAnswer is the sidecar's own 200, made by its code, as the wasm
// benchmarks of the same request get it (e2e/filterwasm): the same answer on
// both sides, so that filtercost compares one path natively and in wasm.
var allowedAnswer = sidecaranswer.Check("free", 100, 10, 50.5, 1)

// allowedRequest is one allowed request's callbacks, as Envoy makes them.
func allowedRequest(tb testing.TB, l *Limiter, h benchHost, id uint32) {
	l.OnContextCreate(id, 1)
	if l.OnRequestHeaders(id, 3, true) != abi.ActionPause {
		tb.Fatal("no callout")
	}
	l.OnHTTPCallResponse(1, 4, len(h.response), 0, 0)
	l.OnResponseHeaders(id, 1, true)
	l.OnDelete(id)
}

// allowedLoop runs allowed requests whose callouts get answer.
func allowedLoop(b *testing.B, l *Limiter, h benchHost, answer [][2]string) {
	h.response = answer
	requestLoop(b, h, func(id uint32) { allowedRequest(b, l, h, id) })
}

// decidedLoop runs requests the filter decides in proxy_on_request_headers
// without a callout: each must return want, and counter must have counted
// them.
func decidedLoop(b *testing.B, l *Limiter, h benchHost, want abi.Action, counter string) {
	requestLoop(b, h, func(id uint32) {
		l.OnContextCreate(id, 1)
		if got := l.OnRequestHeaders(id, 3, true); got != want {
			b.Fatalf("proxy_on_request_headers returned %v, want %v", got, want)
		}
		l.OnDelete(id)
	})
	if n := h.counter(counter); n == 0 {
		b.Fatalf("no request counted in %s", counter)
	}
}

// TestAllowedPathDoesNotAllocate: once warm, an allowed request allocates
// nothing, with and without the breaker's shared state, so that the garbage
// collector never runs during traffic (in wasm each allocation costs
// microseconds, GC assists included). The host calls are not the filter's:
// this host makes none of its own.
func TestAllowedPathDoesNotAllocate(t *testing.T) {
	for _, outage := range []bool{false, true} {
		l, h := benchLimiter(t, `{"region": "eu-west-1", "costs": [{"method": "POST", "cost": 3}]}`)
		if outage {
			h.SetSharedData(l.roots.get(1).breaker.key, encodeBreaker(breakerState{}), 0)
		}
		h.request = [][2]string{{":method", "POST"}, {":path", "/v1/items"}, {"x-api-key", "client-1"}}
		h.response = allowedAnswer
		id := uint32(2)
		allowedRequest(t, l, h, id) // warm: the stream, the scratch buffers
		allocs := testing.AllocsPerRun(200, func() {
			id++
			allowedRequest(t, l, h, id)
			h.calls = h.calls[:0]
		})
		if allocs != 0 {
			t.Errorf("outage state %v: %.1f allocations per allowed request, want 0", outage, allocs)
		}
	}
}

// BenchmarkBreakerOpenPath: a request that fails open at once because the
// circuit breaker is open.
func BenchmarkBreakerOpenPath(b *testing.B) {
	l, h := benchLimiter(b, "")
	open := breakerState{phase: phaseOpen, interval: maxBreakerInterval, until: anchor + maxBreakerInterval, since: anchor}
	h.SetSharedData(l.roots.get(1).breaker.key, encodeBreaker(open), 0)
	decidedLoop(b, l, h, abi.ActionContinue, MetricFailedOpenPrefix+"circuit_open")
}

// BenchmarkCachedDenyPath: a request of a client the deny cache holds,
// answered 429 without a callout.
func BenchmarkCachedDenyPath(b *testing.B) {
	l, h := benchLimiter(b, "")
	e, _ := newDenyEntry("client-1", 1, anchor, anchor, deniedAnswer(100, 0, 1.0/3600))
	l.roots.get(1).cache.store(h, e, anchor)
	decidedLoop(b, l, h, abi.ActionPause, MetricDeniedCached)
}
