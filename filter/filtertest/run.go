package filtertest

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/filtertest/sidecaranswer"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// Run is the filter's table of behaviour. It drives hosts made by newHost
// through the Host and Stream interfaces only, so the same cases run
// natively (native.NewHost) and against filter.wasm in the headless host
// (filterwasm.NewHost). Every host it makes is closed at the test's cleanup,
// and no host may log a recovered panic.
func Run(t *testing.T, newHost func(t *testing.T) Host) {
	r := runner{newHost: newHost}
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"config/valid", r.configValid},
		{"config/invalid", r.configInvalid},
		{"callout/default", r.calloutDefault},
		{"callout/configured", r.calloutConfigured},
		{"sidecar/allowed", r.allowed},
		{"sidecar/denied", r.denied},
		{"sidecar/unknown-key", r.unknownKey},
		{"sidecar/fail-open", r.failOpen},
		{"sidecar/dispatch-failure", r.dispatchFailure},
		{"sidecar/unknown-cluster", r.unknownCluster},
		{"sidecar/fail-open-logs", r.failOpenLogs},
		{"sidecar/unavailable-who-answered", r.unavailableWhoAnswered},
		{"sidecar/hostile-answers", r.hostileAnswers},
		{"deny-cache/window", r.denyCacheWindow},
		{"deny-cache/costs", r.denyCacheCosts},
		{"deny-cache/plan-raised", r.denyCachePlanRaised},
		{"deny-cache/plan-changed", r.denyCachePlanChanged},
		{"deny-cache/workers", r.denyCacheWorkers},
		{"deny-cache/needs-exact-state", r.denyCacheNeedsExactState},
		{"deny-cache/bucket-model", r.denyCacheBucketModel},
		{"deny-cache/bucket-model-bursts", r.denyCacheBucketModelBursts},
		{"deny-cache/in-flight", r.denyCacheInFlight},
		{"deny-cache/in-flight-workers", r.denyCacheInFlightWorkers},
		{"deny-cache/failed-callout", r.denyCacheFailedCallout},
		{"deny-cache/failed-callout-shadow", r.denyCacheFailedCalloutShadow},
		{"deny-cache/evictions", r.denyCacheEvictions},
		{"costs", r.costs},
		{"grpc/replies", r.grpcReplies},
		{"grpc/web-replies", r.grpcWebReplies},
		{"mode/off", r.modeOff},
		{"mode/shadow", r.modeShadow},
		{"mode/canary", r.canary},
		{"mode/canary-rollout-size", r.canaryRolloutSize},
		{"key/missing", r.missingKey},
		{"key/invalid", r.invalidKey},
		{"key/missing-not-enforced", r.missingKeyNotEnforced},
		{"key/bearer", r.bearer},
		{"key/header", r.keyHeader},
		{"key/cors-preflight", r.corsPreflight},
		{"hostile/headers", r.hostileHeaders},
		{"lifecycle", r.lifecycle},
		{"plugins/two-in-one-vm", r.twoPlugins},
		{"breaker/opens", r.breakerOpens},
		{"breaker/dispatch-failures", r.breakerDispatchFailures},
		{"breaker/probe-closes", r.breakerProbeCloses},
		{"breaker/probe-reopens", r.breakerProbeReopens},
		{"breaker/answers-are-success", r.breakerAnswersAreSuccess},
		{"breaker/late-answers", r.breakerLateAnswers},
		{"breaker/burst-stays-closed", r.breakerBurstStaysClosed},
		{"breaker/wave-counts-once", r.breakerWaveCountsOnce},
		{"breaker/deny-cache-first", r.breakerDenyCacheFirst},
		{"breaker/shadow", r.breakerShadow},
		{"breaker/workers", r.breakerWorkers},
		{"breaker/lost-probe", r.breakerLostProbe},
		{"breaker/warm-ends-open", r.breakerWarmEndsOpen},
		{"breaker/disabled", r.breakerDisabled},
		{"breaker/default", r.breakerDefault},
		{"local/limits", r.localLimits},
		{"local/workers", r.localWorkers},
		{"local/learns-only-the-plan", r.localLearnsOnlyThePlan},
		{"local/partial-outage", r.localPartialOutage},
		{"local/not-for-shadow", r.localNotForShadow},
		{"local/off-by-default", r.localOffByDefault},
		{"local/evictions", r.localEvictions},
		{"local/clock-stepped-back", r.localClockSteppedBack},
		{"breaker/clock-stepped-back", r.breakerClockSteppedBack},
		{"warm/connections", r.warmConnections},
		{"warm/none", r.warmConnectionsNone},
		{"warm/after-outage", r.warmAfterOutage},
	} {
		t.Run(c.name, c.fn)
	}
}

type runner struct {
	newHost func(t *testing.T) Host
}

// host returns a configured host, closed at cleanup.
func (r runner) host(t *testing.T, config string) Host {
	t.Helper()
	h := r.unconfigured(t)
	if !h.Configure(config) {
		t.Fatalf("configuration %s rejected; logs:\n%s", config, strings.Join(h.Logs(), "\n"))
	}
	return h
}

func (r runner) unconfigured(t *testing.T) Host {
	t.Helper()
	h := r.newHost(t)
	owned(t, h)
	return h
}

// worker returns another VM of h's process configured with config, closed
// at cleanup.
func worker(t *testing.T, h Host, config string) Host {
	t.Helper()
	w := h.Worker()
	owned(t, w)
	if !w.Configure(config) {
		t.Fatalf("worker: configuration %s rejected; logs:\n%s", config, strings.Join(w.Logs(), "\n"))
	}
	return w
}

// owned closes h at cleanup, after checking it never recovered a panic.
func owned(t *testing.T, h Host) {
	t.Cleanup(func() {
		for _, l := range h.Logs() {
			if strings.Contains(l, "internal error") || strings.Contains(l, "panic") {
				t.Errorf("the plugin recovered a panic: %s", l)
			}
		}
		h.Close()
	})
}

// ---- requests and sidecar answers ----

// get is a GET / request from a client with the given key.
func get(key string, extra ...Header) []Header {
	return request("GET", "/", key, extra...)
}

func request(method, path, key string, extra ...Header) []Header {
	h := []Header{{":method", method}, {":path", path}, {":authority", "api.example.com"}, {":scheme", "https"}}
	if key != "" {
		h = append(h, Header{"x-api-key", key})
	}
	return append(h, extra...)
}

// send opens a stream and delivers headers.
func send(h Host, headers []Header) (Stream, bool) {
	s := h.NewStream()
	return s, s.RequestHeaders(headers)
}

// waiting sends headers and requires the request to wait for a callout.
func waiting(t *testing.T, h Host, headers []Header) (Stream, Callout) {
	t.Helper()
	s, cont := send(h, headers)
	if cont {
		t.Fatalf("request %q went on without waiting for the sidecar", headers)
	}
	if r, ok := s.LocalReply(); ok {
		t.Fatalf("request %q answered %d by the filter, want a callout", headers, r.Status)
	}
	c, ok := s.Callout()
	if !ok {
		t.Fatalf("request %q paused without a callout", headers)
	}
	return s, c
}

// allowAnswer is a hand-made 200 as an older sidecar sent it: whole
// remaining tokens as x-ratelimit-tokens, and no x-ratelimit-rate, which the
// sidecar's 200 always carries now (server.Answer.Fill). It is only for the
// rows about such an answer: what the filter tells the client without a
// rate (sidecar/allowed) and that it teaches on_failure local nothing
// (local/learns-only-the-plan). Every other row answers with the sidecar's
// own answer, SidecarAnswer or a sidecaranswer.Bucket.
func allowAnswer(limit, remaining, reset int64, plan string) []Header {
	return []Header{
		{":status", "200"},
		{"content-type", "application/json"},
		{"ratelimit-limit", strconv.FormatInt(limit, 10)},
		{"ratelimit-remaining", strconv.FormatInt(remaining, 10)},
		{"ratelimit-reset", strconv.FormatInt(reset, 10)},
		{"x-ratelimit-tokens", strconv.FormatInt(remaining, 10)},
		{"x-ratelimit-plan", plan},
	}
}

// firstAllow is the sidecar's 200 to a client's first check, of cost 1,
// under plan "basic" (10 tokens, refilled at 1 token/s): the bucket is full,
// 1 is taken and 9 are left (ratelimit-remaining 9, x-ratelimit-tokens 9),
// full again in 1 s (ratelimit-reset 1). Rows whose clients are each checked
// once, and about something else than the answer, use it.
var firstAllow = SidecarAnswer("basic", 10, 1, 10, 1)

// denyAnswer is a hand-made 429 for the edges of the contract (an older
// sidecar, values the sidecar never sends); tokens and rate are the exact
// bucket state ("" leaves the header out). Answers the sidecar really makes
// come from SidecarAnswer.
func denyAnswer(limit, remaining, reset, retryAfter int64, tokens, rate, plan string) []Header {
	h := []Header{
		{":status", "429"},
		{"content-type", "application/json"},
		{"ratelimit-limit", strconv.FormatInt(limit, 10)},
		{"ratelimit-remaining", strconv.FormatInt(remaining, 10)},
		{"ratelimit-reset", strconv.FormatInt(reset, 10)},
		{"retry-after", strconv.FormatInt(retryAfter, 10)},
		{"x-ratelimit-plan", plan},
	}
	if tokens != "" {
		h = append(h, Header{"x-ratelimit-tokens", tokens})
	}
	if rate != "" {
		h = append(h, Header{"x-ratelimit-rate", rate})
	}
	return h
}

// ---- assertions ----

// counters checks every requests.* counter: those in want have that value,
// all others are 0.
func counters(t *testing.T, h Host, want map[string]int64) {
	t.Helper()
	for _, name := range limiter.MetricNames() {
		if !strings.HasPrefix(name, "edgelimit.requests.") {
			continue
		}
		got, ok := h.Metric(name)
		if !ok {
			t.Errorf("metric %s not defined", name)
			continue
		}
		if got != want[name] {
			t.Errorf("metric %s = %d, want %d", name, got, want[name])
		}
	}
}

func metric(t *testing.T, h Host, name string) int64 {
	t.Helper()
	v, ok := h.Metric(name)
	if !ok {
		t.Fatalf("metric %s not defined", name)
	}
	return v
}

// header requires exactly one value of name.
func header(t *testing.T, headers []Header, name string) string {
	t.Helper()
	var vals []string
	for _, h := range headers {
		if h[0] == name {
			vals = append(vals, h[1])
		}
	}
	if len(vals) != 1 {
		t.Errorf("header %s: %d values %q in %q, want exactly one", name, len(vals), vals, headers)
		return ""
	}
	return vals[0]
}

func absent(t *testing.T, headers []Header, names ...string) {
	t.Helper()
	for _, n := range names {
		if v, ok := Get(headers, n); ok {
			t.Errorf("header %s: %q present, want none", n, v)
		}
	}
}

var rateLimitHeaderNames = []string{"ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"}

// wentOn requires the request to have reached the upstream, unanswered.
func wentOn(t *testing.T, s Stream) {
	t.Helper()
	if !s.Continued() {
		t.Error("request did not go on to the service")
	}
	if r, ok := s.LocalReply(); ok {
		t.Errorf("request answered %d by the filter", r.Status)
	}
}

// reply requires a local reply of status and returns it.
func reply(t *testing.T, s Stream, status int) Reply {
	t.Helper()
	if s.Continued() {
		t.Fatalf("request went on to the service, want a %d from the filter", status)
	}
	r, ok := s.LocalReply()
	if !ok {
		t.Fatalf("no local reply, want %d", status)
	}
	if r.Status != status {
		t.Fatalf("local reply %d, want %d", r.Status, status)
	}
	return r
}

