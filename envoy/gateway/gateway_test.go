package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/filterwasm"
	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/gotool"
	"github.com/edgelimit/edgelimit/internal/syncbuf"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	// The gateway runs inside this binary here: its -nice would lower the
	// priority of every test beside it. The system tests check the
	// niceness of build/gateway (e2e TestGatewayRunsNiced).
	renice = func(int, bool) error { return nil }
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// modules builds filter.wasm and the host's probe module once.
func modules(t testing.TB) (filter, probe string) {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "gateway-test-")
		if buildErr != nil {
			return
		}
		root, _ := filepath.Abs(filepath.Join("..", ".."))
		if _, buildErr = filterwasm.Build(root, buildDir); buildErr != nil {
			return
		}
		buildErr = gotool.GoBuildWasm(context.Background(), filepath.Join("..", "wasmhost", "testdata", "probe"), ".", filepath.Join(buildDir, "probe.wasm"))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "filter.wasm"), filepath.Join(buildDir, "probe.wasm")
}

// service is a demo upstream that counts and records what reaches it.
type service struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	last http.Header
}

func newService(t testing.TB, name string, delay time.Duration) *service {
	s := &service{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.mu.Lock()
		s.last = r.Header.Clone()
		s.last.Set("host", r.Host)
		s.mu.Unlock()
		time.Sleep(delay)
		w.Header().Set("x-service", name)
		io.WriteString(w, name+" "+r.URL.Path)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *service) header(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last.Get(name)
}

// sidecar answers checks by key: "deny..." is over its limit, "slow..."
// answers after 100 ms, anything else is allowed.
func newSidecar(t testing.TB) *httptest.Server {
	s := httptest.NewServer(sidecarHandler(answerCheck))
	t.Cleanup(s.Close)
	return s
}

// answerCheck is newSidecar's answer to a check.
func answerCheck(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("x-api-key")
	// Plan free: 10 tokens, 0.32/s. A denied client holds 0.2 tokens (its
	// next token is 2.5 s away), an allowed one 10.5 before paying 1.
	tokens := 10.5
	switch {
	case strings.HasPrefix(key, "deny"):
		tokens = 0.2
	case strings.HasPrefix(key, "slow"):
		time.Sleep(100 * time.Millisecond)
	}
	writeAnswer(w, filtertest.SidecarAnswer("free", 10, 0.32, min(tokens, 10), 1))
}

// sidecarHandler answers POST /v1/warm as the sidecar does (the filter's
// warm-up calls), and hands everything else, the checks, to check.
func sidecarHandler(check http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/warm" {
			writeAnswer(w, filtertest.WarmAnswer())
			return
		}
		check(w, r)
	})
}

// writeAnswer writes a sidecar answer made by the sidecar's own code.
func writeAnswer(w http.ResponseWriter, h []filtertest.Header) {
	status := http.StatusOK
	for _, kv := range h {
		switch kv[0] {
		case ":status":
			status, _ = strconv.Atoi(kv[1])
		case "content-length":
		default:
			w.Header().Set(kv[0], kv[1])
		}
	}
	w.WriteHeader(status)
}

type running struct {
	addr, admin string
	stats       string // the stats listener
	stderr      *syncbuf.Buffer
	stop        func() error
}

// start runs the gateway in this process on free ports (its listener, the
// stats listener and the admin); it is stopped (as by SIGTERM) at cleanup.
func start(t *testing.T, args ...string) *running {
	t.Helper()
	return startArgs(t, append([]string{"-listen", "127.0.0.1:0", "-listener", "stats=127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...)...)
}

// startArgs runs the gateway in this process with exactly args.
func startArgs(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan addrs, 1)
	errc := make(chan error, 1)
	stderr := &syncbuf.Buffer{}
	go func() { errc <- run(ctx, args, io.Discard, stderr, ready) }()
	select {
	case a := <-ready:
		var once sync.Once
		var stopErr error
		stop := func() error {
			once.Do(func() {
				cancel()
				stopErr = <-errc
			})
			return stopErr
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("gateway stopped with %v", err)
			}
		})
		return &running{addr: a.listener, admin: a.admin, stats: a.others["stats"], stderr: stderr, stop: stop}
	case err := <-errc:
		cancel()
		t.Fatalf("gateway did not start: %v\n%s", err, stderr.String())
	}
	return nil
}

