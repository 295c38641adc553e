package native

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/filtertest"
)

// TestBehaviour runs the filter's whole table of behaviour against the
// limiter behind this host; e2e/filterwasm runs the same table against
// filter.wasm.
func TestBehaviour(t *testing.T) {
	filtertest.Run(t, NewHost)
}

// script is a plugin whose callbacks are set by each test, to check that
// the emulated host answers as Envoy does.
type script struct {
	h          abi.Host
	configure  func(h abi.Host, size int) bool
	request    func(h abi.Host, id uint32) abi.Action
	callout    func(h abi.Host, root, token uint32, headers int)
	response   func(h abi.Host, id uint32)
	lastStream uint32
}

func (s *script) OnContextCreate(id, parent uint32) {
	if parent != 0 {
		s.lastStream = id
	}
}
func (s *script) OnVMStart(uint32, int) bool { return true }
func (s *script) OnConfigure(_ uint32, size int) bool {
	if s.configure != nil {
		return s.configure(s.h, size)
	}
	return true
}
func (s *script) OnRequestHeaders(id uint32, _ int, _ bool) abi.Action {
	if s.request != nil {
		return s.request(s.h, id)
	}
	return abi.ActionContinue
}
func (s *script) OnResponseHeaders(id uint32, _ int, _ bool) abi.Action {
	if s.response != nil {
		s.response(s.h, id)
	}
	return abi.ActionContinue
}
func (s *script) OnHTTPCallResponse(root, token uint32, headers, _, _ int) {
	if s.callout != nil {
		s.callout(s.h, root, token, headers)
	}
}
func (s *script) OnTick(uint32)   {}
func (s *script) OnDelete(uint32) {}

func emulated(t *testing.T, s *script) *vm {
	v := newEmulated(t, func(h abi.Host) abi.Plugin { s.h = h; return s })
	t.Cleanup(v.Close)
	return v
}

func want(t *testing.T, what string, got, want abi.Status) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %s, want %s", what, got, want)
	}
}

var calloutHeaders = []filtertest.Header{{":method", "POST"}, {":path", "/v1/check"}, {":authority", "sidecar"}}

func TestNativeLocalReplyIsDeferredAndWins(t *testing.T) {
	s := &script{}
	s.request = func(h abi.Host, id uint32) abi.Action {
		want(t, "local reply", h.SendLocalResponse(403, "denied", []byte("no"), [][2]string{{"x-why", "test"}}, -1), abi.StatusOK)
		// Still deciding: the headers are there until the callback returns.
		v, st := h.GetHeader(abi.MapRequestHeaders, "x-api-key")
		want(t, "header after the reply", st, abi.StatusOK)
		if v != "k" {
			t.Errorf("header %q", v)
		}
		return abi.ActionContinue
	}
	v := emulated(t, s)
	v.Configure("")
	st := v.NewStream()
	if st.RequestHeaders([]filtertest.Header{{":path", "/"}, {"x-api-key", "k"}}) {
		t.Error("the request went on after a local reply")
	}
	r, ok := st.LocalReply()
	if !ok || r.Status != 403 || string(r.Body) != "no" || r.Details != "denied" || !slices.Equal(r.Headers, []filtertest.Header{{"x-why", "test"}}) {
		t.Errorf("reply %+v %v", r, ok)
	}
}

