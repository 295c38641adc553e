package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// fakeDecider answers as tokenbucket.lua does (lua.Decide) for a bucket
// that holds bucket(l) tokens when the call runs, a full one when bucket is
// nil; or with a fixed error; or, with block set, only at the call's
// deadline, with context.DeadlineExceeded. It records what it was asked.
// The Redis-backed behaviour is tested in package app against real Redis.
type fakeDecider struct {
	mu       sync.Mutex
	bucket   func(lua.Limit) float64
	err      error
	block    bool
	readyErr error
	calls    []fakeCall
	left     []time.Duration // each call's time to its deadline
}

type fakeCall struct {
	key   string
	limit lua.Limit
	cost  int64
}

func (f *fakeDecider) Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{key, l, cost})
	f.left = append(f.left, time.Until(deadline))
	bucket, err, block := f.bucket, f.err, f.block
	f.mu.Unlock()
	if block {
		time.Sleep(time.Until(deadline))
		return lua.Result{}, fmt.Errorf("fake: %w", context.DeadlineExceeded)
	}
	if err != nil {
		return lua.Result{}, err
	}
	tokens := l.Capacity
	if bucket != nil {
		tokens = bucket(l)
	}
	return lua.Decide(l, tokens, cost), nil
}

// holding is a fakeDecider's bucket that holds tokens, or the capacity if
// that is less, as the script caps a balance above a shrunk capacity.
func holding(tokens float64) func(lua.Limit) float64 {
	return func(l lua.Limit) float64 { return min(tokens, l.Capacity) }
}

func (f *fakeDecider) Ready(context.Context) error { return f.readyErr }

func (f *fakeDecider) Refused() error { return nil }

const planYAML = `
default_plan: free
plans:
  free: {capacity: 10, rate: 1}
  pro:  {capacity: 200, rate: 100}
clients:
  "client-key-123": pro
`

