package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// bins are the deliverables under test: `make test` builds them into
// build/ and passes the folder in EDGELIMIT_BIN_DIR; a plain `go test`
// builds them into a temporary folder. bins.Envoy is the real Envoy the
// gateways run, when harness.FindEnvoy finds one (ENVOY_BIN, or envoy on
// the PATH; `make test-envoy`); otherwise build/gateway stands in.
var bins harness.Binaries

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	dir := os.Getenv("EDGELIMIT_BIN_DIR")
	tmp := ""
	if dir == "" {
		var err error
		if tmp, err = os.MkdirTemp("", "edgelimit-e2e-bin-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		dir = tmp
	}
	var err error
	bins, err = harness.Locate(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build the binaries under test:", err)
		os.Exit(1)
	}
	envoy, err := harness.FindEnvoy(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "the Envoy to test against:", err)
		os.Exit(1)
	}
	bins.Envoy = envoy.Path
	if envoy.Path != "" {
		fmt.Fprintf(os.Stderr, "e2e: gateways are Envoy %s (%s)\n", envoy.Version, envoy.Path)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: gateways are build/gateway (%s)\n", bins.Gateway)
	}
	code := m.Run()
	if tmp != "" {
		os.RemoveAll(tmp)
	}
	os.Exit(code)
}

// filterConfig is what a test changes in the filter's configuration: each
// field it sets replaces envoy/envoy.yaml's value, and every other field
// (the 5 ms callout, the cost rules, the region) stays as shipped. A test
// that sets TimeoutMs is about the timeout and says why beside it.
type filterConfig struct {
	SidecarCluster   string   `json:"sidecar_cluster,omitempty"`
	SidecarAuthority string   `json:"sidecar_authority,omitempty"`
	TimeoutMs        int      `json:"timeout_ms,omitempty"`
	Mode             string   `json:"mode,omitempty"`
	CanaryClients    []string `json:"canary_clients,omitempty"`
	OnMissingKey     string   `json:"on_missing_key,omitempty"`
	Region           string   `json:"region,omitempty"`
	Costs            []cost   `json:"costs,omitempty"`
	OnFailure        string   `json:"on_failure,omitempty"`
}

