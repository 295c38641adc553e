package limiter

import (
	"testing"

	"github.com/edgelimit/edgelimit/filter/abi"
)

// benchHost is panicHost with working shared data, for the per-request
// benchmarks of the logic alone (no wasm, no host-call cost).
type benchHost struct {
	*panicHost
	shared *sharedHost
}

func (h benchHost) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	return h.shared.GetSharedData(key)
}

func (h benchHost) SetSharedData(key string, value []byte, cas uint32) abi.Status {
	return h.shared.SetSharedData(key, value, cas)
}

func benchLimiter(b *testing.B) (*Limiter, benchHost) {
	h := benchHost{panicHost: newPanicHost(), shared: newSharedHost()}
	l := New(h)
	l.OnContextCreate(1, 0)
	if !l.OnConfigure(1, 0) {
		b.Fatal(h.logs)
	}
	h.request = [][2]string{{":method", "GET"}, {":path", "/v1/items"}, {"x-api-key", "client-1"}}
	return l, h
}

// BenchmarkAllowedPath: a request checked with the sidecar and allowed,
// from context creation to deletion.
func BenchmarkAllowedPath(b *testing.B) {
	l, h := benchLimiter(b)
	h.response = [][2]string{{":status", "200"}, {"ratelimit-limit", "100"}, {"ratelimit-remaining", "42"},
		{"ratelimit-reset", "7"}, {"x-ratelimit-tokens", "42.5"}, {"x-ratelimit-plan", "gold"}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := uint32(2 + i)
		l.OnContextCreate(id, 1)
		if l.OnRequestHeaders(id, 3, true) != abi.ActionPause {
			b.Fatal("no callout")
		}
		l.OnHTTPCallResponse(1, 4, len(h.response), 0, 0)
		l.OnResponseHeaders(id, 1, true)
		l.OnDelete(id)
		h.calls = h.calls[:0]
	}
}

// BenchmarkCachedDenyPath: a request of a client the deny cache holds,
// answered 429 without a callout.
func BenchmarkCachedDenyPath(b *testing.B) {
	l, h := benchLimiter(b)
	e, _ := newDenyEntry("client-1", 1, anchor, deniedAnswer(100, 0, 3600e3))
	l.roots[1].cache.store(h, e, anchor)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := uint32(2 + i)
		l.OnContextCreate(id, 1)
		if l.OnRequestHeaders(id, 3, true) != abi.ActionPause {
			b.Fatal("not denied")
		}
		l.OnDelete(id)
		h.calls = h.calls[:0]
	}
	if n := h.counter(MetricDeniedCached); n == 0 {
		b.Fatal("no cached denial counted")
	}
}