func stat(t *testing.T, admin, name string) int64 {
	t.Helper()
	_, body := testkit.Get(t, "http://"+admin+"/stats")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// failedOpen is the requests the filter let through undecided, its
// failed_open counters of every reason summed, from the admin's /stats.
func failedOpen(t *testing.T, admin string) int64 {
	t.Helper()
	_, body := testkit.Get(t, "http://"+admin+"/stats")
	var sum int64
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "wasmcustom.edgelimit.requests.failed_open.") {
			n, _ := strconv.ParseInt(line[strings.LastIndex(line, " ")+1:], 10, 64)
			sum += n
		}
	}
	return sum
}

// sendDecided calls send, which sends one request through the gateway,
// until the filter decides it: a request whose callout missed the shipped
// 5 ms goes on undecided, as the design allows on a busy machine (the
// filter counts it failed open), and is sent again, three times at most,
// as decidedFirst does.
func sendDecided(t *testing.T, admin string, send func()) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		open := failedOpen(t, admin)
		send()
		if failedOpen(t, admin) == open {
			return
		}
		if attempt == 3 {
			t.Fatal("three requests in a row failed open")
		}
		t.Logf("request %d failed open (its callout missed the 5 ms); sent again", attempt)
	}
}

const envoyYAML = "../../envoy/envoy.yaml"

// shippedWith writes envoy.yaml with old replaced by new (once) to a
// temporary file and returns its path; the test says why it changes it.
func shippedWith(t *testing.T, old, new string) string {
	t.Helper()
	yaml, err := os.ReadFile(envoyYAML)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(yaml), old) {
		t.Fatalf("envoy.yaml has no %q", old)
	}
	cfg := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(yaml), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startProbe starts the gateway on cfg with the probe module, one worker,
// orders as the service and nothing behind the other clusters. The probe
// imports fmt and os, so its runtime polls at every garbage collection and
// ENOSYS (the default) would kill it before a panic a test asks for: it runs
// as the Envoy with the WASI update.
func startProbe(t *testing.T, cfg, probe string, orders *httptest.Server) *running {
	t.Helper()
	return start(t, "-config", cfg, "-wasm", probe, "-concurrency", "1", "-poll-oneoff", "noevents",
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+testkit.RefusedAddr(t), "-cluster", "ratelimit_sidecar="+testkit.RefusedAddr(t))
}

// decidedFirst sends requests of a client of its own to url, through the
// gateway, until the filter decides one (the fake sidecar's rate-limit
// headers on the answer), three at most. A fresh gateway's first callout
// is each process's first pass over the check path: with the race detector
// and other packages' tests on the machine it can miss the 5 ms and fail
// open, as the design allows (RATIONALE.md, "What does a fresh stack's
// first burst cost?"). A test that needs the decision of its first request
// calls this before it; the one decided request counts as allowed.
func decidedFirst(t *testing.T, url string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		resp, _ := testkit.Get(t, url, "x-api-key", "warm-up")
		if resp.Header.Get("ratelimit-limit") != "" {
			return
		}
		if attempt == 3 {
			t.Fatalf("three requests in a row failed open (status %d, no rate-limit headers)", resp.StatusCode)
		}
	}
}