type cost struct {
	Method     string `json:"method,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
	Cost       int    `json:"cost"`
}

// stackConfig describes a whole deployment: one Redis, some sidecars, some
// gateways, the two services of envoy.yaml.
type stackConfig struct {
	plans    string
	filter   filterConfig
	sidecars int // default 1
	gateways int // default 1
	// redisArgs are extra redis-server arguments; sidecarArgs extra
	// flags of every sidecar.
	redisArgs, sidecarArgs []string
	// redisCluster puts the sidecars on a Redis Cluster of three masters
	// without replicas (a redis+cluster:// URL), with
	// cluster-require-full-coverage no as sidecar/README.md asks, instead
	// of one redis-server; s.redis is nil.
	redisCluster bool
	// accessLog asks every gateway for envoy.yaml's access log.
	accessLog bool
	// sidecarFront, if set, is given each sidecar's address and returns the
	// address the gateways use for it instead (a proxy in front of it).
	sidecarFront func(t *testing.T, addr string) string
	// gatewayRegions, if set, is each gateway's filter region (gateway i
	// runs region gatewayRegions[i]), the one field in which gateways of
	// different regions differ; filter.Region must then be empty.
	gatewayRegions []string
	// serviceLimiter is the mode of each service's own per-client limiter
	// (ADR-001), which limits by the plans file as the sidecar does. The
	// default, services.LimiterOff, is the design with the edge: the
	// services count what reaches them and limit nothing.
	serviceLimiter services.Mode
}

type stack struct {
	t        *testing.T
	redis    *redisproc.Server
	cluster  *redisproc.Cluster // with stackConfig.redisCluster, else nil
	plans    string
	sidecars []*harness.Process
	scAddrs  []string
	fronts   []string // what the gateways dial for each sidecar
	gateways []*harness.Gateway
	orders   *services.Service // counting services: one replica, limiter as stackConfig.serviceLimiter
	billing  *services.Service
	http     *http.Client
}

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}

// startStack starts everything and registers its teardown. Gateway i uses
// sidecar i % len(sidecars), as each gateway has its own sidecar next to it.
func startStack(t *testing.T, c stackConfig) *stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.sidecars == 0 {
		c.sidecars = 1
	}
	if c.gateways == 0 {
		c.gateways = 1
	}
	s := &stack{t: t, http: newClient()}
	var redisURL string
	if c.redisCluster {
		if len(c.redisArgs) > 0 {
			t.Fatal("stackConfig: redisArgs are for one redis-server, not for redisCluster")
		}
		cl := redisproc.StartClusterT(t, 3, 0)
		if err := cl.RequireFullCoverage(ctx, false); err != nil {
			t.Fatal(err)
		}
		s.cluster = cl
		redisURL = "redis+cluster://" + strings.Join(cl.Addrs, ",")
	} else {
		s.redis = redisproc.StartT(t, redisproc.Options{Args: c.redisArgs})
		redisURL = s.redis.URL()
	}
	dir := t.TempDir()
	s.plans = filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(s.plans, []byte(c.plans), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < c.sidecars; i++ {
		sc := harness.SidecarConfig{Redis: redisURL, Plans: s.plans}
		sc.Extra = append(sc.Extra, c.sidecarArgs...)
		p, addr, err := harness.StartSidecar(ctx, bins, sc)
		if err != nil {
			t.Fatal(err)
		}
		s.own(p)
		s.sidecars = append(s.sidecars, p)
		s.scAddrs = append(s.scAddrs, addr)
		if c.sidecarFront != nil {
			s.fronts = append(s.fronts, c.sidecarFront(t, addr))
		} else {
			s.fronts = append(s.fronts, addr)
		}
	}
	svc := services.Config{Replicas: 1, Limiter: c.serviceLimiter}
	if c.serviceLimiter != services.LimiterOff {
		// The stack's sidecars run without -key-salt.
		p, err := services.PlansFromFile(s.plans, nil)
		if err != nil {
			t.Fatal(err)
		}
		svc.Plans = p
	}
	var err error
	svc.Name = "orders"
	if s.orders, err = services.Start("127.0.0.1:0", svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.orders.Close() })
	svc.Name = "billing"
	if s.billing, err = services.Start("127.0.0.1:0", svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.billing.Close() })

	cfg, err := json.Marshal(c.filter)
	if err != nil {
		t.Fatal(err)
	}
	yamlPath, err := harness.WithFilterConfig(repoFile(t, "envoy/envoy.yaml"), dir, string(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.gatewayRegions) > 0 && (len(c.gatewayRegions) != c.gateways || c.filter.Region != "") {
		t.Fatal("stackConfig: gatewayRegions needs one region per gateway and no filter.Region")
	}
	for i := 0; i < c.gateways; i++ {
		config := yamlPath
		if len(c.gatewayRegions) > 0 {
			f := c.filter
			f.Region = c.gatewayRegions[i]
			cfg, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			rdir := filepath.Join(dir, "region-"+strconv.Itoa(i))
			if err := os.Mkdir(rdir, 0o700); err != nil {
				t.Fatal(err)
			}
			if config, err = harness.WithFilterConfig(repoFile(t, "envoy/envoy.yaml"), rdir, string(cfg)); err != nil {
				t.Fatal(err)
			}
		}
		g, err := harness.StartGateway(ctx, bins, harness.GatewayConfig{
			Config: config,
			Clusters: map[string]string{
				"orders": s.orders.Addr, "billing": s.billing.Addr,
				"ratelimit_sidecar": s.fronts[i%len(s.fronts)],
			},
			Dir:       dir,
			AccessLog: c.accessLog,
		})
		if err != nil {
			t.Fatal(err)
		}
		s.own(g.Process)
		s.gateways = append(s.gateways, g)
	}
	return s
}

// own stops p at cleanup and shows its output if the test failed.
func (s *stack) own(p *harness.Process) {
	s.t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			s.t.Errorf("%s: %v", p.Name, err)
		}
		if s.t.Failed() {
			out := p.Output()
			if len(out) > 8000 {
				out = "…" + out[len(out)-8000:]
			}
			s.t.Logf("%s output:\n%s", p.Name, out)
		}
	})
}

// reply is what a client saw.
type reply struct {
	status     int
	header     http.Header
	body       string
	retryAfter int
}

// do sends one request through gateway g.
func (s *stack) do(g int, method, path string, headers ...string) reply {
	s.t.Helper()
	req, err := http.NewRequest(method, "http://"+s.gateways[g].Addr+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.http.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: string(body)}
	if v := resp.Header.Get("retry-after"); v != "" {
		r.retryAfter, err = strconv.Atoi(v)
		if err != nil {
			s.t.Fatalf("retry-after %q is not a whole number of seconds", v)
		}
	}
	return r
}

// decidedAttempts bounds doDecided: a callout that misses its 5 ms on a
// loaded machine fails open once in a while, three in a row is a fault.
const decidedAttempts = 3

// doDecided is do for a sequential test that needs the limiter's decision
// on the request: one that failed open (the gateways' fail-open counters
// moved; the callout missed its 5 ms, which the shipped timeout allows on a
// loaded machine) is sent again and logged; a third failing open in a row
// fails the test. The request that failed open may still have been charged
// (Redis can decide a check the gateway stopped waiting for), so a caller
// that counts its client's tokens exactly uses decidedRun instead, or
// allows for one more charge.
func (s *stack) doDecided(g int, method, path string, headers ...string) reply {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		before := s.failedOpen()
		r := s.do(g, method, path, headers...)
		if s.failedOpen() == before {
			return r
		}
		if attempt == decidedAttempts {
			s.t.Fatalf("%s %s failed open %d times in a row", method, path, attempt)
		}
		s.t.Logf("%s %s failed open (attempt %d of %d): no decision, sent again", method, path, attempt, decidedAttempts)
	}
}

// denyTrust is how long the filter's deny cache takes one of the sidecar's
// answers on trust: past it, the next request the entry would deny is
// asked about again.
const denyTrust = time.Duration(limiter.DenyTrust)

// cachedDenial sends a request of a client the gateway's deny cache holds,
// whose latest 429 answered a request sent at prev, and reports whether it
// was answered 429 from the cache. One answered within denyTrust of prev
// must be: the entry is still trusted. One answered later may rightly be
// the once-a-second re-ask (a stall of the machine between two requests),
// which renews the entry, so it is sent again, up to decidedAttempts times.
func (s *stack) cachedDenial(g int, prev time.Time, method, path string, headers ...string) bool {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		before := s.decisions()["denied_cached"]
		sent := time.Now()
		r := s.do(g, method, path, headers...)
		answered := time.Since(prev)
		if r.status == http.StatusTooManyRequests && s.decisions()["denied_cached"] == before+1 {
			return true
		}
		if answered < denyTrust || r.status != http.StatusTooManyRequests || attempt == decidedAttempts {
			s.t.Logf("%s %s: %d, answered %v after the previous 429's request, not from the deny cache", method, path, r.status, answered)
			return false
		}
		s.t.Logf("%s %s answered %v after the previous 429's request, past the deny cache's trust: asked again (attempt %d of %d)", method, path, answered, attempt, decidedAttempts)
		prev = sent
	}
}

// decidedRun runs fn, a sequence of requests whose decisions a test
// checks, again when one of its requests' callouts failed (the gateways'
// fail-open counters moved, or callout.failed_cached: a failed callout
// the deny cache answered 429): that request was not decided, and its
// client's bucket may or may not have paid for it (Redis may still decide
// a check the sidecar or the gateway stopped waiting for: a burst admitted
// one request short, its token spent on a check answered 503 "redis
// timeout" and then 429 from the deny cache), so the run tested nothing.
// fn gets the run's number, to make its clients fresh, and reports what it
// found wrong. A run with no failed callout that found something fails t,
// and so do decidedAttempts runs in a row that each had one.
func (s *stack) decidedRun(t *testing.T, what string, fn func(run int) error) {
	t.Helper()
	// Both counters from one read of each gateway's stats.
	failed := func() int64 {
		stats := s.gatewayStats()
		n := decisionsIn(stats).failedOpen()
		for _, st := range stats {
			n += st["wasmcustom."+limiter.MetricFailedCached]
		}
		return n
	}
	for run := 1; ; run++ {
		before := failed()
		err := fn(run)
		if failed() == before {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if run == decidedAttempts {
			t.Fatalf("%s: a callout failed in each of %d runs in a row (the last found: %v)", what, run, err)
		}
		t.Logf("%s: a callout failed (run %d of %d; it found: %v): nothing tested, run again with fresh clients", what, run, decidedAttempts, err)
	}
}

// tokens reads what client's bucket holds in Redis as the script last
// wrote it (no refill since): a bucket the script never wrote is an error.
func (s *stack) tokens(client string) (float64, error) {
	return s.redis.Client(s.t).HGet(context.Background(), keys.New(nil).BucketKey([]byte(client)), "tokens").Float64()
}

// received is what reached both services from client.
func (s *stack) received(client string) int64 {
	return s.orders.Stats().Client(client).Received + s.billing.Stats().Client(client).Received
}

// totalReceived is what reached both services from every client.
func (s *stack) totalReceived() int64 {
	return s.orders.Stats().Total().Received + s.billing.Stats().Total().Received
}

// gatewayStats returns every gateway's admin /stats, gateway by gateway.
func (s *stack) gatewayStats() []map[string]int64 {
	s.t.Helper()
	out := make([]map[string]int64, len(s.gateways))
	for i, g := range s.gateways {
		st, err := g.Stats()
		if err != nil {
			s.t.Fatal(err)
		}
		out[i] = st
	}
	return out
}

// stat sums a gateway counter over every gateway.
func (s *stack) stat(name string) int64 {
	s.t.Helper()
	var n int64
	for _, st := range s.gatewayStats() {
		n += st[name]
	}
	return n
}

func counter(name string) string { return "wasmcustom.edgelimit.requests." + name }

// standInOnly skips t when the gateways are a real Envoy: what t checks is
// behaviour only build/gateway has, which why names.
func standInOnly(t *testing.T, why string) {
	t.Helper()
	if bins.Envoy != "" {
		t.Skipf("build/gateway only, not Envoy (%s): %s", bins.Envoy, why)
	}
}

func mustContain(t *testing.T, what, s, want string) {
	t.Helper()
	if !strings.Contains(s, want) {
		t.Errorf("%s = %q, want it to contain %q", what, s, want)
	}
}

// newClient is the tests' HTTP client: keep-alive connections, enough of
// them idle for every concurrent sender a test runs, as API clients keep
// their connections. (The default transport keeps two per host, so a
// burst of senders would open a new connection for nearly every request.)
func newClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 256
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}