func newTestServer(t testing.TB, yaml string, d Decider) (*Server, *stats.Stats, *bytes.Buffer) {
	t.Helper()
	p, err := plans.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	st := stats.New()
	var logs bytes.Buffer
	s := New(Options{
		Plans:   func() *plans.Plans { return p },
		Decider: d,
		Keys:    keys.New(nil),
		Stats:   st,
		// Not the shipped 4 ms: these tests read the deadline a decision
		// was given against the call's own duration, and set a check's
		// wait relative to Timeout; 20 ms keeps a pause of a loaded
		// machine inside a call from passing the deadline itself.
		Timeout: 20 * time.Millisecond,
		Log:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	return s, st, &logs
}

// do runs one request through the handler.
func do(s *Server, method, path string, headers ...string) *fasthttp.Response {
	return doFrom(s, net.IPv4(127, 0, 0, 1), method, path, headers...)
}

// doFrom is do for a request from ip.
func doFrom(s *Server, ip net.IP, method, path string, headers ...string) *fasthttp.Response {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(path)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	ctx.Init(&req, &net.TCPAddr{IP: ip, Port: 1}, nil)
	s.Handle(&ctx)
	resp := &fasthttp.Response{}
	ctx.Response.CopyTo(resp)
	return resp
}

func header(r *fasthttp.Response, name string) string { return string(r.Header.Peek(name)) }

// TestCheckHeaders maps script results to status and headers, exactly.
// Each row's bucket holds tokens when the check runs; the decider answers
// as the script does for the plan and cost the check carries.
func TestCheckHeaders(t *testing.T) {
	tests := []struct {
		name   string
		key    string // planYAML: "someone" is free (10, 1/s), "client-key-123" pro (200, 100/s)
		cost   string // x-ratelimit-cost; "" sends none (cost 1)
		tokens float64
		status int
		want   map[string]string // "" means the header must be absent
	}{
		{"allowed", "someone", "", 10, 200, map[string]string{
			HeaderLimit: "10", HeaderRemaining: "9", HeaderReset: "1", HeaderTokens: "9", HeaderPlan: "free",
			HeaderRate: "1", HeaderRetryAfter: "", HeaderRetryAfterMs: "", HeaderNever: "",
		}},
		// 3.75 left, 6.25 s to refill: reset rounds up.
		{"allowed fractional", "someone", "", 4.75, 200, map[string]string{
			HeaderRemaining: "3", HeaderReset: "7", HeaderTokens: "3.75",
		}},
		// Short by 0.75 at 1/s: 750 ms.
		{"denied, sub-second wait rounds up to 1 s", "someone", "", 0.25, 429, map[string]string{
			HeaderRemaining: "0", HeaderReset: "10", HeaderTokens: "0.25",
			HeaderRetryAfter: "1", HeaderRetryAfterMs: "750", HeaderNever: "", HeaderRate: "1",
		}},
		// The case: 0.999 tokens, 100/s, cost 1. The wait is 0.01 ms,
		// sent as it is: a gateway that divided by a rounded 1 ms would
		// believe the bucket refills 100 times slower than it does.
		{"denied, a wait far below 1 ms stays exact", "client-key-123", "", 0.999, 429, map[string]string{
			HeaderLimit: "200", HeaderRate: "100", HeaderRetryAfter: "1", HeaderRetryAfterMs: "0.010000000000000009",
			HeaderTokens: "0.999", HeaderReset: "2",
		}},
		// Short by 2 at 1/s.
		{"denied, exact seconds", "someone", "2", 0, 429, map[string]string{
			HeaderRetryAfter: "2", HeaderRetryAfterMs: "2000", HeaderReset: "10",
		}},
		// Short by 1.000001 at 1/s.
		{"denied, just over a second", "someone", "2", 0.999999, 429, map[string]string{
			HeaderRetryAfter: "2", HeaderRetryAfterMs: "1000.0010000000001", HeaderReset: "10",
		}},
		// A full bucket is full again now: no wait to tell, but Retry-After
		// is at least 1.
		{"never, full bucket", "someone", "11", 10, 429, map[string]string{
			HeaderNever: "true", HeaderRetryAfter: "1", HeaderRetryAfterMs: "", HeaderRemaining: "10", HeaderReset: "0",
			HeaderPlan: "free", HeaderRate: "1",
		}},
		{"never, bucket refilling", "someone", "11", 2.5, 429, map[string]string{
			HeaderNever: "true", HeaderRetryAfter: "8", HeaderRetryAfterMs: "", HeaderRemaining: "2", HeaderReset: "8",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newTestServer(t, planYAML, &fakeDecider{bucket: holding(tt.tokens)})
			headers := []string{HeaderKey, tt.key}
			if tt.cost != "" {
				headers = append(headers, HeaderCost, tt.cost)
			}
			r := do(s, "POST", "/v1/check", headers...)
			if r.StatusCode() != tt.status {
				t.Fatalf("status %d, want %d", r.StatusCode(), tt.status)
			}
			for name, want := range tt.want {
				if got := header(r, name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
				if want == "" && r.Header.Peek(name) != nil {
					t.Errorf("%s present, want absent", name)
				}
			}
		})
	}
}

func TestCheckPassesPlanAndDigest(t *testing.T) {
	d := &fakeDecider{}
	s, _, logs := newTestServer(t, planYAML, d)
	r := do(s, "POST", "/v1/check", HeaderKey, "client-key-123", HeaderCost, "7", HeaderRegion, "eu-west-1")
	if r.StatusCode() != 200 || header(r, HeaderPlan) != "pro" || header(r, HeaderLimit) != "200" {
		t.Fatalf("status %d plan %q limit %q", r.StatusCode(), header(r, HeaderPlan), header(r, HeaderLimit))
	}
	want := fakeCall{key: keys.New(nil).BucketKey([]byte("client-key-123")), limit: lua.Limit{Capacity: 200, Rate: 100}, cost: 7}
	if len(d.calls) != 1 || d.calls[0] != want {
		t.Fatalf("decider calls %+v, want [%+v]", d.calls, want)
	}
	// The debug log names the client by digest only.
	if strings.Contains(logs.String(), "client-key-123") || !strings.Contains(logs.String(), keys.LogID(want.key)) {
		t.Fatalf("log should name the client by digest, not key:\n%s", logs)
	}
}

// TestRateHeader: x-ratelimit-rate is the plan's rate in tokens per second,
// on 200 and 429 alike, in a form that parses back to the very same float64
// (gateways run a local bucket at that rate when the sidecar cannot answer).
func TestRateHeader(t *testing.T) {
	yaml := `
default_plan: free
plans:
  free:  {capacity: 10, rate: 1}
  slow:  {capacity: 5, rate: 0.001}
  third: {capacity: 3, rate: 0.3333333333333333}
  fast:  {capacity: 1000000000, rate: 1000000000}
  odd:   {capacity: 7, rate: 2.5e-5}
clients:
  "k-slow": slow
  "k-third": third
  "k-fast": fast
  "k-odd": odd
`
	for _, c := range []struct {
		key      string
		capacity float64
		rate     float64
		want     string
	}{
		{"someone", 10, 1, "1"},
		{"k-slow", 5, 0.001, "0.001"},
		{"k-third", 3, 0.3333333333333333, "0.3333333333333333"},
		{"k-fast", 1e9, 1e9, "1e+09"},
		{"k-odd", 7, 2.5e-5, "2.5e-05"},
	} {
		// Cost 1 on a full bucket, cost 1 on an empty one, and a cost
		// above the capacity (none is for the plan of MaxCost tokens).
		for _, a := range []struct {
			what   string
			tokens float64
			cost   int64
			status int
		}{
			{"allowed", c.capacity, 1, 200},
			{"denied", 0, 1, 429},
			{"never", c.capacity, int64(c.capacity) + 1, 429},
		} {
			if a.cost > MaxCost {
				continue
			}
			s, _, _ := newTestServer(t, yaml, &fakeDecider{bucket: holding(a.tokens)})
			r := do(s, "POST", "/v1/check", HeaderKey, c.key, HeaderCost, strconv.FormatInt(a.cost, 10))
			if r.StatusCode() != a.status || (r.Header.Peek(HeaderNever) != nil) != (a.what == "never") {
				t.Errorf("%s, %s: status %d, %s %q", c.key, a.what, r.StatusCode(), HeaderNever, header(r, HeaderNever))
			}
			got := header(r, HeaderRate)
			if got != c.want {
				t.Errorf("%s, %s: %s = %q, want %q", c.key, a.what, HeaderRate, got, c.want)
			}
			if f, err := strconv.ParseFloat(got, 64); err != nil || f != c.rate {
				t.Errorf("%s: %q parses to %v (%v), want exactly %v", c.key, got, f, err, c.rate)
			}
		}
	}
	// No decision, no rate.
	s, _, _ := newTestServer(t, yaml, &fakeDecider{err: errors.New("down")})
	if r := do(s, "POST", "/v1/check", HeaderKey, "someone"); r.StatusCode() != 503 || r.Header.Peek(HeaderRate) != nil {
		t.Errorf("503: %s %q present", HeaderRate, header(r, HeaderRate))
	}
}

func TestUnknownKey(t *testing.T) {
	noDefault := "plans:\n  pro: {capacity: 200, rate: 100}\nclients:\n  \"client-key-123\": pro\n"
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, noDefault, d)
	r := do(s, "POST", "/v1/check", HeaderKey, "stranger")
	if r.StatusCode() != 403 || string(r.Body()) != "unknown api key\n" {
		t.Fatalf("unknown key: %d %q, want 403", r.StatusCode(), r.Body())
	}
	if len(d.calls) != 0 || st.UnknownKeys.Get() != 1 {
		t.Fatalf("unknown key reached the decider (%d calls) or was not counted (%d)", len(d.calls), st.UnknownKeys.Get())
	}
	if r := do(s, "POST", "/v1/check", HeaderKey, "client-key-123"); r.StatusCode() != 200 {
		t.Fatalf("listed key: %d, want 200", r.StatusCode())
	}
}

// TestBadInput: every malformed check is a 400 with a short plain reason and
// never reaches Redis.
func TestBadInput(t *testing.T) {
	tests := []struct {
		name    string
		headers []string
		want    string
	}{
		{"no key", nil, "missing x-api-key header"},
		{"empty key", []string{HeaderKey, ""}, "empty api key"},
		{"key too long", []string{HeaderKey, strings.Repeat("k", 257)}, "api key longer than 256 bytes"},
		{"key with NUL", []string{HeaderKey, "a\x00b"}, "api key contains a control character"},
		{"key with tab", []string{HeaderKey, "a\tb"}, "api key contains a control character"},
		{"key with DEL", []string{HeaderKey, "ab\x7f"}, "api key contains a control character"},
		{"two keys", []string{HeaderKey, "a", HeaderKey, "b"}, "more than one x-api-key header"},
		{"cost empty", []string{HeaderKey, "a", HeaderCost, ""}, "x-ratelimit-cost must be a positive whole number"},
		{"cost word", []string{HeaderKey, "a", HeaderCost, "abc"}, "x-ratelimit-cost must be a positive whole number"},
		{"cost zero", []string{HeaderKey, "a", HeaderCost, "0"}, "x-ratelimit-cost must be at least 1"},
		{"cost negative", []string{HeaderKey, "a", HeaderCost, "-1"}, "x-ratelimit-cost must be a positive whole number"},
		{"cost plus sign", []string{HeaderKey, "a", HeaderCost, "+1"}, "x-ratelimit-cost must be a positive whole number"},
		{"cost fraction", []string{HeaderKey, "a", HeaderCost, "1.5"}, "x-ratelimit-cost must be a positive whole number"},
		{"cost exponent", []string{HeaderKey, "a", HeaderCost, "1e3"}, "x-ratelimit-cost must be a positive whole number"},
		{"cost huge", []string{HeaderKey, "a", HeaderCost, "1000000001"}, "x-ratelimit-cost must be at most 1000000000"},
		{"cost overflow", []string{HeaderKey, "a", HeaderCost, "99999999999999999999999"}, "x-ratelimit-cost must be at most 1000000000"},
		{"two costs", []string{HeaderKey, "a", HeaderCost, "1", HeaderCost, "2"}, "more than one x-ratelimit-cost header"},
		{"region with space", []string{HeaderKey, "a", HeaderRegion, "eu west"}, "x-ratelimit-region must be at most 64 characters of A-Z a-z 0-9 . _ -"},
		{"region too long", []string{HeaderKey, "a", HeaderRegion, strings.Repeat("r", 65)}, "x-ratelimit-region must be at most 64 characters of A-Z a-z 0-9 . _ -"},
		{"sent empty", []string{HeaderKey, "a", HeaderSent, ""}, "x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits"},
		{"sent negative", []string{HeaderKey, "a", HeaderSent, "-1"}, "x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits"},
		{"sent fraction", []string{HeaderKey, "a", HeaderSent, "1764806400000000.5"}, "x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits"},
		{"sent 18 digits", []string{HeaderKey, "a", HeaderSent, "100000000000000000"}, "x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits"},
		{"sent overflow", []string{HeaderKey, "a", HeaderSent, "9999999999999999999"}, "x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits"},
		{"sent 18 digits, a leading zero", []string{HeaderKey, "a", HeaderSent, "017648064000000000"}, "x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits"},
		{"two sents", []string{HeaderKey, "a", HeaderSent, "1", HeaderSent, "2"}, "more than one x-ratelimit-sent header"},
		{"two regions", []string{HeaderKey, "a", HeaderRegion, "eu", HeaderRegion, "us"}, "more than one x-ratelimit-region header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakeDecider{}
			s, st, _ := newTestServer(t, planYAML, d)
			r := do(s, "POST", "/v1/check", tt.headers...)
			if r.StatusCode() != 400 || string(r.Body()) != tt.want+"\n" {
				t.Fatalf("got %d %q, want 400 %q", r.StatusCode(), r.Body(), tt.want)
			}
			if ct := header(r, "Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if len(d.calls) != 0 || st.BadRequests.Get() != 1 {
				t.Errorf("bad request reached the decider (%d calls) or was not counted (%d)", len(d.calls), st.BadRequests.Get())
			}
		})
	}
}

func TestGoodInputEdges(t *testing.T) {
	tests := []struct {
		name    string
		headers []string
		cost    int64
		status  int // on a full bucket of the free plan (10 tokens)
	}{
		{"default cost", []string{HeaderKey, "a"}, 1, 200},
		{"max cost", []string{HeaderKey, "a", HeaderCost, "1000000000"}, 1_000_000_000, 429}, // above the capacity: never
		{"leading zeros", []string{HeaderKey, "a", HeaderCost, "007"}, 7, 200},
		{"256-byte key", []string{HeaderKey, strings.Repeat("k", 256)}, 1, 200},
		{"empty region", []string{HeaderKey, "a", HeaderRegion, ""}, 1, 200},
		{"unicode key", []string{HeaderKey, "clé-ünïcødé"}, 1, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakeDecider{}
			s, _, _ := newTestServer(t, planYAML, d)
			r := do(s, "POST", "/v1/check", tt.headers...)
			if r.StatusCode() != tt.status || len(d.calls) != 1 || d.calls[0].cost != tt.cost {
				t.Fatalf("got %d %q, calls %+v; want %d with cost %d", r.StatusCode(), r.Body(), d.calls, tt.status, tt.cost)
			}
		})
	}
}