func TestGatewayWithTheFilter(t *testing.T) {
	filter, _ := modules(t)
	orders, billing := newService(t, "orders", 0), newService(t, "billing", 0)
	sidecar := newSidecar(t)
	g := start(t, "-config", envoyYAML, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+billing.Listener.Addr().String(),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	base := "http://" + g.addr
	// The cases below need decisions from the first on.
	decidedFirst(t, base+"/orders/0")

	cases := []struct {
		name       string
		path, key  string
		wantStatus int
		wantBody   string
		wantHeader [2]string
	}{
		{"allowed", "/orders/1", "alice", 200, "orders /orders/1", [2]string{"ratelimit-limit", "10"}},
		{"second service", "/billing/7", "alice", 200, "billing /billing/7", [2]string{"x-service", "billing"}},
		{"path normalised before routing", "/billing/../orders//2", "alice", 200, "orders /orders/2", [2]string{"server", "envoy"}},
		{"denied", "/orders/1", "deny-bob", 429, "", [2]string{"retry-after", "3"}},
		{"no key", "/orders/1", "", 401, "", [2]string{"www-authenticate", "Bearer"}},
		{"slow sidecar fails open after timeout_ms", "/orders/3", "slow-carol", 200, "orders /orders/3", [2]string{"x-service", "orders"}},
		{"no route", "/elsewhere", "alice", 404, "", [2]string{"server", "envoy"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hdrs []string
			if c.key != "" {
				hdrs = []string{"x-api-key", c.key}
			}
			var before int64
			var resp *http.Response
			var body string
			send := func() {
				before = orders.hits.Load()
				resp, body = testkit.Get(t, base+c.path, hdrs...)
			}
			// A case the fake sidecar decides (its key is not one it
			// answers slowly, and it has one) is about that decision.
			if c.key != "" && !strings.HasPrefix(c.key, "slow-") {
				sendDecided(t, g.admin, send)
			} else {
				send()
			}
			if resp.StatusCode != c.wantStatus {
				t.Fatalf("status %d, want %d; body %q", resp.StatusCode, c.wantStatus, body)
			}
			if c.wantBody != "" && body != c.wantBody {
				t.Errorf("body %q, want %q", body, c.wantBody)
			}
			if c.wantStatus == 429 {
				var p struct {
					Type       string `json:"type"`
					Status     int    `json:"status"`
					RetryAfter int    `json:"retry_after"`
				}
				if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 429 || p.RetryAfter != 3 ||
					p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" {
					t.Errorf("429 body %q: want the quota-exceeded problem with retry_after 3 (%v)", body, err)
				}
			}
			if got := resp.Header.Get(c.wantHeader[0]); got != c.wantHeader[1] {
				t.Errorf("header %s = %q, want %q", c.wantHeader[0], got, c.wantHeader[1])
			}
			if c.wantStatus != 200 && orders.hits.Load() != before {
				t.Error("a request that was not admitted reached the service")
			}
		})
	}
	// Two authorization lines reach the filter as one value joined by ","
	// (an inline header in Envoy), which holds no single key.
	resp, body := testkit.Get(t, base+"/orders/1", "authorization", "Bearer alice", "authorization", "Bearer bob")
	if resp.StatusCode != 401 || !strings.Contains(body, "invalid_api_key") {
		t.Errorf("two authorization headers: %d %q, want 401 invalid_api_key", resp.StatusCode, body)
	}
	// A gRPC call's local reply is the trailers-only response Envoy makes
	// of it: the router's 404 (no route, no body) is a 200 with
	// content-type application/grpc and grpc-status 12, UNIMPLEMENTED.
	resp, body = testkit.Get(t, base+"/elsewhere.v1.Svc/Get", "x-api-key", "alice", "content-type", "application/grpc")
	if resp.StatusCode != 200 || body != "" || resp.Header.Get("content-type") != "application/grpc" ||
		resp.Header.Get("grpc-status") != "12" || resp.Header.Get("grpc-message") != "" {
		t.Errorf("gRPC call with no route: %d %v %q, want 200 with grpc-status 12 and no body", resp.StatusCode, resp.Header, body)
	}
	// What the service saw of an admitted request.
	testkit.Get(t, base+"/orders/9?x=1", "x-api-key", "alice", limiter.ShadowHeader, "forged")
	if orders.header("x-request-id") == "" || orders.header("x-forwarded-for") != "127.0.0.1" ||
		orders.header("x-api-key") != "alice" || orders.header(limiter.ShadowHeader) != "" {
		t.Errorf("upstream request headers: %v", orders.last)
	}
	if n := stat(t, g.admin, "wasmcustom.edgelimit.requests.allowed"); n < 3 {
		t.Errorf("allowed counter %d, want >= 3", n)
	}
	if n := stat(t, g.admin, "wasmcustom.edgelimit.requests.denied"); n != 1 {
		t.Errorf("denied counter %d, want 1", n)
	}
	if n := stat(t, g.admin, "http.edge.downstream_rq_total"); n < int64(len(cases)) {
		t.Errorf("downstream_rq_total %d", n)
	}
	if n := stat(t, g.admin, "cluster.ratelimit_sidecar.upstream_rq_total"); n < 5 {
		t.Errorf("sidecar callouts counted: %d", n)
	}
	if resp, _ := testkit.Get(t, "http://"+g.admin+"/ready"); resp.StatusCode != 200 {
		t.Errorf("/ready %d", resp.StatusCode)
	}
	// The plugin's metrics in Envoy's Prometheus form: the request
	// counters one family labelled by envoy.yaml's stats_tags, the callout
	// latency in the buckets its stats_config gives it (every callout so
	// far, the slow one included, is in the +Inf bucket's count).
	_, prom := testkit.Get(t, "http://"+g.admin+"/stats/prometheus")
	for _, want := range []string{
		"# TYPE edgelimit_requests counter\n",
		"# TYPE edgelimit_callout_latency_us histogram\n",
		`edgelimit_callout_latency_us_bucket{le="4500"} `,
		`edgelimit_callout_latency_us_bucket{le="5000"} `,
	} {
		if !strings.Contains(prom, want) {
			t.Errorf("/stats/prometheus lacks %q:\n%s", want, prom)
		}
	}
	m, err := testkit.ParseMetrics(strings.NewReader(prom))
	if err != nil {
		t.Fatalf("/stats/prometheus: %v\n%s", err, prom)
	}
	if n := m[`edgelimit_requests{decision="allowed"}`]; n < 3 {
		t.Errorf(`edgelimit_requests{decision="allowed"} = %v, want >= 3`, n)
	}
	if n := m[`edgelimit_requests{decision="denied"}`]; n != 1 {
		t.Errorf(`edgelimit_requests{decision="denied"} = %v, want 1`, n)
	}
	if n, ok := m[`edgelimit_requests{decision="failed_open",reason="timeout"}`]; !ok || n < 1 {
		t.Errorf(`edgelimit_requests{decision="failed_open",reason="timeout"} = %v (%t), want >= 1`, n, ok)
	}
	count, inf := m["edgelimit_callout_latency_us_count"], m[`edgelimit_callout_latency_us_bucket{le="+Inf"}`]
	if count < 5 || inf != count {
		t.Errorf("callout latency: count %v, +Inf bucket %v; want the same, at least the 5 callouts made", count, inf)
	}
}