// jsonBody decodes a local reply's JSON body.
func jsonBody(t *testing.T, r Reply) map[string]any {
	t.Helper()
	if ct := header(t, r.Headers, "content-type"); ct != limiter.ProblemContentType {
		t.Errorf("content-type %q", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	return m
}

// denial requires a 429 from the filter with the rate-limit headers: the
// whole RateLimit-Policy and RateLimit values, the legacy reset, and
// retry-after ("" when the request can never succeed and must have none);
// ratelimit-limit and ratelimit-remaining must repeat q and r. The body is
// the draft's quota-exceeded problem naming the policy.
func denial(t *testing.T, s Stream, policy, rl, reset, retryAfter string) Reply {
	t.Helper()
	r := reply(t, s, 429)
	param := func(v, name string) string {
		for _, p := range strings.Split(v, ";")[1:] {
			if k, val, _ := strings.Cut(p, "="); k == name {
				return val
			}
		}
		return ""
	}
	for _, c := range [][2]string{
		{"ratelimit-policy", policy},
		{"ratelimit", rl},
		{"ratelimit-limit", param(policy, "q")},
		{"ratelimit-remaining", param(rl, "r")},
		{"ratelimit-reset", reset},
		{"retry-after", retryAfter},
	} {
		if c[0] == "retry-after" && c[1] == "" {
			continue
		}
		if got := header(t, r.Headers, c[0]); got != c[1] {
			t.Errorf("429 header %s = %q, want %q", c[0], got, c[1])
		}
	}
	if _, ok := Get(r.Headers, "retry-after"); retryAfter == "" && ok {
		t.Errorf("429 with retry-after for a request that can never succeed")
	}
	// The draft: Retry-After never points earlier than t.
	if ra, tt := toInt(retryAfter), toInt(param(rl, "t")); retryAfter != "" && ra < tt {
		t.Errorf("retry-after %s is earlier than t=%d", retryAfter, tt)
	}
	body := jsonBody(t, r)
	name, _ := strings.CutPrefix(strings.SplitN(policy, ";", 2)[0], `"`)
	name, _ = strings.CutSuffix(name, `"`)
	vp, _ := body["violated-policies"].([]any)
	if body["type"] != limiter.QuotaExceededType || body["status"] != float64(429) || body["title"] == nil || body["detail"] == nil ||
		len(vp) != 1 || vp[0] != name {
		t.Errorf("429 body %s: want the quota-exceeded problem for policy %q", r.Body, name)
	}
	if retryAfter != "" && (body["error"] != "rate_limited" || strconv.FormatFloat(toFloat(body["retry_after"]), 'f', -1, 64) != retryAfter) {
		t.Errorf("429 body %s: want error rate_limited, retry_after %s", r.Body, retryAfter)
	}
	if retryAfter == "" && (body["error"] != "cost_above_limit" || body["retry_after"] != nil) {
		t.Errorf("429 body %s: want error cost_above_limit and no retry_after", r.Body)
	}
	return r
}

func toInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// values returns every value of name, in order.
func values(hs []Header, name string) []string {
	var v []string
	for _, h := range hs {
		if h[0] == name {
			v = append(v, h[1])
		}
	}
	return v
}

func toFloat(v any) float64 {
	f, _ := v.(float64)
	return f
}

// logged counts the log lines with prefix.
func logged(h Host, prefix string) []string {
	var lines []string
	for _, l := range h.Logs() {
		if strings.HasPrefix(l, prefix) {
			lines = append(lines, l)
		}
	}
	return lines
}

// ---- configuration ----

func (r runner) configValid(t *testing.T) {
	for _, f := range ValidConfigs {
		t.Run(f, func(t *testing.T) {
			h := r.unconfigured(t)
			if !h.Configure(ValidConfig(f)) {
				t.Fatalf("rejected; logs %q", h.Logs())
			}
			if len(logged(h, "edgelimit: configured: mode=")) != 1 {
				t.Errorf("no start-up line in %q", h.Logs())
			}
		})
	}
	h := r.unconfigured(t)
	if !h.Configure(ValidConfig("full.json")) {
		t.Fatal("full.json rejected")
	}
	want := "edgelimit: configured: mode=enforce sidecar_cluster=edge_ratelimit sidecar_authority=ratelimit.internal:8080 " +
		"timeout_ms=20 api_key_header=x-client-key on_missing_key=allow canary_clients=2 costs=3 region=eu-west-1 " +
		"breaker_failures=3 breaker_open_ms=50-2000 warm_connections=4 on_failure=local"
	if !slices.Contains(h.Logs(), want) {
		t.Errorf("logs %q\nwant the line %q", h.Logs(), want)
	}
	for _, l := range h.Logs() {
		if strings.Contains(l, "client-a") {
			t.Errorf("a canary API key was logged: %s", l)
		}
	}
}

func (r runner) configInvalid(t *testing.T) {
	for _, c := range InvalidConfigs {
		t.Run(c.File, func(t *testing.T) {
			h := r.unconfigured(t)
			if h.Configure(InvalidConfig(c.File)) {
				t.Fatal("accepted")
			}
			want := "edgelimit: invalid configuration: " + c.Error
			if !slices.Contains(h.Logs(), want) {
				t.Errorf("logs %q\nwant the line %q", h.Logs(), want)
			}
		})
	}
}

// ---- the callout ----

func (r runner) calloutDefault(t *testing.T) {
	h := r.host(t, "")
	_, c := waiting(t, h, get("key-1"))
	if c.Cluster != "ratelimit_sidecar" || c.TimeoutMs != 5 || len(c.Body) != 0 {
		t.Errorf("callout to %q, timeout %d ms, body %q; want ratelimit_sidecar, 5 ms, no body", c.Cluster, c.TimeoutMs, c.Body)
	}
	for _, want := range [][2]string{
		{":method", "POST"}, {":path", "/v1/check"}, {":authority", "ratelimit-sidecar"},
		{"x-api-key", "key-1"}, {"x-ratelimit-cost", "1"},
	} {
		if got := header(t, c.Headers, want[0]); got != want[1] {
			t.Errorf("callout header %s = %q, want %q", want[0], got, want[1])
		}
	}
	absent(t, c.Headers, "x-ratelimit-region", "authorization")
	// The proxy's clock at the send, in whole microseconds since the epoch:
	// by it the sidecar knows a check the filter has given up on.
	sent, err := strconv.ParseInt(header(t, c.Headers, "x-ratelimit-sent"), 10, 64)
	if err != nil || sent < 1e15 {
		t.Fatalf("x-ratelimit-sent %q (%v), want the clock in microseconds since 1970", header(t, c.Headers, "x-ratelimit-sent"), err)
	}
	h.Advance(1500 * time.Microsecond)
	_, c = waiting(t, h, get("key-1b"))
	if later, err := strconv.ParseInt(header(t, c.Headers, "x-ratelimit-sent"), 10, 64); err != nil || later-sent != 1500 {
		t.Errorf("x-ratelimit-sent 1.5 ms later: %q, want %d", header(t, c.Headers, "x-ratelimit-sent"), sent+1500)
	}
}

func (r runner) calloutConfigured(t *testing.T) {
	h := r.host(t, `{"sidecar_cluster": "edge_rl", "sidecar_authority": "rl.internal:9000", "timeout_ms": 25, "region": "eu-west-1"}`)
	_, c := waiting(t, h, get("key-2"))
	if c.Cluster != "edge_rl" || c.TimeoutMs != 25 {
		t.Errorf("callout to %q with timeout %d, want edge_rl and 25", c.Cluster, c.TimeoutMs)
	}
	if got := header(t, c.Headers, ":authority"); got != "rl.internal:9000" {
		t.Errorf(":authority %q", got)
	}
	if got := header(t, c.Headers, "x-ratelimit-region"); got != "eu-west-1" {
		t.Errorf("x-ratelimit-region %q", got)
	}
}

// ---- sidecar answers ----

func (r runner) allowed(t *testing.T) {
	h := r.host(t, "")
	// First an older sidecar's 200 (allowAnswer: no x-ratelimit-rate), what
	// this row is about beside the sidecar's own answer below.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(allowAnswer(100, 42, 7, "gold"), []byte(`{"allowed":true}`))
	wentOn(t, s)
	up := s.UpstreamHeaders()
	if got := header(t, up, "x-api-key"); got != "key-1" {
		t.Errorf("upstream x-api-key %q", got)
	}
	absent(t, up, "x-ratelimit-shadow")
	// A service's own RateLimit fields are kept and the edge's policy is
	// added beside them (the draft's intermediaries rule: add a more
	// restrictive policy, never remove the service's); the legacy trio,
	// which holds one policy, is the edge's. This answer is an older
	// sidecar's (no rate): no w, and t is its reset.
	resp := s.ResponseHeaders([]Header{{":status", "200"}, {"ratelimit-limit", "999"}, {"ratelimit", `"svc";r=5;t=1`},
		{"ratelimit-policy", `"svc";q=10;w=1`}, {"content-type", "text/plain"}})
	for _, want := range [][]string{
		{"ratelimit-policy", `"svc";q=10;w=1`, `"gold";q=100`},
		{"ratelimit", `"svc";r=5;t=1`, `"gold";r=42;t=7`},
		{"ratelimit-limit", "100"},
		{"ratelimit-remaining", "42"},
		{"ratelimit-reset", "7"},
		{"content-type", "text/plain"},
	} {
		if got := values(resp, want[0]); !slices.Equal(got, want[1:]) {
			t.Errorf("response header %s = %q, want %q", want[0], got, want[1:])
		}
	}
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricAllowed: 1})
	if n := metric(t, h, limiter.MetricCalloutLatency); n != 1 {
		t.Errorf("latency histogram has %d samples, want 1", n)
	}

	// The sidecar's own answer: 200 burst, 100/s, 1 token taken from a
	// full bucket. w is the 2 s the rate takes to refill the capacity, the
	// exact rate a vendor parameter; t the 10 ms to the next whole token,
	// rounded up to a second.
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("pro", 200, 100, 200, 1), nil)
	wentOn(t, s)
	resp = s.ResponseHeaders([]Header{{":status", "200"}})
	for _, want := range [][2]string{
		{"ratelimit-policy", `"pro";q=200;w=2;edgelimit-rate="100"`},
		{"ratelimit", `"pro";r=199;t=1`},
		{"ratelimit-limit", "200"},
		{"ratelimit-remaining", "199"},
		{"ratelimit-reset", "1"},
	} {
		if got := values(resp, want[0]); !slices.Equal(got, []string{want[1]}) {
			t.Errorf("response header %s = %q, want %q", want[0], got, want[1])
		}
	}
}