func TestRedisFailures(t *testing.T) {
	tests := []struct {
		name     string
		d        *fakeDecider
		body     string
		timeouts uint64
		errs     uint64
	}{
		{"timeout", &fakeDecider{block: true}, "redis timeout\n", 1, 0},
		{"error", &fakeDecider{err: errors.New("dial tcp: connection refused")}, "redis unavailable\n", 0, 1},
		{"bad reply", &fakeDecider{err: errors.New("lua: unexpected reply")}, "redis unavailable\n", 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, st, logs := newTestServer(t, planYAML, tt.d)
			r := do(s, "POST", "/v1/check", HeaderKey, "client-key-123")
			if r.StatusCode() != 503 || string(r.Body()) != tt.body {
				t.Fatalf("got %d %q, want 503 %q", r.StatusCode(), r.Body(), tt.body)
			}
			if st.RedisTimeouts.Get() != tt.timeouts || st.RedisErrors.Get() != tt.errs || st.Errors.Get() != 1 {
				t.Fatalf("timeouts %d errors %d decisions{error} %d", st.RedisTimeouts.Get(), st.RedisErrors.Get(), st.Errors.Get())
			}
			if !strings.Contains(logs.String(), "decision failed") || strings.Contains(logs.String(), "client-key-123") {
				t.Fatalf("log should report the failure by digest:\n%s", logs)
			}
		})
	}
}