func TestGatewayUpstreamFailures(t *testing.T) {
	filter, _ := modules(t)
	billing := newService(t, "billing", 0)
	g := start(t, "-config", envoyYAML, "-wasm", filter, "-concurrency", "1",
		"-cluster", "orders="+testkit.RefusedAddr(t),
		"-cluster", "billing="+billing.Listener.Addr().String(),
		"-cluster", "ratelimit_sidecar="+testkit.RefusedAddr(t))
	resp, body := testkit.Get(t, "http://"+g.addr+"/orders/1", "x-api-key", "alice")
	if resp.StatusCode != 503 || !strings.HasPrefix(body, "upstream connect error or disconnect/reset before headers") {
		t.Errorf("service down: %d %q", resp.StatusCode, body)
	}
	// The sidecar is down: its connect failure is a 503 to the filter,
	// which fails open.
	resp, body = testkit.Get(t, "http://"+g.addr+"/billing/1", "x-api-key", "alice")
	if resp.StatusCode != 200 || body != "billing /billing/1" {
		t.Errorf("sidecar down: %d %q", resp.StatusCode, body)
	}
	if n := failedOpen(t, g.admin); n != 2 {
		_, stats := testkit.Get(t, "http://"+g.admin+"/stats")
		t.Errorf("failed-open counters sum to %d, want 2:\n%s", n, stats)
	}
}

// TestAdminStatsFilter: /stats?filter= keeps only the statistics whose
// names the regular expression matches, as Envoy's admin does, so that
// envoy/README.md's `curl '…:9901/stats?filter=wasmcustom'` shows the
// filter's metrics alone under build/gateway too; a filter that is no
// regular expression is a 400.
func TestAdminStatsFilter(t *testing.T) {
	filter, _ := modules(t)
	billing := newService(t, "billing", 0)
	g := start(t, "-config", envoyYAML, "-wasm", filter, "-concurrency", "1",
		"-cluster", "billing="+billing.Listener.Addr().String(),
		"-cluster", "ratelimit_sidecar="+testkit.RefusedAddr(t))
	// One request, so that the gateway's own counters (cluster.*, http.*)
	// exist beside the filter's.
	testkit.Get(t, "http://"+g.addr+"/billing/1", "x-api-key", "alice")
	_, all := testkit.Get(t, "http://"+g.admin+"/stats")
	for _, c := range []struct {
		filter string
		want   func(name string) bool
	}{
		{"wasmcustom", func(n string) bool { return strings.Contains(n, "wasmcustom") }},
		{`^cluster\.billing\.`, func(n string) bool { return strings.HasPrefix(n, "cluster.billing.") }},
	} {
		resp, body := testkit.Get(t, "http://"+g.admin+"/stats?filter="+url.QueryEscape(c.filter))
		if resp.StatusCode != 200 {
			t.Errorf("filter=%s: status %d: %s", c.filter, resp.StatusCode, body)
			continue
		}
		var want []string
		for _, line := range strings.SplitAfter(all, "\n") {
			if name, _, _ := strings.Cut(line, ": "); line != "" && c.want(name) {
				want = append(want, line)
			}
		}
		if len(want) == 0 || len(want) == strings.Count(all, "\n") {
			t.Fatalf("filter=%s: %d of the %d statistics match; the case tests nothing:\n%s", c.filter, len(want), strings.Count(all, "\n"), all)
		}
		if body != strings.Join(want, "") {
			t.Errorf("filter=%s: got\n%s\nwant the %d matching lines\n%s", c.filter, body, len(want), strings.Join(want, ""))
		}
	}
	if resp, body := testkit.Get(t, "http://"+g.admin+"/stats?filter=%28"); resp.StatusCode != 400 {
		t.Errorf("filter=(: status %d, want 400: %s", resp.StatusCode, body)
	}
}