func (r runner) denied(t *testing.T) {
	h := r.host(t, "")
	s, _ := waiting(t, h, get("key-1"))
	// 0.25 tokens at 1/s: cost 1 is back in 0.75 s, full in 99.75 s.
	s.RespondCallout(SidecarAnswer("gold", 100, 1, 0.25, 1), []byte(`{"allowed":false}`))
	rep := denial(t, s, `"gold";q=100;w=100;edgelimit-rate="1"`, `"gold";r=0;t=1`, "100", "1")
	if strings.ContainsAny(rep.Details, " \t") || rep.Details == "" {
		t.Errorf("details %q: want a non-empty code without spaces", rep.Details)
	}
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricDenied: 1})

	// retry-after 0 would send the client straight back into the denial.
	s, _ = waiting(t, h, get("key-2"))
	s.RespondCallout(denyAnswer(10, 0, 5, 0, "", "", "basic"), nil)
	denial(t, s, `"basic";q=10`, `"basic";r=0;t=1`, "5", "1")

	// The case, cost 5 on 200 burst + 100/s with 0.5 tokens: the
	// sidecar says 45 ms, so 1 s; t (the next whole token, 5 ms) is no later.
	h = r.host(t, `{"costs": [{"method": "POST", "cost": 5}]}`)
	s, _ = waiting(t, h, request("POST", "/orders", "key-1"))
	s.RespondCallout(SidecarAnswer("pro", 200, 100, 0.5, 5), nil)
	denial(t, s, `"pro";q=200;w=2;edgelimit-rate="100"`, `"pro";r=0;t=1`, "2", "1")

	// A cost above the capacity can never succeed: no retry-after, whatever
	// the sidecar sent for older gateways, and the body says why.
	h = r.host(t, `{"costs": [{"method": "POST", "cost": 500}]}`)
	s, _ = waiting(t, h, request("POST", "/orders", "key-1"))
	s.RespondCallout(SidecarAnswer("pro", 200, 100, 200, 500), nil)
	rep = denial(t, s, `"pro";q=200;w=2;edgelimit-rate="100"`, `"pro";r=200`, "0", "")
	if d, _ := jsonBody(t, rep)["detail"].(string); !strings.Contains(d, "never") {
		t.Errorf("never: detail %q does not say it can never succeed", d)
	}
	// Its tokens bound the bucket as any denial's do: for the entry's
	// second of trust the next one is answered from it, no callout, the
	// same never and no retry-after, with the least the bucket can hold
	// as every cached denial tells it (another gateway may have spent the
	// 200 since: 0 left, the next token in 1 s, full in 2 s); past that
	// second one asks again (the plan may have been raised since).
	s, _ = send(h, request("POST", "/orders", "key-1"))
	if _, ok := s.Callout(); ok {
		t.Fatal("never again within the entry's trust: callout, want the cached denial")
	}
	rep = denial(t, s, `"pro";q=200;w=2;edgelimit-rate="100"`, `"pro";r=0;t=1`, "2", "")
	if d, _ := jsonBody(t, rep)["detail"].(string); !strings.Contains(d, "never") {
		t.Errorf("cached never: detail %q does not say it can never succeed", d)
	}
	h.Advance(time.Second)
	waiting(t, h, request("POST", "/orders", "key-1"))
}

// unknownKey: the sidecar answers 403 when no plan lists the key and there is
// no default plan. That is a decision, not a failure: the request is refused
// at the edge (failing open would make every unlisted key unlimited), and in
// shadow mode the service is told the request would be denied.
func (r runner) unknownKey(t *testing.T) {
	h := r.host(t, "")
	s, _ := waiting(t, h, get("stranger"))
	s.RespondCallout([]Header{{":status", "403"}, {"content-type", "text/plain"}}, []byte("unknown api key"))
	if body := jsonBody(t, reply(t, s, 403)); body["error"] != "unknown_api_key" {
		t.Errorf("403 body %v: want error unknown_api_key", body)
	}
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricUnknownKey: 1, limiter.MetricFailedOpenPrefix + "status": 0})

	h = r.host(t, `{"mode": "shadow"}`)
	s, _ = waiting(t, h, get("stranger"))
	s.RespondCallout([]Header{{":status", "403"}}, nil)
	wentOn(t, s)
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "deny" {
		t.Errorf("shadow, unknown key: header %q, want deny", got)
	}
	counters(t, h, map[string]int64{limiter.MetricShadowWouldDeny: 1, limiter.MetricUnknownKey: 0})
}

func (r runner) failOpen(t *testing.T) {
	text := Header{"content-type", "text/plain"}
	for _, c := range []struct {
		name   string
		answer []Header
		reason string
	}{
		{"503 unavailable", []Header{{":status", "503"}, text}, "unavailable"},
		{"504 timeout", []Header{{":status", "504"}, text}, "timeout"},
		{"500", []Header{{":status", "500"}, text}, "status"},
		{"400", []Header{{":status", "400"}, text}, "status"},
		{"302", []Header{{":status", "302"}, {"location", "/elsewhere"}}, "status"},
		{"reset", nil, "reset"},
		{"no status", []Header{text}, "malformed"},
		{"status not a number", []Header{{":status", "2xx"}}, "malformed"},
		{"status out of range", []Header{{":status", "20000"}}, "malformed"},
		{"200 without rate-limit headers", []Header{{":status", "200"}}, "malformed"},
		{"200 with a negative limit", []Header{{":status", "200"}, {"ratelimit-limit", "-1"}, {"ratelimit-remaining", "0"}, {"ratelimit-reset", "1"}}, "malformed"},
		{"429 without retry-after", []Header{{":status", "429"}, {"ratelimit-limit", "10"}, {"ratelimit-remaining", "0"}, {"ratelimit-reset", "1"}}, "malformed"},
		{"429 with an HTTP-date retry-after", []Header{{":status", "429"}, {"ratelimit-limit", "10"}, {"ratelimit-remaining", "0"},
			{"ratelimit-reset", "1"}, {"retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"}}, "malformed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := r.host(t, "")
			s, _ := waiting(t, h, get("key-1"))
			s.RespondCallout(c.answer, []byte("upstream connect error"))
			wentOn(t, s)
			absent(t, s.UpstreamHeaders(), "x-ratelimit-shadow")
			resp := s.ResponseHeaders([]Header{{":status", "200"}})
			absent(t, resp, rateLimitHeaderNames...)
			counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + c.reason: 1})
			if n := len(logged(h, "edgelimit: failing open ("+c.reason+"): ")); n != 1 {
				t.Errorf("%d fail-open lines for %s in %q, want 1", n, c.reason, h.Logs())
			}
		})
	}
}

func (r runner) dispatchFailure(t *testing.T) {
	h := r.host(t, "")
	h.FailNextDispatch()
	s, cont := send(h, get("key-1"))
	if !cont {
		t.Fatal("request waits although no callback will ever come")
	}
	if _, ok := s.Callout(); ok {
		t.Error("a callout is pending after a failed dispatch")
	}
	wentOn(t, s)
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "dispatch": 1})
	want := "edgelimit: failing open (dispatch): proxy_http_call failed: INTERNAL_FAILURE"
	if !slices.Contains(h.Logs(), want) {
		t.Errorf("logs %q, want %q", h.Logs(), want)
	}
	// Only the next dispatch failed. The sidecar never saw the first
	// request: key-1's bucket is full.
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
}

// unknownCluster: Envoy starts with a sidecar_cluster it has no cluster
// of (nothing checks the filter's configuration against its clusters), and
// every check's dispatch fails. The log names the field.
func (r runner) unknownCluster(t *testing.T) {
	h := r.host(t, `{"sidecar_cluster": "`+UnknownCluster+`"}`)
	s, _ := send(h, get("key-1"))
	wentOn(t, s)
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "dispatch": 1})
	want := `edgelimit: failing open (dispatch): proxy_http_call failed: BAD_ARGUMENT: the proxy has no cluster "` +
		UnknownCluster + `" (sidecar_cluster)`
	if !slices.Contains(h.Logs(), want) {
		t.Errorf("logs %q, want %q", h.Logs(), want)
	}
}

func (r runner) failOpenLogs(t *testing.T) {
	// Seven failures in a row: the breaker is off so that each one is a
	// callout (breaker/* has its own log lines).
	h := r.host(t, `{"breaker": {"failures": 0}}`)
	timeout := func() {
		s, _ := waiting(t, h, get("key-1"))
		s.RespondCallout(timeoutAnswer, nil)
		wentOn(t, s)
	}
	const prefix = "edgelimit: failing open (timeout): "
	for range 3 {
		timeout()
	}
	if got := logged(h, prefix); !slices.Equal(got, []string{prefix + "sidecar answered 504"}) {
		t.Errorf("after 3 timeouts within the interval: %q, want one line", got)
	}
	// Another reason has its own budget.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout([]Header{{":status", "503"}}, nil)
	if n := len(logged(h, "edgelimit: failing open (unavailable): ")); n != 1 {
		t.Errorf("%d lines for unavailable, want 1", n)
	}
	h.Advance(10 * time.Second)
	timeout()
	got := logged(h, prefix)
	if want := prefix + "sidecar answered 504; 2 more since the last report"; len(got) != 2 || got[1] != want {
		t.Errorf("after the interval: %q, want a second line %q", got, want)
	}
	timeout()
	timeout()
	h.Tick()
	if n := len(logged(h, prefix)); n != 2 {
		t.Errorf("a tick within the interval logged: %q", logged(h, prefix))
	}
	h.Advance(10 * time.Second)
	h.Tick()
	got = logged(h, prefix)
	if want := prefix + "2 more since the last report"; len(got) != 3 || got[2] != want {
		t.Errorf("tick after the interval: %q, want a third line %q", got, want)
	}
	h.Advance(10 * time.Second)
	h.Tick()
	if n := len(logged(h, prefix)); n != 3 {
		t.Errorf("a tick with nothing held back logged: %q", logged(h, prefix))
	}
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "timeout": 6, limiter.MetricFailedOpenPrefix + "unavailable": 1})
}

// unavailableWhoAnswered: a 503's log line says whether the sidecar sent
// it (Redis down or late: its reason is the body) or the proxy answered for
// a sidecar it could not reach (Envoy's local reply, text/plain), so that
// the gateway's log tells a dead sidecar from a Redis outage.
func (r runner) unavailableWhoAnswered(t *testing.T) {
	sidecarText := Header{"content-type", "text/plain; charset=utf-8"}
	envoyText := Header{"content-type", "text/plain"}
	for _, c := range []struct {
		name    string
		headers []Header
		body    string
		want    string
	}{
		{"redis down", []Header{{":status", "503"}, sidecarText, {"content-length", "18"}}, "redis unavailable\n",
			"sidecar answered 503: redis unavailable"},
		{"writes refused", []Header{{":status", "503"}, sidecarText, {"content-length", "15"}}, "checks refused\n",
			"sidecar answered 503: checks refused"},
		{"sidecar refused the connection", []Header{{":status", "503"}, envoyText, {"content-length", "91"}},
			"upstream connect error or disconnect/reset before headers. reset reason: connection failure",
			"the proxy answered 503 for the sidecar (not reachable: upstream connect error or disconnect/reset before headers. reset reason: connection failure)"},
		{"no healthy sidecar", []Header{{":status", "503"}, envoyText, {"content-length", "19"}}, "no healthy upstream",
			"the proxy answered 503 for the sidecar (not reachable: no healthy upstream)"},
		{"no body", []Header{{":status", "503"}}, "", "sidecar answered 503"},
		{"long body", []Header{{":status", "503"}}, "redis unavailable " + strings.Repeat("x", 1000), "sidecar answered 503: redis unavailable " + strings.Repeat("x", 256-18)},
		{"hostile body", []Header{{":status", "503"}}, "redis\x1b[31m down\r\nforged line", "sidecar answered 503: redis?[31m down"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := r.host(t, `{"breaker": {"failures": 0}}`)
			s, _ := waiting(t, h, get("key-1"))
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			s.RespondCallout(c.headers, body)
			wentOn(t, s)
			counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "unavailable": 1})
			want := "edgelimit: failing open (unavailable): " + c.want
			if got := logged(h, "edgelimit: failing open (unavailable): "); !slices.Equal(got, []string{want}) {
				t.Errorf("logs %q, want %q", got, want)
			}
		})
	}
}