func TestEndpoints(t *testing.T) {
	tests := []struct {
		name, method, path string
		readyErr           error
		status             int
		body               string
	}{
		{"healthz", "GET", "/healthz", nil, 200, "ok\n"},
		{"healthz head", "HEAD", "/healthz", nil, 200, ""},
		{"readyz", "GET", "/readyz", nil, 200, "ready\n"},
		{"readyz down", "GET", "/readyz", errors.New("redis: connection refused"), 503, "not ready: redis: connection refused\n"},
		{"check GET", "GET", "/v1/check", nil, 405, "method not allowed\n"},
		{"warm GET", "GET", "/v1/warm", nil, 405, "method not allowed\n"},
		{"healthz POST", "POST", "/healthz", nil, 405, "method not allowed\n"},
		{"unknown path", "GET", "/nope", nil, 404, "not found\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newTestServer(t, planYAML, &fakeDecider{readyErr: tt.readyErr})
			r := do(s, tt.method, tt.path)
			if r.StatusCode() != tt.status || (tt.method != "HEAD" && string(r.Body()) != tt.body) {
				t.Fatalf("got %d %q, want %d %q", r.StatusCode(), r.Body(), tt.status, tt.body)
			}
		})
	}
	s, _, _ := newTestServer(t, planYAML, &fakeDecider{})
	do(s, "POST", "/v1/check", HeaderKey, "a")
	r := do(s, "GET", "/metrics")
	if !strings.Contains(string(r.Body()), `sidecar_decisions_total{result="allowed"} 1`) ||
		!strings.HasPrefix(header(r, "Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("metrics: %q\n%s", header(r, "Content-Type"), r.Body())
	}
}

// A warm-up (POST /v1/warm) is a peek (cost 0) at keys.WarmBucket under
// WarmLimit, answered as a check with the warm-up plan, and counted as a
// warm-up, not a decision.
func TestWarm(t *testing.T) {
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, planYAML, d)
	r := do(s, "POST", "/v1/warm")
	if r.StatusCode() != 200 || header(r, HeaderPlan) != "warm-up" || header(r, HeaderLimit) != "1" ||
		header(r, HeaderTokens) != "1" || header(r, HeaderRate) != "1" {
		t.Fatalf("got %d %s", r.StatusCode(), r.Header.String())
	}
	if want := []fakeCall{{keys.WarmBucket, WarmLimit, 0}}; len(d.calls) != 1 || d.calls[0] != want[0] {
		t.Fatalf("decider asked %+v, want %+v", d.calls, want)
	}
	if st.WarmUps.Get() != 1 || st.Allowed.Get()+st.Denied.Get()+st.Errors.Get() != 0 {
		t.Fatalf("warm-ups %d, decisions %d/%d/%d: want one warm-up and no decision",
			st.WarmUps.Get(), st.Allowed.Get(), st.Denied.Get(), st.Errors.Get())
	}

	s, st, _ = newTestServer(t, planYAML, &fakeDecider{err: errors.New("dial tcp: connection refused")})
	if r := do(s, "POST", "/v1/warm"); r.StatusCode() != 503 || string(r.Body()) != "redis unavailable\n" {
		t.Fatalf("Redis down: got %d %q, want 503", r.StatusCode(), r.Body())
	}
	if st.WarmUpErrors.Get() != 1 || st.Errors.Get() != 0 || st.RedisErrors.Get() != 0 {
		t.Fatalf("Redis down: warm-up errors %d, decision errors %d, Redis errors %d: want 1, 0, 0",
			st.WarmUpErrors.Get(), st.Errors.Get(), st.RedisErrors.Get())
	}
}

