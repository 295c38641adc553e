package limiter

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/abi"
)

// panicHost is an abi.Host that answers every call plainly and panics in the
// call named panicOn, to check the filter's recovery at the ABI boundary.
type panicHost struct {
	panicOn   string
	calls     []string
	logs      []string
	request   [][2]string
	response  [][2]string
	config    []byte
	effective uint32
	counters  map[uint32]int64
	names     []string
	noMetrics bool
	// replaced holds the request headers replaced, in order, once made
	// non-nil: the benchmarks leave it nil, so that it does not grow.
	replaced [][2]string
}

func newPanicHost() *panicHost {
	return &panicHost{counters: map[uint32]int64{}}
}

func (h *panicHost) call(name string) {
	h.calls = append(h.calls, name)
	if name == h.panicOn {
		var m map[string]int
		m["boom"]++ // a runtime error, as a real bug would raise
	}
}

func (h *panicHost) Log(level abi.LogLevel, msg string) abi.Status {
	h.logs = append(h.logs, msg)
	return abi.StatusOK
}

func (h *panicHost) GetBuffer(t abi.BufferType, start, max int) ([]byte, abi.Status) {
	h.call("GetBuffer")
	return h.config, abi.StatusOK
}

func (h *panicHost) GetHeader(m abi.MapType, key string) (string, abi.Status) {
	h.call("GetHeader")
	for _, p := range h.request {
		if p[0] == key {
			return p[1], abi.StatusOK
		}
	}
	return "", abi.StatusNotFound
}

func (h *panicHost) GetHeaders(m abi.MapType, dst [][2]string) ([][2]string, abi.Status) {
	h.call("GetHeaders")
	return append(dst, h.response...), abi.StatusOK
}

func (h *panicHost) AddHeader(m abi.MapType, key, value string) abi.Status {
	h.call("AddHeader")
	return abi.StatusOK
}

func (h *panicHost) ReplaceHeader(m abi.MapType, key, value string) abi.Status {
	h.call("ReplaceHeader")
	if m == abi.MapRequestHeaders && h.replaced != nil {
		h.replaced = append(h.replaced, [2]string{key, value})
	}
	return abi.StatusOK
}

func (h *panicHost) RemoveHeader(m abi.MapType, key string) abi.Status {
	h.call("RemoveHeader")
	return abi.StatusOK
}

func (h *panicHost) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) abi.Status {
	h.call("SendLocalResponse")
	return abi.StatusOK
}

func (h *panicHost) HTTPCall(cluster string, headers []byte, body []byte, trailers [][2]string, timeoutMs uint32) (uint32, abi.Status) {
	h.call("HTTPCall")
	return 4, abi.StatusOK
}

func (h *panicHost) ContinueStream(t abi.StreamType) abi.Status {
	h.call("ContinueStream")
	return abi.StatusOK
}

func (h *panicHost) SetEffectiveContext(id uint32) abi.Status {
	h.call("SetEffectiveContext")
	h.effective = id
	return abi.StatusOK
}

func (h *panicHost) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	h.call("GetSharedData")
	return nil, 0, abi.StatusNotFound
}

func (h *panicHost) SetSharedData(key string, value []byte, cas uint32) abi.Status {
	h.call("SetSharedData")
	return abi.StatusOK
}

func (h *panicHost) DefineMetric(t abi.MetricType, name string) (uint32, abi.Status) {
	h.call("DefineMetric")
	if h.noMetrics {
		return 0, abi.StatusUnimplemented
	}
	h.names = append(h.names, name)
	return uint32(len(h.names)), abi.StatusOK
}

func (h *panicHost) IncrementMetric(id uint32, delta int64) abi.Status {
	h.call("IncrementMetric")
	h.counters[id] += delta
	return abi.StatusOK
}

func (h *panicHost) RecordMetric(id uint32, value uint64) abi.Status {
	h.call("RecordMetric")
	return abi.StatusOK
}

func (h *panicHost) SetTickPeriod(ms uint32) abi.Status {
	h.call("SetTickPeriod")
	return abi.StatusOK
}

func (h *panicHost) Now() int64 {
	h.call("Now")
	return anchor
}

func (h *panicHost) counter(name string) int64 {
	i := slices.Index(h.names, name)
	if i < 0 {
		return -1
	}
	return h.counters[uint32(i+1)]
}

// started returns a limiter with root context 1 configured and stream 2.
func started(t *testing.T, h *panicHost) *Limiter {
	t.Helper()
	l := New(h)
	l.OnContextCreate(1, 0)
	if !l.OnVMStart(1, 0) || !l.OnConfigure(1, len(h.config)) {
		t.Fatalf("start failed: %q", h.logs)
	}
	l.OnContextCreate(2, 1)
	h.request = [][2]string{{":method", "GET"}, {":path", "/"}, {"x-api-key", "k"}}
	return l
}