func (r runner) hostileAnswers(t *testing.T) {
	// A plan name the sidecar's plans file would refuse (A-Z a-z 0-9 . _ -,
	// at most 64) is hostile; the rest of the answer is the sidecar's own
	// 200 to a client's first check: 10 tokens refilled at 1 token/s, so w
	// is ceil(10 / 1) = 10 and the exact rate is "1".
	for _, c := range []struct {
		plan, policy string
	}{
		{`evil"plan\x`, `"evil\"plan\\x"`},
		{"", `"default"`},
		{"plan\tname", `"default"`},
		{"план", `"default"`},
		{strings.Repeat("p", 65), `"default"`},
		{strings.Repeat("p", 64), `"` + strings.Repeat("p", 64) + `"`},
	} {
		h := r.host(t, "")
		s, _ := waiting(t, h, get("key-1"))
		s.RespondCallout(SidecarAnswer(c.plan, 10, 1, 10, 1), nil)
		resp := s.ResponseHeaders([]Header{{":status", "200"}})
		want := c.policy + `;q=10;w=10;edgelimit-rate="1"`
		if got := header(t, resp, "ratelimit-policy"); got != want {
			t.Errorf("plan %q: ratelimit-policy %q, want %q", c.plan, got, want)
		}
	}
	// Numbers the contract does not allow are a malformed answer.
	for _, bad := range []string{"1e3", "0x10", "+5", "5.0", " 5", "1234567890123456", ""} {
		h := r.host(t, "")
		s, _ := waiting(t, h, get("key-1"))
		s.RespondCallout([]Header{{":status", "200"}, {"ratelimit-limit", bad}, {"ratelimit-remaining", "1"}, {"ratelimit-reset", "1"}}, nil)
		wentOn(t, s)
		if n := metric(t, h, limiter.MetricFailedOpenPrefix+"malformed"); n != 1 {
			t.Errorf("ratelimit-limit %q: malformed = %d, want 1", bad, n)
		}
	}
}

// ---- deny cache ----

// denyCacheEvictions: the deny cache holds 512 clients per process (64
// shared-data keys of 8). 600 clients denied at once, each on a plan that
// refills over an hour so that no entry goes stale: every denial is
// stored, and each store into a full key evicts one entry, so the
// evictions counted are at least 600 - 512 and at most 600.
func (r runner) denyCacheEvictions(t *testing.T) {
	h := r.host(t, "")
	const clients, held = 600, 64 * 8
	for i := range clients {
		s, _ := waiting(t, h, get("evict-"+strconv.Itoa(i)))
		s.RespondCallout(SidecarAnswer("hourly", 1, 1.0/3600, 0, 1), nil)
		if st, _ := s.LocalReply(); st.Status != 429 {
			t.Fatalf("client %d: %d, want 429", i, st.Status)
		}
		s.Done()
	}
	if n := metric(t, h, limiter.MetricDenyEvicted); n < clients-held || n > clients {
		t.Errorf("%s = %d, want %d to %d", limiter.MetricDenyEvicted, n, clients-held, clients)
	}
	counters(t, h, map[string]int64{limiter.MetricDenied: clients})
}

func (r runner) denyCacheWindow(t *testing.T) {
	h := r.host(t, "")
	// 0.5 tokens left at t = 0 on a 10-token plan refilling 0.2 tokens/s,
	// and nobody spends: the bucket holds 0.5 + 0.2·t. 1 token is back in
	// 2.5 s.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.2, 0.5, 1), nil)
	const policy = `"basic";q=10;w=50;edgelimit-rate="0.2"`
	denial(t, s, policy, `"basic";r=0;t=3`, "48", "3")

	s, cont := send(h, get("key-1"))
	if cont {
		t.Fatal("a denied client went on within the window")
	}
	if _, ok := s.Callout(); ok {
		t.Fatal("callout within the window, want the cached denial")
	}
	denial(t, s, policy, `"basic";r=0;t=3`, "48", "3")

	// Another client is not affected: its bucket is full, and 1 is taken.
	s, _ = waiting(t, h, get("key-2"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.2, 10, 1), nil)
	wentOn(t, s)

	// An entry is trusted for a second: at 2.497 s, 3 ms before the
	// token can be back, the entry still denies, but its answer is 2.497 s
	// old, so the filter asks again (the plan may have changed since); the
	// bucket holds 0.5 + 0.2·2.497 = 0.9994 tokens, and the sidecar denies:
	// the token 3 ms away, full in 45.003 s.
	h.Advance(2500*time.Millisecond - 3*time.Millisecond)
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.2, 0.5+0.2*2.497, 1), nil)
	denial(t, s, policy, `"basic";r=0;t=1`, "46", "1")
	// That denial is the entry now: 0.9994 tokens at 2.497 s, the token
	// 3 ms on. The cache gives up early by its margin (10 µs + 3 ms / 1000
	// = 13 µs), never late: at 2.4999 s it denies (0.99998 tokens: full
	// in 45.0001 s, the token back in 0.1 ms).
	h.Advance(2900 * time.Microsecond)
	s, _ = send(h, get("key-1"))
	if _, ok := s.Callout(); ok {
		t.Fatal("callout 0.1 ms before the tokens can suffice")
	}
	denial(t, s, policy, `"basic";r=0;t=1`, "46", "1")
	// At 2.5 s the filter asks, and the bucket holds 0.5 + 0.2·2.5 = 1
	// token (exactly: the script's 2500000·0.2/10⁶ is 0.5): admitted, none
	// left.
	h.Advance(100 * time.Microsecond)
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.2, 1, 1), nil)
	wentOn(t, s)
	counters(t, h, map[string]int64{limiter.MetricDenied: 2, limiter.MetricDeniedCached: 2, limiter.MetricAllowed: 2})
}

func (r runner) denyCacheCosts(t *testing.T) {
	h := r.host(t, `{"costs": [{"path_prefix": "/heavy", "cost": 5}, {"path_prefix": "/double", "cost": 2}, {"path_prefix": "/huge", "cost": 50}]}`)
	const policy = `"basic";q=10;w=10;edgelimit-rate="1"`
	// A cost-5 request denied with 1 token left at 1 token/s: 4 s until 5
	// tokens, 9 s until full.
	s, c := waiting(t, h, request("GET", "/heavy", "key-1"))
	if got := header(t, c.Headers, "x-ratelimit-cost"); got != "5" {
		t.Fatalf("cost %q, want 5", got)
	}
	s.RespondCallout(SidecarAnswer("basic", 10, 1, 1, 5), nil)
	denial(t, s, policy, `"basic";r=1;t=1`, "9", "4")

	// asks requires a callout for a request of cost on path and answers it
	// as the sidecar does when the bucket holds tokens.
	asks := func(path string, cost int64, tokens float64) Stream {
		t.Helper()
		s, c := waiting(t, h, request("GET", path, "key-1"))
		if got := header(t, c.Headers, "x-ratelimit-cost"); got != strconv.FormatInt(cost, 10) {
			t.Fatalf("%s: cost %q, want %d", path, got, cost)
		}
		s.RespondCallout(SidecarAnswer("basic", 10, 1, tokens, cost), nil)
		return s
	}
	cached := func(path string, retryAfter string) {
		t.Helper()
		s, _ := send(h, request("GET", path, "key-1"))
		if _, ok := s.Callout(); ok {
			t.Fatalf("%s: callout, want the cached denial", path)
		}
		if got := header(t, reply(t, s, 429).Headers, "retry-after"); got != retryAfter {
			t.Errorf("%s: retry-after %s, want %s", path, got, retryAfter)
		}
	}

	// Cost 1 can be met by the token left: the filter asks, and the
	// sidecar takes it. The 200 replaces the client's entry: 0 tokens at
	// t = 0. Nobody else spends, so until the next admission the bucket
	// holds t tokens at t s (the script's elapsed·1/10⁶ from 0).
	wentOn(t, asks("/", 1, 1))

	// Above the capacity (10) of the entry's plan, which the entry, a
	// moment old, is trusted for: answered from it, no callout, never, so
	// no retry-after. The bucket is empty: the next token in 1 s, full in
	// 10 s.
	s, _ = send(h, request("GET", "/huge", "key-1"))
	if _, ok := s.Callout(); ok {
		t.Fatal("/huge: callout, want the cached denial")
	}
	denial(t, s, policy, `"basic";r=0;t=1`, "10", "")
	cached("/double", "2") // 2 tokens: not before 2 s
	cached("/heavy", "5")  // 5 tokens: not before 5 s
	// An entry is trusted for a second: at 1.997 s the entry (0 tokens at
	// 0 s) still denies 2 tokens, but the filter asks again, and the
	// sidecar denies: 1.997 tokens, 3 ms short (1 s), full in 8.003 s (9 s).
	h.Advance(1997 * time.Millisecond)
	denial(t, asks("/double", 2, 1.997), policy, `"basic";r=1;t=1`, "9", "1")
	// That denial is the entry now: 1.997 tokens at 1.997 s. 5 tokens are
	// 3.003 s away, 2 tokens 3 ms away, so its window for them ends 10 µs
	// + 3 µs sooner, at 1.999987 s. What the cached denials tell the
	// client counts the one whole token another gateway may have spent
	// since that answer: 0.997 tokens, 5 tokens 4.003 s away (5 s, where
	// the entry alone says 4 s), 2 tokens 1.003 s away (2 s, not 1). The
	// client asked a moment ago (the re-ask), so the entry answers alone.
	cached("/heavy", "5")
	h.Advance(2 * time.Millisecond)
	cached("/double", "2") // 1.999 tokens, 1 ms short, or 0.999 if one was spent elsewhere
	// At 2 s the bucket holds 2: admitted, 0 left, and that 200 is the
	// entry: 5 tokens at 7 s.
	h.Advance(time.Millisecond)
	wentOn(t, asks("/double", 2, 2))
	cached("/heavy", "5")
	// At 3.5 s the entry (0 tokens at 2 s) says 1.5 tokens, 5 tokens in
	// 3.5 s (4 s); a token may have been spent through another gateway
	// since, which makes it 4.5 s (5 s). The client's last ask was 1.5 s
	// ago: the filter asks, and tells the sidecar's exact wait, 4 s.
	h.Advance(1500 * time.Millisecond)
	denial(t, asks("/heavy", 5, 1.5), policy, `"basic";r=1;t=1`, "9", "4")
	// A moment later the entry is that answer and the client's turn to ask
	// is taken: the entry answers alone, counting the token that may have
	// been spent elsewhere (0.6 tokens at 3.6 s: 5 tokens 4.4 s away).
	h.Advance(100 * time.Millisecond)
	cached("/heavy", "5")
	// At 6.994 s, the entry 3.494 s old, the filter asks again: 4.994
	// tokens, 6 ms short (1 s), full in 5.006 s (6 s). The window for 5
	// tokens from there ends 10 µs + 6 µs before 7 s.
	h.Advance(3394 * time.Millisecond)
	denial(t, asks("/heavy", 5, 4.994), policy, `"basic";r=4;t=1`, "6", "1")
	// At 7 s the bucket holds 5 (the script's 5000000·1/10⁶ from the 0
	// written at 2 s): admitted.
	h.Advance(6 * time.Millisecond)
	wentOn(t, asks("/heavy", 5, 5))
	counters(t, h, map[string]int64{limiter.MetricDenied: 4, limiter.MetricDeniedCached: 7, limiter.MetricAllowed: 3})
}

// denyCachePlanRaised: a client with an entry whose plan is then raised
// past the cost of a request it sends. The entry's plan could never admit
// that cost, the plan in force can: the filter asks rather than answer "can
// never succeed, do not retry it" from the entry, and the sidecar's answer
// is the client's entry from then on.
func (r runner) denyCachePlanRaised(t *testing.T) {
	h := r.host(t, `{"costs": [{"path_prefix": "/heavy", "cost": 5}]}`)
	// Plan basic: 4 burst + 1 token an hour, denied with none left: 1
	// token is 3600 s away, 5 never.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 4, 1.0/3600, 0, 1), nil)
	denial(t, s, `"basic";q=4;w=14400;edgelimit-rate="0.0002777777777777778"`, `"basic";r=0;t=3600`, "14400", "3600")
	// The plan is raised to 10 burst + 10/s. A second on, the bucket holds
	// 10 tokens: a cost-5 request is asked about, and admitted.
	h.Advance(time.Second)
	s, c := waiting(t, h, request("GET", "/heavy", "key-1"))
	if got := header(t, c.Headers, "x-ratelimit-cost"); got != "5" {
		t.Fatalf("cost %q, want 5", got)
	}
	s.RespondCallout(SidecarAnswer("basic", 10, 10, 10, 5), nil)
	wentOn(t, s)
	// That 200 is the entry now (5 tokens at 10/s): a cost-1 request is
	// asked about too, not denied by the old plan's hour.
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 10, 5, 1), nil)
	wentOn(t, s)
	counters(t, h, map[string]int64{limiter.MetricDenied: 1, limiter.MetricDeniedCached: 0, limiter.MetricAllowed: 2})
}