// TestServerLimits sends requests over a real (in-memory) connection so
// fasthttp's own limits apply: oversized headers and bodies are refused
// before the handler runs.
func TestServerLimits(t *testing.T) {
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, planYAML, d)
	ln := fasthttputil.NewInmemoryListener()
	srv := s.HTTPServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	client := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}

	tests := []struct {
		name   string
		setup  func(req *fasthttp.Request)
		status int
	}{
		{"normal", func(req *fasthttp.Request) {}, 200},
		{"huge header", func(req *fasthttp.Request) { req.Header.Set("x-padding", strings.Repeat("p", MaxHeaderBytes)) }, 431},
		{"huge body", func(req *fasthttp.Request) { req.SetBody(make([]byte, MaxBodyBytes+1)) }, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://sidecar/v1/check")
			req.Header.SetMethod("POST")
			req.Header.Set(HeaderKey, "client-key-123")
			tt.setup(req)
			if err := client.Do(req, resp); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode() != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode(), tt.status)
			}
		})
	}
	// The two refused before the handler are counted, the one it served not.
	if n := st.Unreadable.Get(); n != 2 {
		t.Errorf("unreadable requests counted %d, want 2 (the 431 and the 413)", n)
	}
}

// TestAdminListenerBoundsConnections holds connections open on the admin
// listener, as a client on the pod network can, each idle after one
// /healthz: the 17th from one address is refused with 429 and closed, a
// probe from another address is still answered, and past
// AdminMaxConcurrency in all a connection is refused with 503. The check
// listener has no per-address limit (the proxy beside it is one address).
// Each refusal is counted by its reason, and nothing else is: the 1,024
// answers to the probes are not refusals.
func TestAdminListenerBoundsConnections(t *testing.T) {
	s, st, _ := newTestServer(t, planYAML, &fakeDecider{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.AdminHTTPServer()
	go srv.Serve(s.AdminListener(ln))
	t.Cleanup(func() { srv.Shutdown() })
	addr := ln.Addr().(*net.TCPAddr)

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	// get opens a connection from 127.0.0.<from>, sends GET /healthz and
	// returns the status line it gets, keeping the connection open.
	get := func(from byte) string {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, from)}, Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: sidecar\r\n\r\n")); err != nil {
			return "write: " + err.Error()
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "read: " + err.Error()
		}
		return strings.TrimSpace(line)
	}

	for i := range AdminMaxConnsPerIP {
		if got := get(1); got != "HTTP/1.1 200 OK" {
			t.Fatalf("connection %d from 127.0.0.1: %q, want 200", i+1, got)
		}
	}
	if got := get(1); got != "HTTP/1.1 429 Too Many Requests" {
		t.Fatalf("connection %d from 127.0.0.1: %q, want 429", AdminMaxConnsPerIP+1, got)
	}
	// The refusal is counted before the 429 is written, so it is in the
	// counter once the client has read it.
	if n, m := st.RefusedAdminPerAddress.Get(), st.RefusedAdmin.Get(); n != 1 || m != 0 {
		t.Fatalf("refused per address %d, in all %d; want 1 and 0", n, m)
	}
	if got := get(2); got != "HTTP/1.1 200 OK" {
		t.Fatalf("a probe from 127.0.0.2 beside them: %q, want 200", got)
	}

	// Fill the listener from more addresses: 127.0.0.1 holds 16, 127.0.0.2
	// one, then 16 from each next address up to AdminMaxConcurrency.
	open := AdminMaxConnsPerIP + 1
	for from := byte(3); open < AdminMaxConcurrency; from++ {
		for i := 0; i < AdminMaxConnsPerIP && open < AdminMaxConcurrency; i++ {
			if got := get(from); got != "HTTP/1.1 200 OK" {
				t.Fatalf("connection %d (from 127.0.0.%d): %q, want 200", open+1, from, got)
			}
			open++
		}
	}
	if got := get(250); got != "HTTP/1.1 503 Service Unavailable" {
		t.Fatalf("connection %d: %q, want 503", AdminMaxConcurrency+1, got)
	}
	if n, m, c := st.RefusedAdminPerAddress.Get(), st.RefusedAdmin.Get(), st.RefusedCheck.Get(); n != 1 || m != 1 || c != 0 {
		t.Fatalf("refused per address %d, in all %d, on the check listener %d; want 1, 1 and 0", n, m, c)
	}
	var buf bytes.Buffer
	st.WritePrometheus(&buf)
	for _, want := range []string{
		`sidecar_connections_refused_total{listener="admin",reason="per_address"} 1`,
		`sidecar_connections_refused_total{listener="admin",reason="total"} 1`,
		`sidecar_connections_refused_total{listener="check",reason="total"} 0`,
	} {
		if !strings.Contains(buf.String(), want+"\n") {
			t.Errorf("/metrics has no line %q", want)
		}
	}
}

// TestAnswerDoesNotAllocate: the sidecar formats every answer on the stack.
func TestAnswerDoesNotAllocate(t *testing.T) {
	p := &plans.Plan{Name: "pro", Capacity: 200, Rate: 100, LimitHeader: "200"}
	res := lua.Result{Tokens: 0.999, RetryMs: 0.01, ResetMs: 1990.01}
	var sink int
	if n := testing.AllocsPerRun(100, func() {
		var a Answer
		a.Fill(res, p)
		for i := range a.Len() {
			_, v := a.Field(i)
			sink += len(v)
		}
	}); n != 0 {
		t.Errorf("Fill allocates %v times, want 0", n)
	}
}

// TestAnswerKeepsEveryDigit: the longest values an answer can carry, the
// two numbers in 'f' form at their longest (subnormals, 326 bytes each)
// beside a plan name of 64 bytes, come out whole and parse back to the
// script's float64.
func TestAnswerKeepsEveryDigit(t *testing.T) {
	p := &plans.Plan{Name: strings.Repeat("p", 64), Capacity: 200, Rate: 100, LimitHeader: "200"}
	res := lua.Result{Tokens: math.SmallestNonzeroFloat64, RetryMs: 2.2250738585072014e-308, ResetMs: 1990}
	var a Answer
	a.Fill(res, p)
	want := map[string]float64{HeaderTokens: res.Tokens, HeaderRetryAfterMs: res.RetryMs}
	for i := range a.Len() {
		name, v := a.Field(i)
		if w, ok := want[name]; ok {
			if got, err := strconv.ParseFloat(string(v), 64); err != nil || got != w {
				t.Errorf("%s: %d bytes %q parse to %v (%v), want %v", name, len(v), v, got, err, w)
			}
			delete(want, name)
		}
	}
	if len(want) != 0 {
		t.Errorf("no header for %v", want)
	}
}