func TestGatewayFailedVM(t *testing.T) {
	_, probe := modules(t)
	for _, failOpen := range []bool{false, true} {
		t.Run("fail_open="+strconv.FormatBool(failOpen), func(t *testing.T) {
			// The failure policy is what this test is about.
			cfg := shippedWith(t, "fail_open: true", "fail_open: "+strconv.FormatBool(failOpen))
			orders := newService(t, "orders", 0)
			g := startProbe(t, cfg, probe, orders.Server)
			if resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1"); resp.StatusCode != 200 {
				t.Fatalf("before the failure: %d", resp.StatusCode)
			}
			want := 503
			if failOpen {
				want = 200
			}
			for i, h := range [][]string{{"x-probe-panic", "now"}, nil} {
				resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1", h...)
				if resp.StatusCode != want {
					t.Errorf("request %d after the panic: %d, want %d", i, resp.StatusCode, want)
				}
			}
			if n := stat(t, g.admin, "wasm.vm.edge_ratelimit.failed"); n != 1 {
				t.Errorf("failed VMs %d", n)
			}
			if !strings.Contains(g.stderr.String(), "x-probe-panic: now") {
				t.Error("the module's panic is not in the log")
			}
		})
	}
}

// A request paused by the module when the module fails is sent nothing
// more, as in Envoy: the connection manager's stream_idle_timeout answers it
// 408. The test shortens the shipped 10 s to 300 ms (that value is what it
// is about); the probe pauses a request with x-probe-pause and fails on one
// with x-probe-panic.
func TestGatewayPausedStreamsOfAFailedVMTimeOut(t *testing.T) {
	_, probe := modules(t)
	cfg := shippedWith(t, "stream_idle_timeout: 10s", "stream_idle_timeout: 0.3s")
	orders := newService(t, "orders", 0)
	g := startProbe(t, cfg, probe, orders.Server)
	paused := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+g.addr+"/orders/1", nil)
		req.Header.Set("x-probe-pause", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			paused <- nil
			return
		}
		resp.Body.Close()
		paused <- resp
	}()
	testkit.Poll(t, 10*time.Second, "the first request to reach the module", func() bool {
		return strings.Count(g.stderr.String(), "request_headers n=") >= 1
	})
	testkit.Get(t, "http://"+g.addr+"/orders/2", "x-probe-panic", "now")
	select {
	case resp := <-paused:
		if resp == nil || resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("the paused request: %v, want 408 at the stream idle timeout", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the paused request was never answered")
	}
	if n := stat(t, g.admin, "wasm.vm.edge_ratelimit.failed"); n != 1 {
		t.Errorf("failed VMs %d, want 1", n)
	}
	// The request whose callback failed the VM goes on (envoy.yaml's
	// fail_open); the paused one never does.
	if n := orders.hits.Load(); n != 1 {
		t.Errorf("%d requests reached the service, want 1", n)
	}
}

func TestGatewayDrainsOnStop(t *testing.T) {
	filter, _ := modules(t)
	orders := newService(t, "orders", 300*time.Millisecond)
	sidecar := newSidecar(t)
	g := start(t, "-config", envoyYAML, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+testkit.RefusedAddr(t), "-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+g.addr+"/orders/slow", nil)
		req.Header.Set("x-api-key", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	// Stop once the request reached the service (which takes 300 ms to
	// answer it).
	testkit.Poll(t, 10*time.Second, "the request to reach the service", func() bool { return orders.hits.Load() > 0 })
	if err := g.stop(); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != 200 {
		t.Errorf("in-flight request ended with %d, want 200", code)
	}
	if _, err := http.Get("http://" + g.addr + "/orders/1"); err == nil {
		t.Error("the listener still accepts after the stop")
	}
}

func TestCheckFlag(t *testing.T) {
	filter, _ := modules(t)
	// A configuration the filter refuses, which is what -check is for.
	bad := shippedWith(t, `"timeout_ms": 5`, `"timeout_ms": 0`)
	cases := []struct {
		name    string
		args    []string
		wantErr string
		wantOut string
	}{
		{"good", []string{"-config", envoyYAML, "-wasm", filter, "-check"}, "", "configuration OK"},
		{"missing module", []string{"-config", envoyYAML, "-wasm", "/nonexistent.wasm", "-check"}, "/nonexistent.wasm", ""},
		{"unknown cluster", []string{"-config", envoyYAML, "-cluster", "nope=127.0.0.1:1", "-check"}, `cluster "nope"`, ""},
		{"bad cluster flag", []string{"-cluster", "nope"}, "want NAME=HOST:PORT", ""},
		{"unknown listener", []string{"-config", envoyYAML, "-listener", "nope=127.0.0.1:1", "-check"}, `listener "nope": not in the configuration (other listeners: stats)`, ""},
		{"listener given twice", []string{"-listener", "stats=127.0.0.1:1", "-listener", "stats=127.0.0.1:2"}, `listener "stats" given twice`, ""},
		{"bad concurrency", []string{"-concurrency", "0"}, "-concurrency: want 1..256, got 0", ""},
		{"bad nice", []string{"-nice", "20"}, "-nice: want -20..19, got 20", ""},
		{"bad poll mode", []string{"-config", envoyYAML, "-wasm", filter, "-poll-oneoff", "x", "-check"}, "poll_oneoff mode", ""},
	}
	if _, err := os.Stat(bad); err == nil {
		cases = append(cases, struct {
			name    string
			args    []string
			wantErr string
			wantOut string
		}{"filter config rejected", []string{"-config", bad, "-wasm", filter, "-check"}, "timeout_ms", ""})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), c.args, &out, &errb, nil)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !strings.Contains(out.String(), c.wantOut) {
				t.Errorf("err %v, out %q", err, out.String())
			}
		})
	}
}