// denyCachePlanChanged: an entry is trusted for a second after its answer.
// Past that, the first request it denies is asked about instead, one per
// process however many workers and requests there are (the others are
// denied by the entry while it is out), and the answer replaces the entry:
// a plan raised is in force a second after the sidecar has it, not when the
// old plan's window ends (here the hour 10 tokens an hour caps it at). A
// re-ask that cannot go out, or fails, is denied by the entry as before; a
// 403 (the key is in no plan now) removes the entry.
func (r runner) denyCachePlanChanged(t *testing.T) {
	h := r.host(t, "")
	w := worker(t, h, "")
	cachedDeny := func(h Host, key, what string) {
		t.Helper()
		s, _ := send(h, get(key))
		if _, ok := s.Callout(); ok {
			t.Fatalf("%s: callout, want the cached denial", what)
		}
		reply(t, s, 429)
	}
	// Plan slow: 10 burst + 10 an hour, spent: the next token is 360 s
	// away, a full bucket an hour.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("slow", 10, 10.0/3600, 0, 1), nil)
	denial(t, s, `"slow";q=10;w=3600;edgelimit-rate="0.002777777777777778"`, `"slow";r=0;t=360`, "3600", "360")
	h.Advance(999 * time.Millisecond)
	cachedDeny(h, "key-1", "0.999 s")
	cachedDeny(w, "key-1", "0.999 s, another worker")
	// The plan is raised to 100 burst + 100/s. A second after the answer,
	// one request asks; the others, on either worker, are denied by the
	// entry while it is out.
	h.Advance(time.Millisecond)
	a, _ := waiting(t, w, get("key-1"))
	cachedDeny(h, "key-1", "1 s, a re-ask out")
	cachedDeny(w, "key-1", "1 s, a re-ask out, on its worker")
	// The bucket kept its tokens, 10/3600 refilled (the sidecar keeps a
	// bucket through a plan change): denied by the new plan, the token
	// 9.97 ms away.
	a.RespondCallout(SidecarAnswer("fast", 100, 100, 1.0/360, 1), nil)
	denial(t, a, `"fast";q=100;w=1;edgelimit-rate="100"`, `"fast";r=0;t=1`, "1", "1")
	// That answer is the entry: 10 ms on, the filter asks, and admits.
	h.Advance(10 * time.Millisecond)
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("fast", 100, 100, 1.0/360+1, 1), nil)
	wentOn(t, s)
	counters(t, h, map[string]int64{limiter.MetricDenied: 2, limiter.MetricDeniedCached: 4, limiter.MetricAllowed: 1})

	// A key taken out of the plans: the 403 to the re-ask removes the
	// entry, and the next request is asked about too.
	s, _ = waiting(t, h, get("key-2"))
	s.RespondCallout(SidecarAnswer("slow", 10, 10.0/3600, 0, 1), nil)
	reply(t, s, 429)
	h.Advance(time.Second)
	for i := 0; i < 2; i++ {
		s, _ = waiting(t, h, get("key-2"))
		s.RespondCallout([]Header{{":status", "403"}}, nil)
		reply(t, s, 403)
	}

	// With no answer to be had, the entry still denies: a re-ask whose
	// dispatch fails, one the open breaker keeps in (the failure opened
	// it: one failure, 5 s), and one that times out.
	const brk = `{"breaker": {"failures": 1, "min_open_ms": 5000, "max_open_ms": 5000}}`
	h = r.host(t, brk)
	s, _ = waiting(t, h, get("key-3"))
	s.RespondCallout(SidecarAnswer("slow", 10, 10.0/3600, 0, 1), nil)
	reply(t, s, 429)
	h.Advance(time.Second)
	h.FailNextDispatch()
	cachedDeny(h, "key-3", "a re-ask whose dispatch failed")
	cachedDeny(h, "key-3", "just after a re-ask whose dispatch failed")
	h.Advance(time.Second)
	cachedDeny(h, "key-3", "a re-ask with the breaker open")
	h.Advance(4 * time.Second)
	s, _ = waiting(t, h, get("key-3")) // the breaker's probe
	s.RespondCallout(timeoutAnswer, nil)
	reply(t, s, 429)
	counters(t, h, map[string]int64{limiter.MetricDenied: 1, limiter.MetricDeniedCached: 4,
		limiter.MetricFailedOpenPrefix + "dispatch": 0, limiter.MetricFailedOpenPrefix + "circuit_open": 0,
		limiter.MetricFailedOpenPrefix + "timeout": 0})
}

// denyCacheInFlight: with an entry for the client, a request whose cost the
// bucket could hold, but not together with the callouts for the client this
// worker already has on their way (sent after the entry's answer came), is
// denied without a callout, and told the bucket as it is once those spend.
// The steps stay within the callouts' 5 ms timeout.
func (r runner) denyCacheInFlight(t *testing.T) {
	h := r.host(t, "")
	const policy = `"basic";q=10;w=1;edgelimit-rate="1000"`
	// 0.5 tokens left on a 10-token plan refilling 1 token/ms.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 1000, 0.5, 1), nil)
	denial(t, s, policy, `"basic";r=0;t=1`, "1", "1")

	// 2 ms on the bucket holds at most 2.5 tokens: room for two requests
	// on their way, not for a third.
	h.Advance(2 * time.Millisecond)
	a, _ := waiting(t, h, get("key-1"))
	b, _ := waiting(t, h, get("key-1"))
	queued := func() {
		t.Helper()
		s, _ := send(h, get("key-1"))
		if _, ok := s.Callout(); ok {
			t.Fatal("callout with the bucket's tokens all on their way, want the cached denial")
		}
		// What it is told counts those on their way as spent: r=0,
		// where the bucket alone would be r=2.
		denial(t, s, policy, `"basic";r=0;t=1`, "1", "1")
	}
	queued()
	// Another client is not affected.
	o, _ := waiting(t, h, get("key-2"))
	o.RespondCallout(SidecarAnswer("basic", 10, 1000, 10, 1), nil)
	wentOn(t, o)
	// The denial ends by the cache's margin (10 µs + 2.5 ms / 1000)
	// before the bound holds three tokens, at 2.5 ms.
	h.Advance(480 * time.Microsecond)
	queued()
	h.Advance(10 * time.Microsecond)
	d, _ := waiting(t, h, get("key-1"))

	// An answer replaces the entry: the bucket held 3 tokens and keeps 2.
	// The callouts sent before that answer came may be in its tokens
	// already; they no longer count, those sent after it do.
	a.RespondCallout(SidecarAnswer("basic", 10, 1000, 3, 1), nil)
	wentOn(t, a)
	h.Advance(10 * time.Microsecond)
	e, _ := waiting(t, h, get("key-1"))
	f, _ := waiting(t, h, get("key-1"))
	queued()
	for _, s := range []Stream{b, d, e, f} {
		s.RespondCallout(SidecarAnswer("basic", 10, 1000, 1, 1), nil)
		wentOn(t, s)
	}

	// Nor more than a full bucket: 3 ms after an answer that left 9
	// tokens, the bound says 12, the capacity 10. Ten go out, the
	// eleventh is answered here.
	h.Advance(10 * time.Millisecond)
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 1000, 10, 1), nil)
	wentOn(t, s)
	h.Advance(3 * time.Millisecond)
	var out []Stream
	for range 10 {
		s, _ := waiting(t, h, get("key-1"))
		out = append(out, s)
	}
	s, _ = send(h, get("key-1"))
	if _, ok := s.Callout(); ok {
		t.Fatal("callout with a full bucket's worth on their way, want the cached denial")
	}
	reply(t, s, 429)
	for _, s := range out {
		s.RespondCallout(SidecarAnswer("basic", 10, 1000, 10, 1), nil)
		wentOn(t, s)
	}
	counters(t, h, map[string]int64{limiter.MetricDenied: 1, limiter.MetricDeniedCached: 4, limiter.MetricAllowed: 17})
}

// denyCacheInFlightWorkers: the callouts on their way count whichever
// worker sent them. Each adds its cost to the client's shared entry and takes
// it off when it is answered without a new entry; an answer that makes a new
// entry leaves nothing pending in it, and a callout counted in the old entry
// does not take its cost off the new one. Steps stay within the callouts'
// 5 ms timeout; the 504s stand for callouts that timed out.
func (r runner) denyCacheInFlightWorkers(t *testing.T) {
	const config = `{"sidecar_cluster": "rl"}`
	h := r.host(t, config)
	w := worker(t, h, config)
	const policy = `"basic";q=10;w=1;edgelimit-rate="1000"`
	// 0.5 tokens left on a 10-token plan refilling 1 token/ms.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 1000, 0.5, 1), nil)
	denial(t, s, policy, `"basic";r=0;t=1`, "1", "1")
	cached := func(on Host) {
		t.Helper()
		s, _ := send(on, get("key-1"))
		if _, ok := s.Callout(); ok {
			t.Fatal("callout with the bucket's tokens all on their way, want the cached denial")
		}
		reply(t, s, 429)
	}

	// 2 ms on, the bucket holds at most 2.5 tokens: one callout from each
	// worker, and neither sends a third, though each has only one of its
	// own on the way. What the denial tells counts both as spent.
	h.Advance(2 * time.Millisecond)
	a, _ := waiting(t, h, get("key-1"))
	b, _ := waiting(t, w, get("key-1"))
	s, _ = send(w, get("key-1"))
	if _, ok := s.Callout(); ok {
		t.Fatal("callout with the bucket's tokens on their way from two workers, want the cached denial")
	}
	denial(t, s, policy, `"basic";r=0;t=1`, "1", "1")
	cached(h)

	// One of them times out: it no longer counts, and there is room for
	// another.
	a.RespondCallout(timeoutAnswer, nil)
	wentOn(t, a)
	c, _ := waiting(t, w, get("key-1"))
	cached(h)

	// b's answer makes a new entry, 1 token left, with nothing pending:
	// c was sent before it came. 10 µs on, d is counted in the new entry;
	// c's timeout does not take its cost off that, so the bound (1.01
	// tokens) has no room for one more. Nor for c itself: its request,
	// which the sidecar did not decide, is answered from the cache like
	// one arriving now, not let through.
	b.RespondCallout(SidecarAnswer("basic", 10, 1000, 2, 1), nil)
	wentOn(t, b)
	h.Advance(10 * time.Microsecond)
	d, _ := waiting(t, h, get("key-1"))
	c.RespondCallout(timeoutAnswer, nil)
	reply(t, c, 429)
	cached(w)
	d.RespondCallout(SidecarAnswer("basic", 10, 1000, 1.01, 1), nil)
	wentOn(t, d)
	// The counters are the process's, both workers' together.
	counters(t, h, map[string]int64{limiter.MetricDenied: 1, limiter.MetricDeniedCached: 5, limiter.MetricAllowed: 2,
		limiter.MetricFailedOpenPrefix + "timeout": 1, limiter.MetricFailedCached: 1})
}