// TestSetHeadersAsFasthttpNames: the names SetHeaders gives fasthttp ready
// made are the ones fasthttp makes of the plain names, so the answer on the
// wire is byte for byte what setting them by name writes.
func TestSetHeadersAsFasthttpNames(t *testing.T) {
	p := &plans.Plan{Name: "pro", Capacity: 200, Rate: 100, LimitHeader: "200"}
	for _, res := range []lua.Result{
		{Allowed: true, Tokens: 11.4, ResetMs: 1886},
		{Tokens: 0.999, RetryMs: 0.01, ResetMs: 1990.01},
		{Tokens: 200, Never: true},
	} {
		var a Answer
		a.Fill(res, p)
		var got, want fasthttp.ResponseHeader
		a.SetHeaders(&got)
		for i := range a.Len() {
			want.SetBytesV(a.Field(i))
		}
		if g, w := got.String(), want.String(); g != w {
			t.Errorf("%+v: SetHeaders wrote\n%s\nsetting by name writes\n%s", res, g, w)
		}
	}
}

// A check that waited unread (measured from x-ratelimit-sent against the
// quickest trip seen lately, so that the two clocks need not agree) for
// as long as its own deadline, Timeout, is answered 503 without a
// decision: the proxy has let its request through, or will have by the
// time an answer comes back, and a decision would take tokens for it.
// One that waited less is decided with its deadline from the read. The
// bounds below follow from the times the test can see: a call's own
// duration bounds how late the server read it.
func TestCheckTheProxyGaveUpOnIsNotDecided(t *testing.T) {
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, planYAML, d)
	timeout := s.o.Timeout
	sent := func(at time.Time) string { return strconv.FormatInt(at.UnixMicro(), 10) }

	// Without the header the deadline runs from the read: all of it.
	before := time.Now()
	if r := do(s, "POST", "/v1/check", HeaderKey, "a"); r.StatusCode() != 200 {
		t.Fatalf("status %d", r.StatusCode())
	}
	if left, took := d.left[0], time.Since(before); left > timeout || left < timeout-took {
		t.Errorf("no x-ratelimit-sent: %v left of the deadline, want %v less at most the call's %v", left, timeout, took)
	}

	// The first check sent now sets the quickest trip: at most its call's
	// duration, first.
	before = time.Now()
	if r := do(s, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(before)); r.StatusCode() != 200 {
		t.Fatalf("status %d", r.StatusCode())
	}
	first := time.Since(before)

	// One that says it was sent 3 ms before it was, well inside the
	// sidecar's deadline (the test server's is 20 ms): decided, with all of its
	// deadline from the read.
	before = time.Now()
	if r := do(s, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(before.Add(-3*time.Millisecond))); r.StatusCode() != 200 {
		t.Fatalf("status %d", r.StatusCode())
	}
	if left, took := d.left[2], time.Since(before); left > timeout || left < timeout-took {
		t.Errorf("sent 3 ms earlier: %v left of the deadline, want %v less at most the call's %v", left, timeout, took)
	}

	// One that waited past its own deadline before it was read, by 100 µs
	// beyond what the quickest trip can be off by: no time is left to
	// decide it in before the proxy's wait ends. No decision, no tokens.
	r := do(s, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(time.Now().Add(-(timeout + first + 100*time.Microsecond))))
	if r.StatusCode() != 503 || string(r.Body()) != "expired before it was read\n" {
		t.Errorf("sent its deadline ago: %d %q, want 503 expired", r.StatusCode(), r.Body())
	}
	// One sent a second before it was read: the proxy gave up on it long
	// ago.
	r = do(s, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(time.Now().Add(-time.Second)))
	if r.StatusCode() != 503 || string(r.Body()) != "expired before it was read\n" {
		t.Errorf("sent a second ago: %d %q, want 503 expired", r.StatusCode(), r.Body())
	}
	if len(d.calls) != 3 || st.Expired.Get() != 2 || st.Errors.Get() != 2 {
		t.Errorf("%d decisions, %d expired, %d errors; want 3, 2, 2", len(d.calls), st.Expired.Get(), st.Errors.Get())
	}

	if n := st.ClockOff.Get(); n != 0 {
		t.Errorf("%d checks counted from a clock off, want 0", n)
	}
	// A clock an hour off is not a queue: the check keeps the sidecar's
	// own deadline, and is counted as from a clock off.
	before = time.Now()
	if r := do(s, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(time.Now().Add(-time.Hour))); r.StatusCode() != 200 {
		t.Fatalf("an hour off: status %d", r.StatusCode())
	}
	if left, took := d.left[3], time.Since(before); left > timeout || left < timeout-took {
		t.Errorf("an hour off: %v left of the deadline, want %v less at most the call's %v", left, timeout, took)
	}
	if n := st.ClockOff.Get(); n != 1 {
		t.Errorf("%d checks counted from a clock off, want 1 (the one an hour off)", n)
	}

	// sidecar_check_wait_seconds has the four checks whose wait could be
	// told: not the one without the header, nor the one from a clock an
	// hour off. A wait is the check's lag less the least lag, which is at
	// most the first check's call (first), so the one sent a second early
	// waited at least 1 s - first, past the last finite bound (0.1 s), and
	// the expired one at least timeout + 100 µs.
	var page bytes.Buffer
	st.WritePrometheus(&page)
	m, err := testkit.ParseMetrics(&page)
	if err != nil {
		t.Fatal(err)
	}
	const wait = "sidecar_check_wait_seconds"
	count, sum, finite := m[wait+"_count"], m[wait+"_sum"], m[wait+`_bucket{le="0.1"}`]
	if count != 4 || count-finite < 1 {
		t.Errorf("%s: %v checks, %v of them within 0.1 s; want 4, 3 at most", wait, count, finite)
	}
	if least := (time.Second + timeout - first).Seconds(); sum < least {
		t.Errorf("%s: the waits add up to %v s, want at least %v", wait, sum, least)
	}
}