// awaitingAnswer is started's stream paused for its callout, whose answer
// (an allowed one) h holds for OnHTTPCallResponse.
func awaitingAnswer(t *testing.T, h *panicHost) *Limiter {
	t.Helper()
	l := started(t, h)
	if act := l.OnRequestHeaders(2, 3, true); act != abi.ActionPause {
		t.Fatalf("action %d, want pause for the callout", act)
	}
	h.response = [][2]string{{":status", "200"}, {"ratelimit-limit", "1"}, {"ratelimit-remaining", "0"}, {"ratelimit-reset", "1"}}
	return l
}

func hasLine(logs []string, prefix string) bool {
	return slices.ContainsFunc(logs, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

func TestRequestPanicFailsOpen(t *testing.T) {
	for _, call := range []string{"GetHeader", "GetSharedData", "HTTPCall", "RemoveHeader"} {
		h := newPanicHost()
		l := started(t, h)
		h.panicOn = call
		if act := l.OnRequestHeaders(2, 3, true); act != abi.ActionContinue {
			t.Errorf("panic in %s: action %d, want continue", call, act)
		}
		if !hasLine(h.logs, "edgelimit: internal error in proxy_on_request_headers: assignment to entry in nil map; failing open") {
			t.Errorf("panic in %s: logs %q", call, h.logs)
		}
		if n := h.counter(MetricFailedOpenPrefix + "internal"); n != 1 {
			t.Errorf("panic in %s: failed_open.internal = %d", call, n)
		}
	}
}

func TestCalloutPanicResumesTheRequest(t *testing.T) {
	h := newPanicHost()
	l := awaitingAnswer(t, h)
	h.panicOn = "GetHeaders"
	h.calls = nil
	l.OnHTTPCallResponse(1, 4, 4, 0, 0)
	if h.effective != 2 || !slices.Contains(h.calls, "ContinueStream") {
		t.Errorf("after a panic the stream was not resumed: effective %d, calls %q", h.effective, h.calls)
	}
	if !hasLine(h.logs, "edgelimit: internal error in proxy_on_http_call_response: ") {
		t.Errorf("logs %q", h.logs)
	}
	if n := h.counter(MetricFailedOpenPrefix + "internal"); n != 1 {
		t.Errorf("failed_open.internal = %d", n)
	}
	// The token is spent: a second delivery does nothing.
	h.calls = nil
	l.OnHTTPCallResponse(1, 4, 4, 0, 0)
	if len(h.calls) != 0 {
		t.Errorf("a spent token reached the host: %q", h.calls)
	}
}

// TestPanicTellsTheServiceUnknown: a request whose callback panicked goes
// on as failed open, and the service is told "unknown" where the request
// was not enforced, as for any request failed open. A panic before the key
// was read leaves it unknown whether a canary client's request is
// enforced, so that one is told too; one in the callout's answer is not.
func TestPanicTellsTheServiceUnknown(t *testing.T) {
	for _, tc := range []struct {
		name, config     string
		request, callout bool // whether the service is told "unknown"
	}{
		{"enforce", `{"mode": "enforce"}`, false, false},
		{"shadow", `{"mode": "shadow"}`, true, true},
		{"outside the canary", `{"mode": "enforce", "canary_clients": ["other"]}`, true, true},
		{"in the canary", `{"mode": "enforce", "canary_clients": ["k"]}`, true, false},
		{"off", `{"mode": "off"}`, false, false},
	} {
		for _, where := range []string{"request", "callout"} {
			want := map[string]bool{"request": tc.request, "callout": tc.callout}[where]
			h := newPanicHost()
			h.config = []byte(tc.config)
			h.replaced = [][2]string{}
			l := started(t, h)
			if where == "request" {
				h.panicOn = "GetHeader"
				l.OnRequestHeaders(2, 3, true)
			} else {
				if tc.name == "off" {
					continue // no callout
				}
				if act := l.OnRequestHeaders(2, 3, true); act != abi.ActionPause {
					t.Fatalf("%s: action %d, want pause for the callout", tc.name, act)
				}
				h.response = [][2]string{{":status", "200"}}
				h.panicOn = "GetHeaders"
				h.replaced = h.replaced[:0]
				l.OnHTTPCallResponse(1, 4, 1, 0, 0)
			}
			told := slices.Contains(h.replaced, [2]string{ShadowHeader, "unknown"})
			if told != want {
				t.Errorf("%s, panic in the %s: %s: unknown set %v, want %v (request headers replaced: %q)", tc.name, where, ShadowHeader, told, want, h.replaced)
			}
			if n := h.counter(MetricFailedOpenPrefix + "internal"); tc.name != "off" && n != 1 {
				t.Errorf("%s, panic in the %s: failed_open.internal = %d, want 1", tc.name, where, n)
			}
		}
	}
}

// A panic while the response's rate-limit headers are set is recovered
// and logged, and the response goes on.
func TestResponseHeadersPanicIsRecovered(t *testing.T) {
	h := newPanicHost()
	l := awaitingAnswer(t, h)
	l.OnHTTPCallResponse(1, 4, 4, 0, 0)
	h.panicOn = "AddHeader"
	if act := l.OnResponseHeaders(2, 1, true); act != abi.ActionContinue {
		t.Errorf("action %d, want continue", act)
	}
	if !hasLine(h.logs, "edgelimit: internal error in proxy_on_response_headers: assignment to entry in nil map; failing open") {
		t.Errorf("logs %q", h.logs)
	}
}

func TestConfigurePanicRejects(t *testing.T) {
	h := newPanicHost()
	l := New(h)
	l.OnContextCreate(1, 0)
	h.panicOn = "GetBuffer"
	if l.OnConfigure(1, 10) {
		t.Error("configured despite a panic")
	}
	if !hasLine(h.logs, "edgelimit: internal error in proxy_on_configure: ") {
		t.Errorf("logs %q", h.logs)
	}
}

func TestOtherCallbacksRecover(t *testing.T) {
	h := newPanicHost()
	l := started(t, h)
	l.OnRequestHeaders(2, 3, true)
	h.response = [][2]string{{":status", "200"}, {"ratelimit-limit", "1"}, {"ratelimit-remaining", "0"}, {"ratelimit-reset", "1"}}
	l.OnHTTPCallResponse(1, 4, 4, 0, 0)
	h.panicOn = "ReplaceHeader"
	if act := l.OnResponseHeaders(2, 1, true); act != abi.ActionContinue {
		t.Errorf("response headers after a panic: %d", act)
	}
	h.panicOn = "Now"
	l.OnTick(1)
	for _, where := range []string{"proxy_on_response_headers", "proxy_on_tick"} {
		if !hasLine(h.logs, "edgelimit: internal error in "+where+": ") {
			t.Errorf("no line for %s in %q", where, h.logs)
		}
	}
}

func TestUnknownContexts(t *testing.T) {
	h := newPanicHost()
	l := started(t, h)
	h.calls = nil
	if act := l.OnRequestHeaders(99, 0, true); act != abi.ActionContinue {
		t.Errorf("unknown stream: %d", act)
	}
	l.OnHTTPCallResponse(1, 1234, 1, 0, 0)
	l.OnHTTPCallResponse(77, 4, 1, 0, 0)
	l.OnResponseHeaders(99, 0, true)
	l.OnDelete(99)
	l.OnContextCreate(5, 42) // a stream of a root that does not exist
	if act := l.OnRequestHeaders(5, 0, true); act != abi.ActionContinue {
		t.Errorf("stream of an unknown root: %d", act)
	}
	if len(h.calls) != 0 {
		t.Errorf("unknown contexts reached the host: %q", h.calls)
	}
}

func TestMetricsUndefined(t *testing.T) {
	h := newPanicHost()
	h.noMetrics = true
	l := started(t, h)
	if !hasLine(h.logs, "edgelimit: metric not defined: edgelimit.requests.allowed: UNIMPLEMENTED") {
		t.Errorf("logs %q", h.logs)
	}
	h.calls = nil
	h.request = nil
	l.OnRequestHeaders(2, 0, true) // missing key: counted, were metrics defined
	if slices.Contains(h.calls, "IncrementMetric") {
		t.Error("incremented a metric the host refused to define")
	}
}

func TestMetricNames(t *testing.T) {
	want := []string{
		"edgelimit.requests.allowed", "edgelimit.requests.denied", "edgelimit.requests.denied_cached",
		"edgelimit.requests.shadow_allowed", "edgelimit.requests.shadow_would_deny",
		"edgelimit.requests.missing_key", "edgelimit.requests.invalid_key", "edgelimit.requests.unknown_key",
		"edgelimit.requests.unchecked", "edgelimit.requests.preflight",
		"edgelimit.requests.failed_open.timeout", "edgelimit.requests.failed_open.unavailable",
		"edgelimit.requests.failed_open.reset", "edgelimit.requests.failed_open.dispatch",
		"edgelimit.requests.failed_open.status", "edgelimit.requests.failed_open.malformed",
		"edgelimit.requests.failed_open.internal", "edgelimit.requests.failed_open.circuit_open",
		"edgelimit.breaker.opened", "edgelimit.breaker.reopened", "edgelimit.breaker.closed",
		"edgelimit.requests.local_allowed", "edgelimit.requests.local_denied",
		"edgelimit.callout.failed_cached", "edgelimit.deny_cache.evicted", "edgelimit.local_bucket.evicted",
		"edgelimit.callout.latency_us", "edgelimit.breaker.state",
	}
	if got := MetricNames(); !slices.Equal(got, want) {
		t.Errorf("MetricNames() = %q", got)
	}
	h := newPanicHost()
	started(t, h)
	if !slices.Equal(h.names, want) {
		t.Errorf("defined %q", h.names)
	}
}