// denyCacheFailedCallout: a request whose callout fails, however it fails,
// is decided by the deny cache as one arriving then would be: answered 429
// when what the client's other callouts brought back since shows the bucket
// cannot hold it, failed open when the cache cannot tell.
func (r runner) denyCacheFailedCallout(t *testing.T) {
	h := r.host(t, "")
	const policy = `"basic";q=10;w=1;edgelimit-rate="1000"`
	// A client the cache knows nothing of fails open.
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(timeoutAnswer, nil)
	wentOn(t, s)
	// 0.5 tokens left on a 10-token plan refilling 1 token/ms.
	s, _ = waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 1000, 0.5, 1), nil)
	denial(t, s, policy, `"basic";r=0;t=1`, "1", "1")
	for i, failure := range [][]Header{timeoutAnswer, unavailableAnswer, resetAnswer} {
		// 2 ms on, the bucket may hold 2.5 tokens: a and b go out. b's
		// answer says another gateway spent them all; a then fails, and
		// its request is denied from the entry b made.
		h.Advance(2 * time.Millisecond)
		a, _ := waiting(t, h, get("key-1"))
		b, _ := waiting(t, h, get("key-1"))
		b.RespondCallout(SidecarAnswer("basic", 10, 1000, 0, 1), nil)
		reply(t, b, 429)
		a.RespondCallout(failure, nil)
		denial(t, a, policy, `"basic";r=0;t=1`, "1", "1")
		if n := metric(t, h, limiter.MetricFailedCached); n != int64(i+1) {
			t.Errorf("failure %d: %s = %d, want %d", i, limiter.MetricFailedCached, n, i+1)
		}
	}
	// 1 ms after the last entry's decision the bucket may hold a token:
	// c goes out, and when it fails there is nothing to deny it by.
	h.Advance(time.Millisecond)
	c, _ := waiting(t, h, get("key-1"))
	c.RespondCallout(timeoutAnswer, nil)
	wentOn(t, c)
	counters(t, h, map[string]int64{limiter.MetricDenied: 4, limiter.MetricDeniedCached: 3,
		limiter.MetricFailedOpenPrefix + "timeout": 2})
	if n := metric(t, h, limiter.MetricFailedCached); n != 3 {
		t.Errorf("%s = %d, want 3", limiter.MetricFailedCached, n)
	}
}

// denyCacheFailedCalloutShadow: in shadow, a failed callout the cache
// denies goes on marked "deny", not "unknown".
func (r runner) denyCacheFailedCalloutShadow(t *testing.T) {
	h := r.host(t, `{"mode": "shadow"}`)
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 1000, 0.5, 1), nil)
	wentOn(t, s)
	h.Advance(2 * time.Millisecond)
	a, _ := waiting(t, h, get("key-1"))
	b, _ := waiting(t, h, get("key-1"))
	b.RespondCallout(SidecarAnswer("basic", 10, 1000, 0, 1), nil)
	wentOn(t, b)
	a.RespondCallout(timeoutAnswer, nil)
	wentOn(t, a)
	if got := header(t, a.UpstreamHeaders(), limiter.ShadowHeader); got != "deny" {
		t.Errorf("%s %q, want deny", limiter.ShadowHeader, got)
	}
	counters(t, h, map[string]int64{limiter.MetricShadowWouldDeny: 3})
	if n := metric(t, h, limiter.MetricFailedCached); n != 1 {
		t.Errorf("%s = %d, want 1", limiter.MetricFailedCached, n)
	}
}

func (r runner) denyCacheWorkers(t *testing.T) {
	const config = `{"sidecar_cluster": "rl"}`
	h := r.host(t, config)
	w := worker(t, h, config)
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.2, 0, 1), nil)
	reply(t, s, 429)

	s, _ = send(w, get("key-1"))
	if _, ok := s.Callout(); ok {
		t.Fatal("the other worker asked the sidecar, want the shared cached denial")
	}
	reply(t, s, 429)
	if n := metric(t, w, limiter.MetricDeniedCached); n != 1 {
		t.Errorf("denied_cached = %d, want 1", n)
	}

	// A plugin limiting through another sidecar cluster has its own cache.
	o := worker(t, w, `{"sidecar_cluster": "other"}`)
	waiting(t, o, get("key-1"))
}

func (r runner) denyCacheNeedsExactState(t *testing.T) {
	for _, c := range []struct {
		name   string
		config string
		path   string
		answer []Header
	}{
		// Hand-made 429s the sidecar does not make, an older one's or
		// malformed; the last row is the sidecar's own answer.
		{"no tokens", "", "/", denyAnswer(10, 0, 5, 5, "", "0.2", "basic")},
		// An older sidecar: its wait was rounded, and nothing is derived
		// from a rounded figure.
		{"no rate", "", "/", append(denyAnswer(10, 0, 5, 5, "0", "", "basic"), Header{"x-ratelimit-retry-after-ms", "5000"})},
		{"zero rate", "", "/", denyAnswer(10, 0, 5, 5, "0", "0", "basic")},
		{"bad tokens", "", "/", denyAnswer(10, 0, 5, 5, "NaN", "0.2", "basic")},
		{"bad rate", "", "/", denyAnswer(10, 0, 5, 5, "0", "Inf", "basic")},
		{"tokens would suffice", "", "/", denyAnswer(10, 1, 5, 5, "1.5", "0.2", "basic")},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := r.host(t, c.config)
			s, _ := waiting(t, h, request("GET", c.path, "key-1"))
			s.RespondCallout(c.answer, nil)
			reply(t, s, 429)
			waiting(t, h, request("GET", c.path, "key-1"))
		})
	}
}

// bucket is a client's bucket as the sidecar's script keeps it
// (sidecaranswer.Bucket: written only on admissions, refilled with the
// script's arithmetic), on the test's clock: Redis's time is the host's
// relative to the test's start, in whole microseconds as TIME gives it
// (the script uses only differences of times).
type bucket struct{ *sidecaranswer.Bucket }

// newBucket is the bucket of a client never seen: full.
func newBucket(capacity, rate float64) bucket {
	return bucket{sidecaranswer.NewBucket(capacity, rate)}
}

// level is what the script reads the bucket to hold at now.
func (b bucket) level(now time.Duration) float64 { return b.Level(now.Microseconds()) }

// answer decides a request of cost at now and answers as the sidecar does.
func (b bucket) answer(now time.Duration, cost int64) []Header {
	return b.Check("model", now.Microseconds(), cost)
}