// Proxies on two hosts whose clocks differ by far more than the proxy's
// wait share a sidecar: each proxy's checks are measured against its own
// quickest trip, so neither's are refused for the other's clock, and a
// check one of them sent long ago is still known.
func TestProxiesWithClocksOfTheirOwn(t *testing.T) {
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, planYAML, d)
	sent := func(skew time.Duration) string { return strconv.FormatInt(time.Now().Add(skew).UnixMicro(), 10) }
	ahead, behind := net.ParseIP("10.0.0.1"), net.ParseIP("10.0.0.2")
	// The first proxy's clock is 50 ms ahead of the sidecar's, the
	// second's 50 ms behind: 100 ms apart, 20 times the proxy's wait.
	const skew = 50 * time.Millisecond
	for i := range 3 {
		for _, p := range []struct {
			ip   net.IP
			skew time.Duration
		}{{ahead, skew}, {behind, -skew}} {
			if r := doFrom(s, p.ip, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(p.skew)); r.StatusCode() != 200 {
				t.Fatalf("check %d from %v (clock %v off): %d %q, want 200", i, p.ip, p.skew, r.StatusCode(), r.Body())
			}
		}
	}
	// The same proxy behind, as an IPv4-mapped IPv6 address: the same
	// peer, and a check it sent a second before the read has expired.
	r := doFrom(s, behind.To16(), "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(-skew-time.Second))
	if r.StatusCode() != 503 || st.Expired.Get() != 1 || len(d.calls) != 6 {
		t.Errorf("sent a second ago: %d %q, %d expired, %d decisions; want 503, 1, 6", r.StatusCode(), r.Body(), st.Expired.Get(), len(d.calls))
	}
}

// A request from the sidecar's own host that claims to have been sent
// after it was read is no trip: the two clocks there are one. It does not
// become the quickest trip from its address, so one call from another
// process beside the proxy, claiming a clock 50 s ahead, does not have
// the proxy's checks read as having waited 50 s and answered 503; a
// check that did wait its deadline is still refused. From another host,
// whose clock may be ahead, such a lag is taken
// (TestProxiesWithClocksOfTheirOwn).
func TestCheckFromThisHostSentInTheFutureIsNoTrip(t *testing.T) {
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, planYAML, d)
	sent := func(ago time.Duration) string { return strconv.FormatInt(time.Now().Add(-ago).UnixMicro(), 10) }
	for _, ip := range []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback} {
		start := time.Now()
		if r := doFrom(s, ip, "POST", "/v1/warm", HeaderSent, sent(0)); r.StatusCode() != 200 {
			t.Fatalf("%v: the proxy's warm-up: %d %q, want 200", ip, r.StatusCode(), r.Body())
		}
		roundTrip := time.Since(start)
		for _, path := range []string{"/v1/warm", "/v1/check"} {
			if r := doFrom(s, ip, "POST", path, HeaderKey, "x", HeaderSent, sent(-50*time.Second)); r.StatusCode() != 200 {
				t.Fatalf("%v: %s claiming a clock 50 s ahead: %d %q, want 200", ip, path, r.StatusCode(), r.Body())
			}
		}
		if r := doFrom(s, ip, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(0)); r.StatusCode() != 200 {
			t.Errorf("%v: the proxy's check after them: %d %q, want 200", ip, r.StatusCode(), r.Body())
		}
		// Sent the deadline, the warm-up's round trip (which bounds the
		// quickest trip it set) and a millisecond before it is read: it
		// waited past its deadline.
		late := s.o.Timeout + roundTrip + time.Millisecond
		if r := doFrom(s, ip, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(late)); r.StatusCode() != 503 {
			t.Errorf("%v: a check that waited its deadline: %d %q, want 503", ip, r.StatusCode(), r.Body())
		}
	}
	if st.Expired.Get() != 2 {
		t.Errorf("%d checks expired, want 2 (the late one from each address)", st.Expired.Get())
	}
}

// A warm-up call carries the proxy's clock as a check does, and teaches the
// sidecar the quickest trip from that proxy: a proxy's first check after
// it, late by more than its deadline, is known to be late. Without the
// warm-up that check is the first the sidecar hears from the proxy, its
// lag the least seen, and it is decided.
func TestWarmUpsTeachTheQuickestTrip(t *testing.T) {
	d := &fakeDecider{}
	s, st, _ := newTestServer(t, planYAML, d)
	sent := func(ago time.Duration) string { return strconv.FormatInt(time.Now().Add(-ago).UnixMicro(), 10) }
	warmed, cold := net.ParseIP("10.0.0.1"), net.ParseIP("10.0.0.2")
	start := time.Now()
	if r := doFrom(s, warmed, "POST", "/v1/warm", HeaderSent, sent(0)); r.StatusCode() != 200 {
		t.Fatalf("warm-up: %d %q, want 200", r.StatusCode(), r.Body())
	}
	// The warm-up's lag, now the quickest trip from that address, is at
	// most its round trip (the clock was read after start, the request
	// before the answer), which a loaded machine can stretch past a
	// millisecond. A check sent the sidecar's deadline, that round trip
	// and a millisecond more before it is read has waited a millisecond
	// past its deadline by the sidecar's measure, whatever the load.
	late := s.o.Timeout + time.Since(start) + time.Millisecond
	if r := doFrom(s, warmed, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(late)); r.StatusCode() != 503 || st.Expired.Get() != 1 {
		t.Errorf("late check after a warm-up: %d %q, %d expired; want 503, 1", r.StatusCode(), r.Body(), st.Expired.Get())
	}
	if r := doFrom(s, cold, "POST", "/v1/check", HeaderKey, "a", HeaderSent, sent(late)); r.StatusCode() != 200 {
		t.Errorf("late check as a proxy's first word: %d %q, want 200 (nothing to tell it late by)", r.StatusCode(), r.Body())
	}
	if len(d.calls) != 2 { // the warm-up's peek and the cold proxy's check
		t.Errorf("%d decisions, want 2", len(d.calls))
	}
	// A warm-up's clock is read as a check's: malformed or repeated, 400.
	for _, h := range [][]string{{HeaderSent, "soon"}, {HeaderSent, sent(0), HeaderSent, sent(0)}} {
		if r := doFrom(s, warmed, "POST", "/v1/warm", h...); r.StatusCode() != 400 {
			t.Errorf("warm-up with %q: %d %q, want 400", h, r.StatusCode(), r.Body())
		}
	}
}