func TestNativeCalloutBelongsToTheRoot(t *testing.T) {
	s := &script{}
	s.request = func(h abi.Host, id uint32) abi.Action {
		token, st := h.HTTPCall("sidecar", abi.EncodePairs(calloutHeaders), nil, nil, 5)
		want(t, "dispatch", st, abi.StatusOK)
		if token != 4 {
			t.Errorf("first token %d, want 4", token)
		}
		return abi.ActionPause
	}
	var stream uint32
	s.callout = func(h abi.Host, root, token uint32, headers int) {
		// On the root context, stream calls fail.
		want(t, "continue on the root", h.ContinueStream(abi.StreamRequest), abi.StatusBadArgument)
		want(t, "reply on the root", h.SendLocalResponse(500, "x", nil, nil, -1), abi.StatusBadArgument)
		_, st := h.GetHeader(abi.MapRequestHeaders, ":path")
		want(t, "request header on the root", st, abi.StatusNotFound)
		answer, st := h.GetHeaders(abi.MapHTTPCallResponseHeaders, nil)
		want(t, "callout headers", st, abi.StatusOK)
		if headers != 1 || !slices.Equal(answer, [][2]string{{":status", "200"}}) {
			t.Errorf("callout answer %q (%d)", answer, headers)
		}
		body, st := h.GetBuffer(abi.BufferHTTPCallResponseBody, 0, 100)
		if st != abi.StatusOK || string(body) != "ok" {
			t.Errorf("callout body %q %s", body, st)
		}
		want(t, "unknown context", h.SetEffectiveContext(999), abi.StatusBadArgument)
		want(t, "stream context", h.SetEffectiveContext(stream), abi.StatusOK)
		want(t, "header on the stream", h.ReplaceHeader(abi.MapRequestHeaders, "x-decision", "allow"), abi.StatusOK)
		want(t, "continue on the stream", h.ContinueStream(abi.StreamRequest), abi.StatusOK)
	}
	v := emulated(t, s)
	v.Configure("")
	st := v.NewStream()
	stream = s.lastStream
	if st.RequestHeaders([]filtertest.Header{{":path", "/"}}) {
		t.Fatal("went on while paused")
	}
	c, ok := st.Callout()
	if !ok || c.Cluster != "sidecar" || c.TimeoutMs != 5 || !slices.Equal(c.Headers, calloutHeaders) {
		t.Fatalf("callout %+v %v", c, ok)
	}
	st.RespondCallout([]filtertest.Header{{":status", "200"}}, []byte("ok"))
	if !st.Continued() {
		t.Fatal("not resumed")
	}
	if got := st.UpstreamHeaders(); !slices.Equal(got, []filtertest.Header{{":path", "/"}, {"x-decision", "allow"}}) {
		t.Errorf("upstream %q", got)
	}
	if _, ok := st.Callout(); ok {
		t.Error("answered callout still pending")
	}
	// Once the request went on, its headers are no longer the filter's.
	s.response = func(h abi.Host, id uint32) {
		_, st := h.GetHeader(abi.MapRequestHeaders, ":path")
		want(t, "request header after continue", st, abi.StatusNotFound)
		want(t, "response header", h.AddHeader(abi.MapResponseHeaders, "x-added", "1"), abi.StatusOK)
	}
	if got := st.ResponseHeaders([]filtertest.Header{{":status", "200"}}); !slices.Equal(got, []filtertest.Header{{":status", "200"}, {"x-added", "1"}}) {
		t.Errorf("response %q", got)
	}
}

func TestNativeHTTPCallChecks(t *testing.T) {
	var got []abi.Status
	var tokens []uint32
	s := &script{request: func(h abi.Host, id uint32) abi.Action {
		for _, c := range []struct {
			cluster string
			headers []filtertest.Header
		}{
			{"sidecar", calloutHeaders[:2]}, // no :authority
			{"", calloutHeaders},
			{"sidecar", calloutHeaders}, // FailNextDispatch
			{"sidecar", calloutHeaders},
			{"sidecar", calloutHeaders},
		} {
			tok, st := h.HTTPCall(c.cluster, abi.EncodePairs(c.headers), nil, nil, 0)
			got = append(got, st)
			tokens = append(tokens, tok)
		}
		return abi.ActionContinue
	}}
	v := emulated(t, s)
	v.Configure("")
	v.FailNextDispatch()
	v.NewStream().RequestHeaders(nil)
	if !slices.Equal(got, []abi.Status{abi.StatusBadArgument, abi.StatusBadArgument, abi.StatusInternalFailure, abi.StatusOK, abi.StatusOK}) {
		t.Errorf("statuses %v", got)
	}
	if tokens[3] != 4 || tokens[4] != 8 {
		t.Errorf("tokens %v, want 4 then 8", tokens)
	}
}

func TestNativeSharedDataMetricsClock(t *testing.T) {
	s := &script{}
	v := emulated(t, s)
	w := v.Worker().(*vm)
	t.Cleanup(w.Close)
	v.Configure("")
	do := func(fn func(h abi.Host)) {
		v.callback(v.rootID, func() { fn(v) })
	}
	do(func(h abi.Host) {
		_, _, st := h.GetSharedData("k")
		want(t, "missing key", st, abi.StatusNotFound)
		want(t, "first set", h.SetSharedData("k", []byte("a"), 0), abi.StatusOK)
		val, cas, st := h.GetSharedData("k")
		want(t, "get", st, abi.StatusOK)
		want(t, "set with cas", h.SetSharedData("k", []byte("b"), cas), abi.StatusOK)
		want(t, "set with a stale cas", h.SetSharedData("k", []byte("c"), cas), abi.StatusCASMismatch)
		if string(val) != "a" {
			t.Errorf("value %q", val)
		}
		id, st := h.DefineMetric(abi.MetricCounter, "c")
		want(t, "define", st, abi.StatusOK)
		want(t, "increment", h.IncrementMetric(id, 2), abi.StatusOK)
		want(t, "increment by 0", h.IncrementMetric(id, 0), abi.StatusBadArgument)
		want(t, "record a counter", h.RecordMetric(id, 1), abi.StatusBadArgument)
		hid, _ := h.DefineMetric(abi.MetricHistogram, "h")
		h.RecordMetric(hid, 700)
		h.RecordMetric(hid, 9)
	})
	w.callback(w.rootID, func() {
		val, _, _ := w.GetSharedData("k")
		if string(val) != "b" {
			t.Errorf("worker sees %q, want b", val)
		}
		id, _ := w.DefineMetric(abi.MetricCounter, "c")
		w.IncrementMetric(id, 1)
	})
	if n, ok := v.Metric("c"); !ok || n != 3 {
		t.Errorf("counter c = %d %v, want 3 (process-wide)", n, ok)
	}
	if n, _ := w.Metric("h"); n != 2 {
		t.Errorf("histogram h has %d samples, want 2", n)
	}
	before := nativeEpoch
	w.Advance(1500 * time.Millisecond)
	if got := v.Now(); got != before+int64(1500*time.Millisecond) {
		t.Errorf("clock %d after Advance on the other worker", got-before)
	}
	if _, st := v.GetBuffer(abi.BufferPluginConfiguration, 0, 10); st != abi.StatusNotFound {
		t.Errorf("plugin configuration outside proxy_on_configure: %s, want NOT_FOUND", st)
	}
}