func TestNormalizePath(t *testing.T) {
	cases := map[string]string{
		"/":                  "/",
		"/orders":            "/orders",
		"//orders///1":       "/orders/1",
		"/billing/../orders": "/orders",
		"/a/./b/":            "/a/b/",
		"/../..":             "/",
		"/a/b/..?x=/../y":    "/a/?x=/../y",
		// Envoy's own cases (path_utility_test.cc): a backslash is a
		// slash, an escaped slash is not.
		`/a/..\c`:     "/c",
		"/a/%2F%2f/c": "/a/%2F%2f/c",
		"/%5c%25":     "/%5c%25",
		// strip_dotdot_segments_with_parameters.
		"/xyz/..;foo=bar/abc": "/abc",
		"/..;foo=bar/abc":     "/abc",
		"/a/.;x/b":            "/a/b",
		"/a/x..;y/b":          "/a/x..;y/b",
	}
	for in, want := range cases {
		if got, ok := normalizePath(in); !ok || got != want {
			t.Errorf("normalizePath(%q) = %q, %t; want %q", in, got, ok, want)
		}
	}
	if _, ok := normalizePath("*"); ok {
		t.Error("normalizePath accepted *")
	}
}

// TestRequestPath: the path the filter and the router see, and whether
// Envoy redirects or refuses first, under each
// path_with_escaped_slashes_action, in Envoy's order (unescape, then
// normalize_path, then merge_slashes).
func TestRequestPath(t *testing.T) {
	type want struct {
		path     string
		redirect bool
		ok       bool
	}
	cases := []struct {
		target string
		action envoyconfig.EscapedSlashesAction
		want   want
	}{
		{"/billing%2F..%2Forders/1", envoyconfig.KeepEscapedSlashes, want{"/billing%2F..%2Forders/1", false, true}},
		{"/billing%2F..%2Forders/1", envoyconfig.UnescapeAndRedirect, want{"/orders/1", true, true}},
		{"/billing%2f..%5Corders/1", envoyconfig.UnescapeAndForward, want{"/orders/1", false, true}},
		{"/billing%2F..%2Forders/1", envoyconfig.RejectEscapedSlashes, want{"", false, false}},
		{"/%2Forders/1?next=%2Fx", envoyconfig.UnescapeAndRedirect, want{"/orders/1?next=%2Fx", true, true}},
		// Nothing to unescape: no redirect, the query's escapes untouched.
		{"/orders/1?next=%2Fx", envoyconfig.UnescapeAndRedirect, want{"/orders/1?next=%2Fx", false, true}},
		{"/orders/%41", envoyconfig.UnescapeAndRedirect, want{"/orders/%41", false, true}},
		// A raw backslash is canonicalized by normalize_path, not redirected.
		{`/billing\..\orders/1`, envoyconfig.UnescapeAndRedirect, want{"/orders/1", false, true}},
		// The fragment is dropped.
		{"/orders/1#/../../billing", envoyconfig.UnescapeAndRedirect, want{"/orders/1", false, true}},
		// Bytes Envoy's HTTP/1 codec refuses in a request target.
		{"/orders/\xff", envoyconfig.KeepEscapedSlashes, want{"", false, false}},
		{"/orders/\x7f", envoyconfig.KeepEscapedSlashes, want{"", false, false}},
	}
	for _, c := range cases {
		r := &http.Request{RequestURI: c.target, URL: &url.URL{Path: "/"}}
		path, redirect, ok := requestPath(r, c.action)
		if got := (want{path, redirect, ok}); got != c.want {
			t.Errorf("requestPath(%q, %v) = %+v, want %+v", c.target, c.action, got, c.want)
		}
	}
}