// peerLags tells addresses apart, drops a peer two windows quiet, and
// tracks at most maxPeers live ones, allocating nothing for the checks of
// one past them.
func TestPeerLags(t *testing.T) {
	var p peerLags
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	a, b := net.ParseIP("192.0.2.1"), net.ParseIP("2001:db8::1")
	if la, lb := p.of(a, now), p.of(b, now); la == nil || lb == nil || la == lb {
		t.Fatalf("two addresses: %p and %p, want two sendLags", la, lb)
	}
	if p.of(a, now) != p.of(a.To16(), now) {
		t.Error("an IPv4 address and its IPv6-mapped form are two peers")
	}
	if p.of(nil, now) != p.of(nil, now) || p.of(nil, now) == nil {
		t.Error("a request from no IP address has no peer, or a new one each time")
	}
	// a and the zero address keep checking; b goes quiet for two windows
	// and is dropped when a new peer comes.
	la := p.of(a, now)
	later := now.Add(2 * lagWindow)
	la.waited(later, later.UnixMicro())
	p.of(nil, later).waited(later, later.UnixMicro())
	for i := range maxPeers - 2 {
		ip := net.IPv4(198, 51, 100, byte(i))
		if p.of(ip, later) == nil {
			t.Fatalf("peer %d of %d: not tracked", i+3, maxPeers)
		}
	}
	if n := len(*p.list.Load()); n != maxPeers {
		t.Errorf("%d peers tracked, want %d (b dropped)", n, maxPeers)
	}
	if p.of(a, later) != la {
		t.Error("a live peer lost its sendLag")
	}
	past := net.IPv4(203, 0, 113, 1)
	if l := p.of(past, later); l != nil {
		t.Errorf("a peer past %d live ones: %p, want none", maxPeers, l)
	}
	if n := testing.AllocsPerRun(10, func() { p.of(past, later) }); n != 0 {
		t.Errorf("a check from a peer past them allocates %v times", n)
	}
}

// sendLag measures each check's wait against the least lag of the last
// two windows, whatever the two clocks differ by, and forgets a least lag
// two windows old.
func TestSendLag(t *testing.T) {
	l := newSendLag()
	base := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	// The proxy's clock is 2 s behind the sidecar's.
	skew := 2 * time.Second
	sentAt := func(at time.Time) int64 { return at.Add(-skew).UnixMicro() }
	read := func(sent time.Time, wait time.Duration) time.Duration {
		d, ok := l.waited(sent.Add(wait), sentAt(sent))
		if !ok {
			t.Errorf("a check %v after the send, 2 s of skew: not measured", wait)
		}
		return d
	}
	t0 := base
	if got := read(t0, 100*time.Microsecond); got != 0 {
		t.Errorf("first check: waited %v, want 0 (nothing seen before)", got)
	}
	if got := read(t0.Add(time.Millisecond), 100*time.Microsecond+5*time.Millisecond); got != 5*time.Millisecond {
		t.Errorf("a check read 5 ms later than the quickest: waited %v", got)
	}
	if got := read(t0.Add(2*time.Millisecond), 40*time.Microsecond); got != 0 {
		t.Errorf("a quicker trip: waited %v, want 0", got)
	}
	if got := read(t0.Add(3*time.Millisecond), 140*time.Microsecond); got != 100*time.Microsecond {
		t.Errorf("after a quicker trip: waited %v, want 100µs", got)
	}
	// Next window: the least lag of the one before still counts.
	t1 := base.Add(lagWindow)
	if got := read(t1, 1040*time.Microsecond); got != time.Millisecond {
		t.Errorf("next window: waited %v, want 1ms", got)
	}
	// Two windows on, the 40µs trip is forgotten: the clocks may have moved.
	t2 := base.Add(2 * lagWindow)
	if got := read(t2, 1040*time.Microsecond); got != 0 {
		t.Errorf("two windows on: waited %v, want 0 (the old least lag forgotten)", got)
	}
	// A clock more than maxLag off tells no wait, and leaves the least
	// lag alone.
	for _, off := range []time.Duration{2 * time.Minute, -2 * time.Minute} {
		if d, ok := l.waited(t2, sentAt(t2.Add(-off))); ok || d != 0 {
			t.Errorf("a proxy clock %v off: waited %v, measured %v; want 0, false", off, d, ok)
		}
	}
	if got := read(t2.Add(time.Millisecond), 1140*time.Microsecond); got != 100*time.Microsecond {
		t.Errorf("after a clock too far off: waited %v, want 100µs", got)
	}
}