func TestNativeConfigurationBuffer(t *testing.T) {
	var seen string
	s := &script{configure: func(h abi.Host, size int) bool {
		b, st := h.GetBuffer(abi.BufferPluginConfiguration, 0, size)
		want(t, "configuration", st, abi.StatusOK)
		seen = string(b)
		return size < 10
	}}
	v := emulated(t, s)
	if !v.Configure(`{"a":1}`) || seen != `{"a":1}` {
		t.Errorf("configure saw %q", seen)
	}
	if v.Configure(`{"long": true}`) {
		t.Error("a rejecting plugin was reported as configured")
	}
}

func TestNativeReplaceDropsDuplicates(t *testing.T) {
	s := &script{request: func(h abi.Host, id uint32) abi.Action {
		want(t, "replace", h.ReplaceHeader(abi.MapRequestHeaders, "X-Key", "one"), abi.StatusOK)
		want(t, "remove absent", h.RemoveHeader(abi.MapRequestHeaders, "x-absent"), abi.StatusOK)
		return abi.ActionContinue
	}}
	v := emulated(t, s)
	v.Configure("")
	st := v.NewStream()
	st.RequestHeaders([]filtertest.Header{{"x-key", "a"}, {":path", "/"}, {"x-key", "b"}})
	if got := st.UpstreamHeaders(); !slices.Equal(got, []filtertest.Header{{":path", "/"}, {"x-key", "one"}}) {
		t.Errorf("upstream %q", got)
	}
}

// FuzzConfiguredRequests: whatever configuration the filter accepts, the
// requests it decides under it never panic, recovered or not (a panic in a
// wasm VM would take every request of its worker down): each is decided,
// its callout answered (admitted, denied, timed out or reset), its
// response delivered, and the tick run; FuzzParse covers the
// configurations the filter refuses.
func FuzzConfiguredRequests(f *testing.F) {
	for _, c := range filtertest.ValidConfigs {
		f.Add(filtertest.ValidConfig(c), "POST", "/orders/1", "key-1", uint8(0))
	}
	f.Add(`{"mode": "shadow", "canary_clients": ["vip"], "costs": [{"path_prefix": "/", "cost": 1000000}]}`, "GET", "/x?y", "vip", uint8(1))
	f.Add(`{"on_failure": "local", "breaker": {"failures": 1, "min_open_ms": 60000}, "timeout_ms": 60000}`, "DELETE", "/", "", uint8(2))
	printable := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				return false
			}
		}
		return true
	}
	f.Fuzz(func(t *testing.T, config, method, path, key string, answer uint8) {
		if !printable(method+path+key) || method == "" || path == "" {
			return // Envoy hands a filter no such request
		}
		h := NewHost(t)
		defer h.Close()
		if !h.Configure(config) {
			return
		}
		for i := 0; i < 3; i++ {
			s := h.NewStream()
			headers := []filtertest.Header{{":method", method}, {":path", path}, {":authority", "api.example.com"}}
			if key != "" {
				headers = append(headers, filtertest.Header{"x-api-key", key})
			}
			s.RequestHeaders(headers)
			if _, ok := s.Callout(); ok {
				switch (answer + uint8(i)) % 4 {
				case 0:
					s.RespondCallout(filtertest.SidecarAnswer("p", 10, 1, 10, 1), nil)
				case 1:
					s.RespondCallout(filtertest.SidecarAnswer("p", 10, 1, 0, 1), nil)
				case 2:
					s.RespondCallout([]filtertest.Header{{":status", "504"}}, nil)
				default:
					s.RespondCallout(nil, nil)
				}
			}
			if s.Continued() {
				s.ResponseHeaders([]filtertest.Header{{":status", "200"}})
			}
			s.Done()
			h.Advance(time.Second)
			h.Tick()
		}
		for _, l := range h.Logs() {
			if strings.Contains(l, "internal error") || strings.Contains(l, "panic") {
				t.Fatalf("configuration %q: %s", config, l)
			}
		}
	})
}