// BenchmarkGateway sends allowed requests through the whole gateway in
// parallel: the filter, its callout to a loopback sidecar, the service.
func BenchmarkGateway(b *testing.B) {
	filter, _ := modules(b)
	orders := newService(b, "orders", 0)
	sidecar := newSidecar(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan addrs, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"-config", envoyYAML, "-wasm", filter, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-listener", "stats=127.0.0.1:0",
			"-cluster", "orders=" + orders.Listener.Addr().String(), "-cluster", "billing=" + testkit.RefusedAddr(b),
			"-cluster", "ratelimit_sidecar=" + sidecar.Listener.Addr().String()}, io.Discard, io.Discard, ready)
	}()
	var addr string
	select {
	case a := <-ready:
		addr = a.listener
	case err := <-errc:
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	created := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(created)
	before := created[0].Value.Uint64()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("GET", "http://"+addr+"/orders/1", nil)
			req.Header.Set("x-api-key", "alice")
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	// The client's and the services' goroutines included: all of them
	// run in this process.
	metrics.Read(created)
	b.ReportMetric(float64(created[0].Value.Uint64()-before)/float64(b.N), "goroutines/op")
	cancel()
	if err := <-errc; err != nil {
		b.Error(err)
	}
}

// TestGatewayRouterCountsRoutedRequests: http.edge.rq_total, the router's
// count, has the requests that reached the router, as Envoy's router filter
// counts them in its decodeHeaders: the filter's admitted ones, a route's
// 404 among them, and not those answered before it, by the filter (a 401)
// or by the connection manager (a path it cannot normalize: a 400 that
// http.edge.downstream_rq_total has, the filter never sees).
func TestGatewayRouterCountsRoutedRequests(t *testing.T) {
	filter, _ := modules(t)
	orders := newService(t, "orders", 0)
	sidecar := newSidecar(t)
	g := start(t, "-config", envoyYAML, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+orders.Listener.Addr().String(),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	decidedFirst(t, "http://"+g.addr+"/orders/0")
	total, routed := stat(t, g.admin, "http.edge.downstream_rq_total"), stat(t, g.admin, "http.edge.rq_total")
	decided := stat(t, g.admin, "wasmcustom.edgelimit.requests.allowed") + stat(t, g.admin, "wasmcustom.edgelimit.requests.missing_key")

	if resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1", "x-api-key", "alice"); resp.StatusCode != 200 {
		t.Fatalf("allowed: %d", resp.StatusCode)
	}
	if resp, _ := testkit.Get(t, "http://"+g.addr+"/elsewhere", "x-api-key", "alice"); resp.StatusCode != 404 {
		t.Fatalf("no route: %d", resp.StatusCode)
	}
	if resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1"); resp.StatusCode != 401 {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET * HTTP/1.1\r\nHost: edge\r\nx-api-key: alice\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 400 ") {
		t.Fatalf("GET *: %q %v, want a 400", line, err)
	}

	if n := stat(t, g.admin, "http.edge.downstream_rq_total") - total; n != 4 {
		t.Errorf("downstream_rq_total grew by %d, want 4 (every request)", n)
	}
	if n := stat(t, g.admin, "http.edge.rq_total") - routed; n != 2 {
		t.Errorf("rq_total grew by %d, want 2 (the admitted request and the one without a route)", n)
	}
	if n := stat(t, g.admin, "wasmcustom.edgelimit.requests.allowed") + stat(t, g.admin, "wasmcustom.edgelimit.requests.missing_key") - decided; n != 3 {
		t.Errorf("the filter decided %d, want 3 (all but the 400)", n)
	}
}