// denyCacheBucketModel drives the filter with a random mix of clients,
// costs, pauses and callout latencies, answering every callout from a model
// of the sidecar's bucket. Every request must be decided by the sidecar or
// denied from the cache, and every cached denial must be one the bucket
// would have made at that instant (its tokens below the cost).
func (r runner) denyCacheBucketModel(t *testing.T) {
	h := r.host(t, `{"costs": [{"path_prefix": "/c2", "cost": 2}, {"path_prefix": "/c3", "cost": 3}, {"path_prefix": "/c5", "cost": 5}]}`)
	paths := []string{"/", "/c2", "/c3", "/c5"}
	costs := []int64{1, 2, 3, 5}
	buckets := map[string]bucket{}
	for _, k := range []string{"client-a", "client-b", "client-c"} {
		buckets[k] = newBucket(10, 4)
	}
	// A client whose rate has no short binary form, as most plans have.
	for _, k := range []string{"client-d"} {
		buckets[k] = newBucket(7, 10.0/3)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var now time.Duration
	advance := func(d time.Duration) { h.Advance(d); now += d }
	var calls, cached, sidecarDenied int
	for i := 0; i < 3000; i++ {
		key := []string{"client-a", "client-b", "client-c", "client-d"}[rng.IntN(4)]
		p := rng.IntN(len(paths))
		s, cont := send(h, request("GET", paths[p], key))
		if cont {
			t.Fatalf("request %d went on without a decision", i)
		}
		if c, ok := s.Callout(); ok {
			calls++
			if got := header(t, c.Headers, "x-ratelimit-cost"); got != strconv.FormatInt(costs[p], 10) {
				t.Fatalf("cost %s, want %d", got, costs[p])
			}
			// The sidecar decides up to 3 ms after the dispatch.
			advance(time.Duration(rng.IntN(3000)) * time.Microsecond)
			ans := buckets[key].answer(now, costs[p])
			s.RespondCallout(ans, nil)
			if v, _ := Get(ans, ":status"); v == "429" {
				sidecarDenied++
				reply(t, s, 429)
			} else {
				wentOn(t, s)
			}
		} else {
			cached++
			reply(t, s, 429)
			if lvl := buckets[key].level(now); lvl >= float64(costs[p]) {
				t.Fatalf("request %d: cached denial of cost %d while the bucket holds %.6f tokens", i, costs[p], lvl)
			}
		}
		s.Done()
		advance(time.Duration(rng.IntN(150)) * time.Millisecond)
	}
	t.Logf("%d callouts (%d denied by the sidecar), %d cached denials", calls, sidecarDenied, cached)
	if cached == 0 || sidecarDenied == 0 {
		t.Errorf("the mix did not exercise both the cache and the sidecar: %d cached, %d denied by the sidecar", cached, sidecarDenied)
	}
	counters(t, h, map[string]int64{
		limiter.MetricAllowed:      int64(calls - sidecarDenied),
		limiter.MetricDenied:       int64(sidecarDenied),
		limiter.MetricDeniedCached: int64(cached),
	})
}

// denyCacheBucketModelBursts drives two workers of one proxy with bursts:
// many callouts on their way at once, decided by a model of the sidecar's
// bucket in random order and answered later in another, some never decided
// and timing out. A cached denial may count callouts on their way as spent
// (filter/RATIONALE.md, "Callouts on their way"), so each is checked once
// every callout that was out at its moment has ended: the bucket then held
// less than its cost beside what those not yet decided went on to spend,
// unless one that was out spent nothing (the sidecar denied it, or it timed
// out), which is when such a denial may be wrong. A callout that times out,
// decided or not, has its request decided by the cache at that moment, or
// failed open: a 429 then is checked as any cached denial.
func (r runner) denyCacheBucketModelBursts(t *testing.T) {
	const config = `{"costs": [{"path_prefix": "/c2", "cost": 2}, {"path_prefix": "/c3", "cost": 3}]}`
	h := r.host(t, config)
	workers := []Host{h, worker(t, h, config)}
	paths := []string{"/", "/c2", "/c3"}
	costs := []int64{1, 2, 3}
	keys := []string{"client-a", "client-b"}
	buckets := map[string]bucket{}
	for _, k := range keys {
		buckets[k] = newBucket(10, 200)
	}
	type call struct {
		s     Stream
		key   string
		cost  int64
		sent  time.Duration
		ans   []Header // the sidecar's decision, once made
		spent bool     // the sidecar allowed it
	}
	type denial struct {
		key       string
		cost      int64
		level     float64
		undecided []*call // the client's callouts on their way then, not yet decided
		out       []*call // all of them
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var now time.Duration
	var out []*call
	var denials []*denial
	var calls, spent, denied, timedOut, allowedAnswers, deniedAnswers, failedOpen, failedCached int
	// record notes a cached denial of cost for key at now, with the
	// client's callouts on their way then.
	record := func(key string, cost int64) {
		d := &denial{key: key, cost: cost, level: buckets[key].level(now)}
		for _, c := range out {
			if c.key == key {
				d.out = append(d.out, c)
				if c.ans == nil {
					d.undecided = append(d.undecided, c)
				}
			}
		}
		denials = append(denials, d)
	}
	decide := func(c *call) {
		c.ans = buckets[c.key].answer(now, c.cost)
		if v, _ := Get(c.ans, ":status"); v == "429" {
			denied++
		} else {
			spent++
			c.spent = true
		}
	}
	// answer delivers out[i]'s answer: its decision, or for one in twenty a
	// timeout (504), which an undecided callout never gets past and a
	// decided one's answer comes after. Its request then goes on (failed
	// open) or is denied from the cache, as one arriving now.
	answer := func(i int) {
		c := out[i]
		out = append(out[:i], out[i+1:]...)
		if rng.IntN(20) == 0 {
			timedOut++
			c.s.RespondCallout(timeoutAnswer, nil)
			if c.s.Continued() {
				wentOn(t, c.s)
				failedOpen++
			} else {
				reply(t, c.s, 429)
				failedCached++
				record(c.key, c.cost)
			}
			c.s.Done()
			return
		}
		if c.ans == nil {
			decide(c)
		}
		c.s.RespondCallout(c.ans, nil)
		if c.spent {
			wentOn(t, c.s)
			allowedAnswers++
		} else {
			reply(t, c.s, 429)
			deniedAnswers++
		}
		c.s.Done()
	}
	for step := 0; step < 20000; step++ {
		switch a := rng.IntN(10); {
		case a < 5:
			key, p := keys[rng.IntN(len(keys))], rng.IntN(len(paths))
			s, cont := send(workers[rng.IntN(2)], request("GET", paths[p], key))
			if cont {
				t.Fatalf("step %d: a request went on without a decision", step)
			}
			if _, ok := s.Callout(); ok {
				calls++
				out = append(out, &call{s: s, key: key, cost: costs[p], sent: now})
				continue
			}
			reply(t, s, 429)
			s.Done()
			record(key, costs[p])
		case a < 7 && len(out) > 0:
			if c := out[rng.IntN(len(out))]; c.ans == nil {
				decide(c)
			}
		case a < 9 && len(out) > 0:
			answer(rng.IntN(len(out)))
		default:
			// Time passes; every callout is answered within its 5 ms
			// timeout.
			d := time.Duration(rng.IntN(1500)) * time.Microsecond
			for len(out) > 0 && now+d-out[0].sent >= 5*time.Millisecond {
				answer(0)
			}
			h.Advance(d)
			now += d
		}
	}
	for len(out) > 0 {
		answer(0)
	}
	var inFlight int
	for i, d := range denials {
		var theirs float64
		for _, c := range d.undecided {
			if c.spent {
				theirs += float64(c.cost)
			}
		}
		excused := false
		for _, c := range d.out {
			excused = excused || !c.spent
		}
		if d.level-theirs >= float64(d.cost) && !excused {
			t.Fatalf("cached denial %d of cost %d: the bucket held %.3f tokens, and %d callouts on their way not yet decided spent %.0f", i, d.cost, d.level, len(d.undecided), theirs)
		}
		if d.level >= float64(d.cost) {
			inFlight++
		}
	}
	t.Logf("%d callouts (%d allowed, %d denied by the sidecar, %d timed out: %d failed open, %d denied from the cache), %d cached denials, %d of them for callouts on their way",
		calls, spent, denied, timedOut, failedOpen, failedCached, len(denials), inFlight)
	if inFlight == 0 || denied == 0 || failedOpen == 0 || failedCached == 0 {
		t.Errorf("the mix did not exercise the count of callouts on their way and both ends of a timeout: %d such denials, %d denied by the sidecar, %d failed open, %d timeouts denied from the cache",
			inFlight, denied, failedOpen, failedCached)
	}
	counters(t, h, map[string]int64{
		limiter.MetricAllowed:                      int64(allowedAnswers),
		limiter.MetricDenied:                       int64(deniedAnswers),
		limiter.MetricDeniedCached:                 int64(len(denials)),
		limiter.MetricFailedOpenPrefix + "timeout": int64(failedOpen),
		limiter.MetricFailedCached:                 int64(failedCached),
	})
}

// ---- costs, modes, canary ----

func (r runner) costs(t *testing.T) {
	h := r.host(t, `{"costs": [{"method": "POST", "path_prefix": "/upload", "cost": 5},
		{"path_prefix": "/search", "cost": 2}, {"method": "DELETE", "cost": 3}]}`)
	// The sidecar answers from key-1's bucket, 100 tokens refilled at 10/s,
	// as its script keeps it; the clock stands still, so each check takes
	// its cost from what the last one left: 95, 94, 92, 90, 87, 85, 84.
	b := sidecaranswer.NewBucket(100, 10)
	for _, c := range []struct {
		method, path, cost string
	}{
		{"POST", "/upload/big?x=1", "5"},
		{"GET", "/upload", "1"},
		{"GET", "/search?q=go", "2"},
		{"POST", "/search", "2"},
		{"DELETE", "/upload", "3"},
		{"DELETE", "/search", "2"},
		{"GET", "/other", "1"},
	} {
		s, call := waiting(t, h, request(c.method, c.path, "key-1"))
		if got := header(t, call.Headers, "x-ratelimit-cost"); got != c.cost {
			t.Errorf("%s %s: cost %s, want %s", c.method, c.path, got, c.cost)
		}
		s.RespondCallout(b.Check("basic", 0, toInt(c.cost)), nil)
		wentOn(t, s)
		s.Done()
	}
}

func (r runner) modeOff(t *testing.T) {
	h := r.host(t, `{"mode": "off"}`)
	s, cont := send(h, get("key-1", Header{"x-ratelimit-shadow", "allow"}))
	if !cont {
		t.Fatal("mode off: request waits")
	}
	if _, ok := s.Callout(); ok {
		t.Error("mode off: callout made")
	}
	absent(t, s.UpstreamHeaders(), "x-ratelimit-shadow")
	absent(t, s.ResponseHeaders([]Header{{":status", "200"}}), rateLimitHeaderNames...)
	_, cont = send(h, get(""))
	if !cont {
		t.Error("mode off: a request without key was stopped")
	}
	counters(t, h, map[string]int64{limiter.MetricUnchecked: 2})
}

func (r runner) modeShadow(t *testing.T) {
	h := r.host(t, `{"mode": "shadow"}`)
	// A client's own decision header never reaches the service.
	s, _ := waiting(t, h, get("key-1", Header{"x-ratelimit-shadow", "allow"}))
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "allow" {
		t.Errorf("shadow allow: header %q", got)
	}
	absent(t, s.ResponseHeaders([]Header{{":status", "200"}}), rateLimitHeaderNames...)

	s, _ = waiting(t, h, get("key-2", Header{"x-ratelimit-shadow", "allow"}))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 1), nil)
	wentOn(t, s)
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "deny" {
		t.Errorf("shadow deny: header %q", got)
	}
	absent(t, s.ResponseHeaders([]Header{{":status", "200"}}), rateLimitHeaderNames...)

	// The cached decision is forwarded without a callout.
	s, cont := send(h, get("key-2"))
	if !cont {
		t.Fatal("shadow: cached denial stopped the request")
	}
	if _, ok := s.Callout(); ok {
		t.Error("shadow: callout within the cached window")
	}
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "deny" {
		t.Errorf("shadow cached deny: header %q", got)
	}

	s, _ = waiting(t, h, get("key-3"))
	s.RespondCallout(timeoutAnswer, nil)
	wentOn(t, s)
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "unknown" {
		t.Errorf("shadow fail-open: header %q", got)
	}
	h.FailNextDispatch()
	s, _ = send(h, get("key-3"))
	wentOn(t, s)
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "unknown" {
		t.Errorf("shadow dispatch failure: header %q", got)
	}
	counters(t, h, map[string]int64{
		limiter.MetricShadowAllowed:                1,
		limiter.MetricShadowWouldDeny:              2,
		limiter.MetricFailedOpenPrefix + "timeout": 1, limiter.MetricFailedOpenPrefix + "dispatch": 1,
	})
}

func (r runner) canary(t *testing.T) {
	h := r.host(t, `{"canary_clients": ["vip-1", "vip-2"]}`)
	s, _ := waiting(t, h, get("vip-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 1), nil)
	reply(t, s, 429)

	s, _ = waiting(t, h, get("regular"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 1), nil)
	wentOn(t, s)
	if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "deny" {
		t.Errorf("non-canary client: header %q", got)
	}

	// vip-2's first check: its full bucket of 10 keeps 9.
	s, _ = waiting(t, h, get("vip-2"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 10, 1), nil)
	wentOn(t, s)
	absent(t, s.UpstreamHeaders(), "x-ratelimit-shadow")
	if got := header(t, s.ResponseHeaders([]Header{{":status", "200"}}), "ratelimit-remaining"); got != "9" {
		t.Errorf("canary client allowed: ratelimit-remaining %q", got)
	}
	counters(t, h, map[string]int64{limiter.MetricDenied: 1, limiter.MetricShadowWouldDeny: 1, limiter.MetricAllowed: 1})
}

// canaryRolloutSize: the rollout's canary, the noisiest 5% of the 200,000
// clients the sidecar's plans are sized for, is 10,000 keys (here of 64
// characters, a configuration of some 680,000 bytes). The plugin takes it,
// and enforces the listed clients, first, middle and last, and no other:
// not an unlisted key, nor one a character short of a listed one.
func (r runner) canaryRolloutSize(t *testing.T) {
	keys := CanaryKeys(10000, 64, 0)
	h := r.unconfigured(t)
	if !h.Configure(CanaryConfig(keys)) {
		t.Fatalf("a canary of 10,000 keys rejected; logs:\n%s", strings.Join(h.Logs(), "\n"))
	}
	for _, k := range []string{keys[0], keys[5000], keys[9999]} {
		s, _ := waiting(t, h, get(k))
		s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 1), nil)
		reply(t, s, 429)
	}
	for _, k := range []string{CanaryKeys(1, 64, 10000)[0], keys[0][:63]} {
		s, _ := waiting(t, h, get(k))
		s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 1), nil)
		wentOn(t, s)
		if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "deny" {
			t.Errorf("unlisted client: header %q", got)
		}
	}
	counters(t, h, map[string]int64{limiter.MetricDenied: 3, limiter.MetricShadowWouldDeny: 2})
}

// ---- keys ----

func (r runner) missingKey(t *testing.T) {
	h := r.host(t, "")
	s, _ := send(h, get(""))
	if _, ok := s.Callout(); ok {
		t.Error("callout for a request without key")
	}
	rep := reply(t, s, 401)
	if body := jsonBody(t, rep); body["error"] != "missing_api_key" {
		t.Errorf("401 body %s", rep.Body)
	}
	counters(t, h, map[string]int64{limiter.MetricMissingKey: 1})

	h = r.host(t, `{"on_missing_key": "allow"}`)
	s, cont := send(h, get(""))
	if !cont {
		t.Error("on_missing_key allow: request stopped")
	}
	if _, ok := s.Callout(); ok {
		t.Error("on_missing_key allow: callout made")
	}
	absent(t, s.ResponseHeaders([]Header{{":status", "200"}}), rateLimitHeaderNames...)
	counters(t, h, map[string]int64{limiter.MetricMissingKey: 1})
}

func (r runner) invalidKey(t *testing.T) {
	h := r.host(t, "")
	bad := []string{"ctl\x01key", "has space", "tab\tkey", "del\x7fkey", "ключ", strings.Repeat("k", 257)}
	for _, k := range bad {
		s, _ := send(h, get(k))
		if _, ok := s.Callout(); ok {
			t.Errorf("key %q: callout made", k)
		}
		if body := jsonBody(t, reply(t, s, 401)); body["error"] != "invalid_api_key" {
			t.Errorf("key %q: body %v", k, body)
		}
	}
	counters(t, h, map[string]int64{limiter.MetricInvalidKey: int64(len(bad))})
	// The longest key allowed goes to the sidecar.
	long := strings.Repeat("k", 256)
	_, c := waiting(t, h, get(long))
	if header(t, c.Headers, "x-api-key") != long {
		t.Error("256-byte key not passed on")
	}

	h = r.host(t, `{"on_missing_key": "allow"}`)
	s, cont := send(h, get("has space"))
	if !cont {
		t.Error("on_missing_key allow: request with an invalid key stopped")
	}
	if _, ok := s.Callout(); ok {
		t.Error("invalid key passed to the sidecar")
	}
	counters(t, h, map[string]int64{limiter.MetricInvalidKey: 1})
}