// The CORS filter's options beyond envoy.yaml's, as Envoy's cors_filter.cc
// applies them. The test changes the shipped policy to reach them: "*"
// methods and headers echo the preflight's, credentials and private
// network access are allowed, and origins are a regex; a preflight of
// another origin is answered by the filter (envoy.yaml's
// forward_not_matching_preflights: false) without
// Access-Control-Allow-Origin, never reaching the rate limiter or the
// service.
func TestGatewayCORSPolicy(t *testing.T) {
	filter, _ := modules(t)
	cfg := shippedWith(t, `                  allow_origin_string_match:
                  - exact: https://app.example.com
                  allow_methods: GET, POST, PUT, PATCH, DELETE
                  allow_headers: x-api-key, authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout
`, `                  allow_origin_string_match:
                  - safe_regex: {regex: 'https://[a-z]+\.example\.com'}
                  allow_methods: "*"
                  allow_headers: "*"
                  allow_credentials: true
                  allow_private_network_access: true
`)
	orders := newService(t, "orders", 0)
	sidecar := newSidecar(t)
	g := start(t, "-config", cfg, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+testkit.RefusedAddr(t),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	do := func(method, origin string, headers ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+g.addr+"/orders/1", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("origin", origin)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	want := func(what string, resp *http.Response, headers ...string) {
		t.Helper()
		for i := 0; i+1 < len(headers); i += 2 {
			if got := resp.Header.Get(headers[i]); got != headers[i+1] {
				t.Errorf("%s: %s %q, want %q", what, headers[i], got, headers[i+1])
			}
		}
	}
	resp := do(http.MethodOptions, "https://shop.example.com", "access-control-request-method", "PATCH",
		"access-control-request-headers", "x-api-key, x-trace", "access-control-request-private-network", "true")
	want("preflight", resp, "access-control-allow-origin", "https://shop.example.com",
		"access-control-allow-methods", "PATCH", "access-control-allow-headers", "x-api-key, x-trace",
		"access-control-allow-credentials", "true", "access-control-allow-private-network", "true",
		"access-control-max-age", "600")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("preflight: %d, want 200", resp.StatusCode)
	}
	resp = do(http.MethodOptions, "https://shop.example.com.evil.example", "access-control-request-method", "GET")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("access-control-allow-origin") != "" {
		t.Errorf("preflight of another origin: %d with access-control-allow-origin %q, want 200 and none",
			resp.StatusCode, resp.Header.Get("access-control-allow-origin"))
	}
	if n := orders.hits.Load(); n != 0 {
		t.Errorf("%d preflights reached the service, want none", n)
	}
	if got := stat(t, g.admin, "wasmcustom.edgelimit.requests.preflight"); got != 0 {
		t.Errorf("%d preflights reached the rate limiter, want none", got)
	}
	resp = do(http.MethodGet, "https://shop.example.com")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", resp.StatusCode)
	}
	want("401", resp, "access-control-allow-origin", "https://shop.example.com", "access-control-allow-credentials", "true",
		"access-control-expose-headers", "retry-after, ratelimit, ratelimit-policy, ratelimit-limit, ratelimit-remaining, ratelimit-reset, grpc-status, grpc-message, grpc-retry-pushback-ms")
}

// TestGatewayBindsListenersAsEnvoy: a listener's socket_address is bound
// as Envoy binds it. envoy.yaml's 0.0.0.0 is an IPv4 socket, which an
// IPv6 client cannot reach (Go's "tcp" would bind it dual-stack and hide
// that the listener is unreachable on an IPv6-only network); "::" is an
// IPv6 socket only; "::" with ipv4_compat takes both.
func TestGatewayBindsListenersAsEnvoy(t *testing.T) {
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback on this machine: %v", err)
	} else {
		l.Close()
	}
	filter, _ := modules(t)
	for _, tt := range []struct {
		address string
		v4, v6  bool // reachable from 127.0.0.1, from ::1
	}{
		{"0.0.0.0", true, false},
		{`"::", ipv4_compat: true`, true, true},
		{`"::"`, false, true},
	} {
		t.Run(tt.address, func(t *testing.T) {
			// Port 0: a free port of the system's choice for the edge
			// listener, which the test reaches on both loopbacks.
			cfg := shippedWith(t, "socket_address: {address: 0.0.0.0, port_value: 10000}", "socket_address: {address: "+tt.address+", port_value: 0}")
			r := startArgs(t, "-config", cfg, "-wasm", filter, "-concurrency", "1",
				"-listener", "stats=127.0.0.1:0", "-admin", "127.0.0.1:0")
			_, port, err := net.SplitHostPort(r.addr)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				host string
				want bool
			}{{"127.0.0.1", tt.v4}, {"::1", tt.v6}} {
				conn, err := net.DialTimeout("tcp", net.JoinHostPort(c.host, port), 5*time.Second)
				if err == nil {
					conn.Close()
				}
				if (err == nil) != c.want {
					t.Errorf("listener on %s (bound %s): connect from %s: %v, want reachable %v", tt.address, r.addr, c.host, err, c.want)
				}
			}
		})
	}
}