// missingKeyNotEnforced: shadow never rejects, and beside a canary list a
// request without a key is not one of the listed clients. With
// on_missing_key reject, such a request goes on and tells the service that
// enforcement would refuse it; nothing asks the sidecar.
func (r runner) missingKeyNotEnforced(t *testing.T) {
	for _, config := range []string{`{"mode": "shadow"}`, `{"canary_clients": ["vip-1"]}`} {
		t.Run(config, func(t *testing.T) {
			h := r.host(t, config)
			for _, headers := range [][]Header{
				get(""),
				get("has space"),
				get("", Header{"authorization", "Basic dXNlcjpwdw=="}),
				get("", Header{"x-ratelimit-shadow", "allow"}),
			} {
				s, _ := send(h, headers)
				wentOn(t, s)
				if _, ok := s.Callout(); ok {
					t.Errorf("%v: callout made", headers)
				}
				if got := header(t, s.UpstreamHeaders(), "x-ratelimit-shadow"); got != "deny" {
					t.Errorf("%v: x-ratelimit-shadow %q, want deny", headers, got)
				}
				absent(t, s.UpstreamHeaders(), "x-api-key")
			}
			counters(t, h, map[string]int64{limiter.MetricMissingKey: 3, limiter.MetricInvalidKey: 1,
				limiter.MetricShadowWouldDeny: 0})
		})
	}
	// With on_missing_key allow nothing would be refused: no header, as
	// in enforce.
	h := r.host(t, `{"mode": "shadow", "on_missing_key": "allow"}`)
	s, cont := send(h, get(""))
	if !cont {
		t.Fatal("shadow, on_missing_key allow: request stopped")
	}
	absent(t, s.UpstreamHeaders(), "x-ratelimit-shadow")
}

func (r runner) bearer(t *testing.T) {
	h := r.host(t, "")
	for _, c := range []struct {
		headers []Header
		key     string // "" for a 401
		problem string // error in the 401 body
	}{
		{[]Header{{"authorization", "Bearer tok-1"}}, "tok-1", ""},
		{[]Header{{"authorization", "bearer    tok-2"}}, "tok-2", ""},
		{[]Header{{"authorization", "BEARER tok-3"}}, "tok-3", ""},
		{[]Header{{"x-api-key", "key-4"}, {"authorization", "Bearer tok-4"}}, "key-4", ""},
		{[]Header{{"x-api-key", ""}, {"authorization", "Bearer tok-5"}}, "tok-5", ""},
		{[]Header{{"authorization", "Basic dXNlcjpwYXNz"}}, "", "missing_api_key"},
		{[]Header{{"authorization", "Bearertok"}}, "", "missing_api_key"},
		{[]Header{{"authorization", "Bearer a b"}}, "", "invalid_api_key"},
		{[]Header{{"authorization", "Bearer \x01"}}, "", "invalid_api_key"},
		// Two authorization lines, as Envoy hands them to a filter: one
		// value joined by "," (an inline header). No single key can be
		// told from it.
		{[]Header{{"authorization", "Bearer a,Bearer b"}}, "", "invalid_api_key"},
	} {
		s, _ := send(h, request("GET", "/", "", c.headers...))
		if c.key == "" {
			if body := jsonBody(t, reply(t, s, 401)); body["error"] != c.problem {
				t.Errorf("%q: body %v, want %s", c.headers, body, c.problem)
			}
			continue
		}
		call, ok := s.Callout()
		if !ok {
			t.Errorf("%q: no callout", c.headers)
			continue
		}
		if got := header(t, call.Headers, "x-api-key"); got != c.key {
			t.Errorf("%q: key %q, want %q", c.headers, got, c.key)
		}
		s.RespondCallout(firstAllow, nil)
		wentOn(t, s)
	}
}

func (r runner) keyHeader(t *testing.T) {
	h := r.host(t, `{"api_key_header": "X-Client-Key"}`)
	_, c := waiting(t, h, request("GET", "/", "", Header{"x-client-key", "ck-1"}))
	if got := header(t, c.Headers, "x-api-key"); got != "ck-1" {
		t.Errorf("key %q, want ck-1", got)
	}
	// x-api-key means nothing once another header is configured.
	s, _ := send(h, get("key-1"))
	reply(t, s, 401)
}

// corsPreflight: a browser calling the API from another origin with the
// key in a header first sends a preflight, OPTIONS with Origin and
// Access-Control-Request-Method, and never the key on it (Fetch). Without
// a key it goes on uncharged, under every mode that checks keys, and a
// malformed key on one does not reach the service. A request with a key
// pays, whatever its method; an OPTIONS that lacks either header is an
// ordinary request: 401 without a key.
func (r runner) corsPreflight(t *testing.T) {
	preflight := func(key string, extra ...Header) []Header {
		return request("OPTIONS", "/orders/1", key, append([]Header{
			{"origin", "https://app.example"},
			{"access-control-request-method", "POST"},
			{"access-control-request-headers", "content-type,x-api-key"},
		}, extra...)...)
	}
	for _, config := range []string{"", `{"mode": "shadow"}`, `{"canary_clients": ["vip-1"]}`,
		`{"costs": [{"method": "OPTIONS", "cost": 5}]}`} {
		t.Run(config, func(t *testing.T) {
			h := r.host(t, config)
			for _, headers := range [][]Header{
				preflight(""),
				preflight("has space"),
				preflight("", Header{"x-api-key", ""}, Header{"x-api-key", "key-uncharged"}),
			} {
				s, cont := send(h, headers)
				if !cont {
					t.Errorf("%q: preflight stopped", headers)
				}
				wentOn(t, s)
				if _, ok := s.Callout(); ok {
					t.Errorf("%q: callout made for a preflight", headers)
				}
				absent(t, s.UpstreamHeaders(), "x-api-key", "x-ratelimit-shadow")
				absent(t, s.ResponseHeaders([]Header{{":status", "204"}}), rateLimitHeaderNames...)
			}
			counters(t, h, map[string]int64{limiter.MetricPreflight: 3})
		})
	}
	h := r.host(t, "")
	for _, c := range []struct {
		name    string
		headers []Header
	}{
		{"with a key", preflight("key-3")},
		{"with a Bearer key", preflight("", Header{"authorization", "Bearer key-3"})},
		{"no origin", request("OPTIONS", "/", "key-3", Header{"access-control-request-method", "GET"})},
		{"no request method", request("OPTIONS", "/", "key-3", Header{"origin", "https://app.example"})},
	} {
		s, call := waiting(t, h, c.headers)
		if got := header(t, call.Headers, "x-api-key"); got != "key-3" {
			t.Errorf("%s: charged %q, want key-3", c.name, got)
		}
		s.RespondCallout(firstAllow, nil)
		wentOn(t, s)
	}
	for _, c := range []struct {
		name    string
		headers []Header
	}{
		{"no origin", request("OPTIONS", "/", "", Header{"access-control-request-method", "GET"})},
		{"empty origin", request("OPTIONS", "/", "", Header{"origin", ""},
			Header{"access-control-request-method", "GET"})},
		{"no request method", request("OPTIONS", "/", "", Header{"origin", "https://app.example"})},
		{"empty request method", request("OPTIONS", "/", "", Header{"origin", "https://app.example"},
			Header{"access-control-request-method", ""})},
		{"GET", request("GET", "/", "", Header{"origin", "https://app.example"},
			Header{"access-control-request-method", "GET"})},
		{"lower-case method", request("options", "/", "", Header{"origin", "https://app.example"},
			Header{"access-control-request-method", "GET"})},
	} {
		s, _ := send(h, c.headers)
		if body := jsonBody(t, reply(t, s, 401)); body["error"] != "missing_api_key" {
			t.Errorf("%s: body %v, want missing_api_key", c.name, body)
		}
	}
	counters(t, h, map[string]int64{limiter.MetricPreflight: 0, limiter.MetricAllowed: 4, limiter.MetricMissingKey: 6})
}

// ---- hostile input ----

func (r runner) hostileHeaders(t *testing.T) {
	h := r.host(t, "")
	// Two keys: the sidecar is asked about the first, and the service sees
	// only that one, so it cannot authenticate a key that was not charged.
	s, c := waiting(t, h, get("key-a", Header{"x-api-key", "key-b"}))
	if got := header(t, c.Headers, "x-api-key"); got != "key-a" {
		t.Errorf("charged %q, want key-a", got)
	}
	s.RespondCallout(firstAllow, nil)
	if got := header(t, s.UpstreamHeaders(), "x-api-key"); got != "key-a" {
		t.Errorf("service sees x-api-key %q, want key-a alone", got)
	}
	// An empty key header first: the key is the Bearer token, and the key
	// header, with the key after the empty value, does not reach the
	// service, which could read that key as the client's though no bucket
	// paid for it.
	s, c = waiting(t, h, get("", Header{"x-api-key", ""}, Header{"x-api-key", "key-uncharged"},
		Header{"authorization", "Bearer key-bearer"}))
	if got := header(t, c.Headers, "x-api-key"); got != "key-bearer" {
		t.Errorf("charged %q, want key-bearer", got)
	}
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	if v, ok := Get(s.UpstreamHeaders(), "x-api-key"); ok {
		t.Errorf("service sees x-api-key %q, want none: the key charged came from authorization", v)
	}
	// With on_missing_key allow, a request whose first key is empty or
	// invalid goes on unlimited, without the keys after it.
	ha := r.host(t, `{"on_missing_key": "allow"}`)
	for _, first := range []string{"", "not a key"} {
		s, _ = send(ha, get("", Header{"x-api-key", first}, Header{"x-api-key", "key-uncharged"}))
		wentOn(t, s)
		if _, ok := s.Callout(); ok {
			t.Errorf("first key %q: a callout was made", first)
		}
		if v, ok := Get(s.UpstreamHeaders(), "x-api-key"); ok {
			t.Errorf("first key %q: service sees x-api-key %q, want none: nothing was charged", first, v)
		}
	}

	// A flood of headers and a huge header value do not disturb the check.
	var many []Header
	for i := range 500 {
		many = append(many, Header{"x-junk-" + strconv.Itoa(i), strings.Repeat("v", 100)})
	}
	s, c = waiting(t, h, get("key-c", many...))
	if got := header(t, c.Headers, "x-api-key"); got != "key-c" {
		t.Errorf("with 500 headers: key %q", got)
	}
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	s, _ = send(h, get(strings.Repeat("x", 64<<10)))
	reply(t, s, 401)

	// A huge or binary answer body is ignored.
	s, _ = waiting(t, h, get("key-d"))
	s.RespondCallout(firstAllow, []byte(strings.Repeat("\x00\xff", 1<<16)))
	wentOn(t, s)
}

// ---- lifecycle ----

func (r runner) lifecycle(t *testing.T) {
	// Before configuration the filter lets everything through.
	h := r.unconfigured(t)
	s, cont := send(h, get("key-1"))
	if !cont {
		t.Error("unconfigured: request stopped")
	}
	if _, ok := s.Callout(); ok {
		t.Error("unconfigured: callout made")
	}

	// A client that goes away before the answer: the late answer is dropped.
	h = r.host(t, "")
	s, _ = waiting(t, h, get("key-1"))
	s.Done()
	s.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 1), nil)
	if _, ok := s.LocalReply(); ok {
		t.Error("a local reply was sent to a finished stream")
	}
	// The denial it carried is still worth caching.
	s, _ = send(h, get("key-1"))
	reply(t, s, 429)
	s.Done()
	s.Done()

	// Streams keep working after all that.
	s, _ = waiting(t, h, get("key-2"))
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricDeniedCached: 1, limiter.MetricAllowed: 1})
}
