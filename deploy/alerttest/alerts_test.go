// Package alerttest evaluates the chart's alert rules with Prometheus's own
// query engine against the metrics of the real binaries under real faults.
// It is a module of its own so that the main module does not depend on
// Prometheus (deploy/README.md, "The alerts' test", says which of its
// packages it uses and why).
//
// The rules' `for:` durations are minutes and their rate windows five
// minutes; a test cannot wait that long. So each phase's metrics are
// scraped from the running processes at a few real moments, and the
// samples are given to the engine at synthetic timestamps, a scrape
// interval apart: the traffic between two real scrapes is what each
// synthetic interval of the phase sees (timeline.steady), a one-off event
// such as a plans reload is one interval's change (timeline.once). The
// rules are evaluated every evaluation interval over that timeline, each
// expression by promql.Engine, and an alert fires once its expression has
// had a result at every evaluation for its `for:` (Prometheus's rule:
// pending from the first evaluation with a result, firing when `for:` has
// passed since, inactive at the first without).
package alerttest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"sigs.k8s.io/yaml"

	"github.com/edgelimit/edgelimit/deploy/charttest/chartrender"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

const (
	// scrapeInterval is the ServiceMonitor's default interval
	// (values.yaml serviceMonitor.interval); evalInterval is the
	// prometheus-operator's default evaluationInterval.
	scrapeInterval = 15 * time.Second
	evalInterval   = 30 * time.Second
	// The target labels the ServiceMonitor's scrape gives every series of
	// the pod (the rules select namespace and job, and sum by pod).
	pod = "edge-edgelimit-6d9f7c-abcde"
)

var (
	repoRoot = filepath.Join("..", "..")
	// keyPro is the client key the plans file gives plan "pro".
	keyPro = "alerttest-pro-key"
	// keyHot is a hot client's, on plan "pro" in two regions.
	keyHot = "alerttest-hot-key"
)

// rules renders the chart with its PrometheusRule and returns its rules as
// Prometheus loads them (rulefmt.Parse validates every expression).
func rules(t *testing.T, vals map[string]any) []rulefmt.Rule {
	t.Helper()
	v := map[string]any{
		"serviceMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true},
		"plans":          map[string]any{"default_plan": "free", "plans": map[string]any{"free": map[string]any{"capacity": 10, "rate": "2/s"}}},
	}
	for k, x := range vals {
		v[k] = x
	}
	manifest, err := chartrender.Render(filepath.Join("..", "helm", "edgelimit"), v)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		var obj struct {
			Kind string
			Spec map[string]any
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind != "PrometheusRule" {
			continue
		}
		spec, err := yaml.Marshal(obj.Spec)
		if err != nil {
			t.Fatal(err)
		}
		groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, parser.NewParser(parser.Options{}), nil)
		if len(errs) > 0 {
			t.Fatalf("the PrometheusRule's groups: %v", errs)
		}
		var out []rulefmt.Rule
		for _, g := range groups.Groups {
			out = append(out, g.Rules...)
		}
		return out
	}
	t.Fatal("no PrometheusRule rendered")
	return nil
}

// scrape is one real moment: every series of the pod's two scrape targets,
// as Prometheus would store them (the target's labels added), with
// whether each is a gauge.
type scrape struct {
	values map[string]float64 // series key (labels.String) → value
	lsets  map[string]labels.Labels
	gauge  map[string]bool
}

// target labels of the ServiceMonitor's two endpoints.
func targetLabels(endpoint string) map[string]string {
	return map[string]string{
		"namespace": chartrender.Namespace,
		"job":       chartrender.Release + "-edgelimit-metrics",
		"pod":       pod,
		"endpoint":  endpoint,
		"instance":  "10.0.0.7:" + endpoint,
	}
}

// parse adds the series of a /stats/prometheus or /metrics body, through
// Prometheus's own text parser, with the target's labels.
func (s *scrape) parse(t *testing.T, body []byte, target map[string]string) {
	t.Helper()
	p := textparse.NewPromParser(body, labels.NewSymbolTable(), false)
	types := map[string]model.MetricType{}
	for {
		e, err := p.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("scrape: %v\n%s", err, body)
		}
		switch e {
		case textparse.EntryType:
			name, typ := p.Type()
			types[string(name)] = typ
		case textparse.EntrySeries:
			_, _, v := p.Series()
			var l labels.Labels
			p.Labels(&l)
			b := labels.NewBuilder(l)
			for k, x := range target {
				b.Set(k, x)
			}
			l = b.Labels()
			key := l.String()
			s.values[key], s.lsets[key] = v, l
			s.gauge[key] = types[l.Get(labels.MetricName)] == model.MetricTypeGauge
		}
	}
	// up, as Prometheus records it for a scrape that succeeded.
	s.add(labels.FromMap(merge(target, map[string]string{labels.MetricName: "up"})), 1, true)
}

// total is the sum of the series of family name in s.
func (s scrape) total(name string) float64 {
	n := 0.0
	for key, l := range s.lsets {
		if l.Get(labels.MetricName) == name {
			n += s.values[key]
		}
	}
	return n
}

// without is s as Prometheus records it when the scrape of the target at
// endpoint fails: none of its series, up 0.
func (s scrape) without(endpoint string) scrape {
	out := scrape{values: map[string]float64{}, lsets: map[string]labels.Labels{}, gauge: map[string]bool{}}
	for key, l := range s.lsets {
		if l.Get("endpoint") != endpoint {
			out.add(l, s.values[key], s.gauge[key])
		}
	}
	out.add(labels.FromMap(merge(targetLabels(endpoint), map[string]string{labels.MetricName: "up"})), 0, true)
	return out
}

// frozen is b with the series of family name at their values in a: a
// filter whose VM has failed on every worker counts nothing more, while
// Envoy keeps the counters it had.
func frozen(a, b scrape, name string) scrape {
	out := scrape{values: map[string]float64{}, lsets: b.lsets, gauge: b.gauge}
	for key, v := range b.values {
		if b.lsets[key].Get(labels.MetricName) == name {
			v = a.values[key]
		}
		out.values[key] = v
	}
	return out
}

// dropped is s without the series of family name: a filter that exports
// none.
func (s scrape) dropped(name string) scrape {
	out := scrape{values: map[string]float64{}, lsets: map[string]labels.Labels{}, gauge: map[string]bool{}}
	for key, l := range s.lsets {
		if l.Get(labels.MetricName) != name {
			out.add(l, s.values[key], s.gauge[key])
		}
	}
	return out
}

func (s *scrape) add(l labels.Labels, v float64, gauge bool) {
	key := l.String()
	s.values[key], s.lsets[key], s.gauge[key] = v, l, gauge
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// timeline is the synthetic history the rules are evaluated over.
type timeline struct {
	now    int64 // ms
	cum    map[string]float64
	series map[string]*seriesData
}

type seriesData struct {
	lset    labels.Labels
	samples []chunks.Sample
}

type sample struct {
	t int64
	f float64
}

func (s sample) T() int64                      { return s.t }
func (s sample) ST() int64                     { return 0 }
func (s sample) F() float64                    { return s.f }
func (s sample) H() *histogram.Histogram       { return nil }
func (s sample) FH() *histogram.FloatHistogram { return nil }
func (s sample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s sample) Copy() chunks.Sample           { return s }

// seriesSet is a sorted list of series.
type seriesSet struct {
	list []storage.Series
	i    int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i <= len(s.list) }
func (s *seriesSet) At() storage.Series                { return s.list[s.i-1] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

func newTimeline() *timeline {
	return &timeline{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), cum: map[string]float64{}, series: map[string]*seriesData{}}
}

// record writes one synthetic scrape: every series of s, counters at their
// accumulated values, gauges as s has them. A series s lacks (a target
// down) gets no sample.
func (tl *timeline) record(s scrape) {
	tl.now += scrapeInterval.Milliseconds()
	for key, v := range s.values {
		if !s.gauge[key] {
			v = tl.cum[key]
		}
		d := tl.series[key]
		if d == nil {
			d = &seriesData{lset: s.lsets[key]}
			tl.series[key] = d
		}
		d.samples = append(d.samples, sample{tl.now, v})
	}
}

// steady plays the traffic between the real scrapes a and b once every
// scrape interval for d: each counter grows by its growth from a to b per
// interval (by its value in b when it is new in b, or went back: a process
// restarted), each gauge has its value in b.
func (tl *timeline) steady(a, b scrape, d time.Duration) {
	for i := time.Duration(0); i < d; i += scrapeInterval {
		tl.step(a, b)
	}
}

// once is one interval in which the counters grow as they did from a to b.
func (tl *timeline) once(a, b scrape) { tl.step(a, b) }

func (tl *timeline) step(a, b scrape) {
	for key, v := range b.values {
		if b.gauge[key] {
			continue
		}
		prev, ok := a.values[key]
		if !ok || v < prev {
			prev = 0
		}
		tl.cum[key] += v - prev
	}
	tl.record(b)
}

// queryable serves the timeline's series to the engine.
func (tl *timeline) queryable() storage.Queryable {
	return &storage.MockQueryable{MockQuerier: &storage.MockQuerier{
		SelectMockFunction: func(sortSeries bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
			keys := make([]string, 0, len(tl.series))
			for k := range tl.series {
				keys = append(keys, k)
			}
			sort.Strings(keys)
		next:
			for _, k := range keys {
				d := tl.series[k]
				for _, m := range ms {
					if !m.Matches(d.lset.Get(m.Name)) {
						continue next
					}
				}
				out = append(out, storage.NewListSeries(d.lset, d.samples))
			}
			slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
			return &seriesSet{list: out}
		},
	}}
}

// firing evaluates every rule at every evaluation interval from start to
// the timeline's end, with Prometheus's `for:` rule, and returns the
// alerts firing at the last evaluation (alert name → the series' labels).
func (tl *timeline) firing(t *testing.T, rs []rulefmt.Rule, start int64) map[string][]string {
	t.Helper()
	// A subquery without a step ([5m:]) is evaluated at the global
	// evaluation interval, as Prometheus sets it (its
	// NoStepSubqueryIntervalFn).
	eng := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute,
		NoStepSubqueryIntervalFn: func(int64) int64 { return evalInterval.Milliseconds() }})
	q := tl.queryable()
	out := map[string][]string{}
	for _, r := range rs {
		active := map[string]int64{} // series → since
		var fired []string
		for ts := start; ts <= tl.now; ts += evalInterval.Milliseconds() {
			qry, err := eng.NewInstantQuery(context.Background(), q, nil, r.Expr, time.UnixMilli(ts))
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			res := qry.Exec(context.Background())
			if res.Err != nil {
				t.Fatalf("%s: %v", r.Alert, res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			qry.Close()
			now := map[string]int64{}
			fired = fired[:0]
			for _, s := range vec {
				k := s.Metric.String()
				since, ok := active[k]
				if !ok {
					since = ts
				}
				now[k] = since
				if time.Duration(ts-since)*time.Millisecond >= time.Duration(r.For) {
					fired = append(fired, fmt.Sprintf("%s=%g", k, s.F))
				}
			}
			active = now
		}
		if len(fired) > 0 {
			out[r.Alert] = slices.Clone(fired)
		}
	}
	return out
}

// stack is the real processes of one pod: Redis, the sidecar, the gateway
// (build/gateway on envoy/envoy.yaml as shipped), and a service behind.
type stack struct {
	bins    harness.Binaries
	redis   *redisproc.Server
	sidecar *harness.Process
	scAddr  string
	gw      *harness.Gateway
	plans   string
	http    *http.Client
	// malformed: traffic sends as many requests again with a path the
	// connection manager refuses.
	malformed bool
}

func digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// plansFile: the default plan holds a client to 5 requests and 2/s after
// (the test's "free" key runs past it: 429s), "pro" lets keyPro through,
// and keyHot, a hot client in two regions.
func plansFile() string {
	return fmt.Sprintf("default_plan: free\nplans:\n  free: {capacity: 5, rate: 2/s}\n  pro: {capacity: 100000, rate: 100000/s}\nclients:\n  %q: pro\n  %q: {plan: pro, regions: [eu, us]}\n", digest(keyPro), digest(keyHot))
}

func binaries(t *testing.T) harness.Binaries {
	t.Helper()
	dir := os.Getenv("EDGELIMIT_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(repoRoot, "build")
	}
	b := harness.Binaries{Dir: dir, Filter: filepath.Join(dir, "filter.wasm"), Sidecar: filepath.Join(dir, "sidecar"), Gateway: filepath.Join(dir, "gateway")}
	for _, f := range []string{b.Filter, b.Sidecar, b.Gateway} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%v: run `make build` in the repository root (or set EDGELIMIT_BIN_DIR)", err)
		}
	}
	return b
}

func startStack(t *testing.T) *stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := &stack{bins: binaries(t), http: &http.Client{Timeout: 10 * time.Second}}
	s.redis = redisproc.StartT(t, redisproc.Options{})
	s.plans = filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(s.plans, []byte(plansFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.startSidecar(t, ctx)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(svc.Close)
	addr := strings.TrimPrefix(svc.URL, "http://")
	g, err := harness.StartGateway(ctx, s.bins, harness.GatewayConfig{
		Config:   filepath.Join(repoRoot, "envoy", "envoy.yaml"),
		Clusters: map[string]string{"orders": addr, "billing": addr, "ratelimit_sidecar": s.scAddr},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(10 * time.Second) })
	s.gw = g
	return s
}

func (s *stack) startSidecar(t *testing.T, ctx context.Context) {
	t.Helper()
	p, addr, err := harness.StartSidecar(ctx, s.bins, harness.SidecarConfig{Redis: s.redis.URL(), Plans: s.plans})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	s.sidecar, s.scAddr = p, addr
}

// healed waits until the filter decides requests again: the sidecar
// ready, the breaker closed by a probe that got an answer.
func (s *stack) healed(t *testing.T) {
	t.Helper()
	testkit.PollErr(t, 30*time.Second, "the filter to decide again", func() error {
		s.request(t, keyPro)
		st, err := s.gw.Stats()
		if err != nil {
			return err
		}
		if v := st["wasmcustom.edgelimit.breaker.state"]; v != 0 {
			_, rerr := s.get("http://" + s.scAddr + "/readyz")
			return fmt.Errorf("breaker state %d (opened %d reopened %d closed %d, allowed %d, failed_open %v); sidecar /readyz: %v", v, st["wasmcustom.edgelimit.breaker.opened"], st["wasmcustom.edgelimit.breaker.reopened"], st["wasmcustom.edgelimit.breaker.closed"], st["wasmcustom.edgelimit.requests.allowed"], st["wasmcustom.edgelimit.requests.failed_open.circuit_open"], rerr)
		}
		_, err = s.get("http://" + s.scAddr + "/readyz")
		return err
	})
}

// traffic sends n requests as clients do: most with a key its plan
// admits (one in ten of them the hot client's), one in ten without a key
// (401), one in ten with the default plan's key past its bucket (429);
// and, when s.malformed is set, as many
// again that the connection manager refuses before the filter.
func (s *stack) traffic(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if s.malformed {
			s.badPath(t)
		}
		switch i % 10 {
		case 0:
			s.request(t, "")
		case 1:
			s.request(t, "alerttest-free-key")
		case 2:
			s.request(t, keyHot)
		default:
			s.request(t, keyPro)
		}
	}
}

// badPath sends a request whose path the connection manager cannot
// normalize ("*" on a GET): Envoy, and the gateway, answer it 400 before
// the filter, and count it in downstream_rq_total, not the router's
// rq_total.
func (s *stack) badPath(t *testing.T) {
	t.Helper()
	c, err := net.Dial("tcp", s.gw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET * HTTP/1.1\r\nHost: edge\r\nx-api-key: " + keyPro + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 400 ") {
		t.Fatalf("GET *: %q %v, want a 400", line, err)
	}
}

// request sends one request with key ("": none).
func (s *stack) request(t *testing.T, key string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+s.gw.Addr+"/orders/1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// scrape reads both targets now. A target that does not answer has no
// series but up 0, as in Prometheus.
func (s *stack) scrape(t *testing.T) scrape {
	t.Helper()
	sc := scrape{values: map[string]float64{}, lsets: map[string]labels.Labels{}, gauge: map[string]bool{}}
	envoyTarget, sidecarTarget := targetLabels("envoy-stats"), targetLabels("sidecar-admin")
	if body, err := s.get("http://" + s.gw.Admin + "/stats/prometheus"); err != nil {
		t.Fatal(err)
	} else {
		sc.parse(t, body, envoyTarget)
	}
	// Envoy's /stats/prometheus has the connection manager's
	// http.edge.downstream_rq_total and the router's http.edge.rq_total
	// with its default tags as envoy_http_<name>{envoy_http_conn_manager_prefix="edge"};
	// build/gateway has the counters in /stats only.
	st, err := s.gw.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// The gateway writes them from the first request on; Envoy from the
	// start, at 0.
	for _, name := range []string{"downstream_rq_total", "rq_total"} {
		sc.add(labels.FromMap(merge(envoyTarget, map[string]string{labels.MetricName: "envoy_http_" + name, "envoy_http_conn_manager_prefix": "edge"})), float64(st["http.edge."+name]), false)
	}
	if body, err := s.get("http://" + s.scAddr + "/metrics"); err != nil {
		sc.add(labels.FromMap(merge(sidecarTarget, map[string]string{labels.MetricName: "up"})), 0, true)
	} else {
		sc.parse(t, body, sidecarTarget)
	}
	return sc
}

func (s *stack) get(url string) ([]byte, error) {
	resp, err := s.http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", url, resp.Status)
	}
	return b, err
}

// phase is traffic between two real scrapes, played for d.
func (s *stack) phase(t *testing.T, tl *timeline, d time.Duration) scrape {
	t.Helper()
	a := s.scrape(t)
	s.traffic(t, 200)
	b := s.scrape(t)
	tl.steady(a, b, d)
	return b
}

// late are the series that count decisions made too late: callouts past
// the filter's 5 ms, checks the sidecar read too late or whose Redis
// round trip passed its timeout, and the requests of a breaker that
// breaker.failures of those in a row opened. On a healthy production node
// they are rare; on a shared 2-core test machine a burst of other work
// makes them, and a few in a burst of 200 are past the alerts' 1%.
var late = []struct{ name, label, value string }{
	{"edgelimit_requests", "reason", "timeout"},
	{"edgelimit_requests", "reason", "circuit_open"},
	{"sidecar_checks_expired_total", "", ""},
	{"sidecar_redis_timeouts_total", "", ""},
}

// calmPhase is phase for a healthy system: it plays the burst calmBurst
// found; false if it found none on time (the phase is then played all the
// same, and the caller does not hold the alerts to silence).
func (s *stack) calmPhase(t *testing.T, tl *timeline, d time.Duration) bool {
	t.Helper()
	a, b, ok := s.calmBurst(t)
	tl.steady(a, b, d)
	return ok
}

// lateIn is how many decisions came late between the scrapes a and b.
func lateIn(a, b scrape) float64 {
	n := 0.0
	for key, v := range b.values {
		l := b.lsets[key]
		for _, x := range late {
			if l.Get(labels.MetricName) == x.name && (x.label == "" || l.Get(x.label) == x.value) {
				n += v - a.values[key]
			}
		}
	}
	return n
}

// calmBurst returns the scrapes around the first of up to 10 bursts, each
// begun with the breaker closed, in which no decision was late (see late);
// if every one had some, the machine could not give the processes their
// time, and it says so and returns the last with false.
func (s *stack) calmBurst(t *testing.T) (a, b scrape, ok bool) {
	t.Helper()
	for try := 1; try <= 10; try++ {
		s.healed(t)
		a = s.scrape(t)
		s.traffic(t, 200)
		b = s.scrape(t)
		n := lateIn(a, b)
		if n == 0 {
			return a, b, true
		}
		t.Logf("burst %d: %g decisions late (the machine is busy); once more", try, n)
	}
	t.Logf("every burst had late decisions: the healthy phase's silence is not checked")
	return a, b, false
}

func names(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestAlerts: with normal traffic no alert fires; each fault fires the
// alerts meant for it, within its phase of 15 synthetic minutes (longer
// than every rate window and `for:`), and they stop once it is over.
func TestAlerts(t *testing.T) {
	rs := rules(t, nil)
	s := startStack(t)
	tl := newTimeline()
	const phase = 15 * time.Minute
	calm := true
	// check: the alerts firing at the end of the last phase are want, and
	// any of may. The latency alerts are always in may: their thresholds
	// (a callout p99 of 4 ms, a decision p99 of 2 ms, a wait p99 of 1 ms)
	// are about the production node's speed; on a shared 2-core test
	// machine the p99 of a phase's 200 requests is the second slowest,
	// which a scheduling delay can put past them, and the phase's traffic
	// plays it for all of the phase's 15 minutes.
	check := func(what string, want []string, may ...string) {
		t.Helper()
		may = append(may, "EdgelimitCalloutSlow", "EdgelimitSidecarSlow", "EdgelimitSidecarStarved")
		got := tl.firing(t, rs, tl.now-phase.Milliseconds())
		t.Logf("%s: firing %v\n%s", what, names(got), dump(got))
		var must []string
		for _, n := range names(got) {
			if !slices.Contains(may, n) {
				must = append(must, n)
			}
		}
		if want == nil && !calm {
			return
		}
		if !slices.Equal(must, want) {
			t.Errorf("%s: firing %v, want %v (and any of %v)", what, names(got), want, may)
		}
	}
	calm = s.calmPhase(t, tl, phase)
	check("normal traffic", nil)
	// busy: the alerts late decisions fire, which a phase whose burst had
	// some (ok false: the machine was busy) may have beside its fault's.
	busy := func(ok bool) []string {
		if ok {
			return nil
		}
		return []string{"EdgelimitCircuitOpen", "EdgelimitFailingOpen", "EdgelimitSidecarErrors"}
	}

	if err := s.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	s.phase(t, tl, phase)
	// The hot client's reconcile fails too, once a second: whether one
	// failed between the burst's two scrapes is the luck of its timing.
	check("Redis stopped", []string{"EdgelimitCircuitOpen", "EdgelimitFailingOpen", "EdgelimitSidecarErrors"}, "EdgelimitHotReconcileFailing")
	if err := s.redis.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.healed(t)
	calm = s.calmPhase(t, tl, phase)
	check("Redis back", nil)

	// Redis refuses the sidecar's scripts (an ACL without them: NOPERM).
	rc := s.redis.Client(t)
	if err := rc.Do(context.Background(), "ACL", "SETUSER", "default", "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	s.phase(t, tl, phase)
	// The hot client's lease is renewed by a script too (EVALSHA).
	check("Redis NOPERM", []string{"EdgelimitCircuitOpen", "EdgelimitFailingOpen", "EdgelimitSidecarErrors"}, "EdgelimitHotReconcileFailing")
	if err := rc.Do(context.Background(), "ACL", "SETUSER", "default", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	s.healed(t)
	calm = s.calmPhase(t, tl, phase)
	check("Redis allows scripts again", nil)

	// Redis refuses only what the hot clients' reconcile runs beside the
	// script (an ACL without HINCRBY): every decision is made, the shares
	// stay as they were.
	if err := rc.Do(context.Background(), "ACL", "SETUSER", "default", "-hincrby").Err(); err != nil {
		t.Fatal(err)
	}
	// The reconcile runs once a second, so the burst's scrapes are taken
	// a reconcile apart. On a machine too busy to decide on time, the late
	// decisions' alerts may fire too.
	s.healed(t)
	a := s.scrape(t)
	s.traffic(t, 200)
	testkit.Poll(t, 30*time.Second, "a hot reconcile to fail", func() bool {
		m, err := testkit.GetMetrics("http://" + s.scAddr + "/metrics")
		return err == nil && m[`sidecar_hot_reconcile_errors_total`] > a.total("sidecar_hot_reconcile_errors_total")
	})
	b := s.scrape(t)
	tl.steady(a, b, phase)
	check("Redis refusing HINCRBY", []string{"EdgelimitHotReconcileFailing"}, busy(lateIn(a, b) == 0)...)
	if err := rc.Do(context.Background(), "ACL", "SETUSER", "default", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	calm = s.calmPhase(t, tl, phase)
	check("Redis allows HINCRBY again", nil)

	// A plans file the sidecar refuses, left in place.
	a = s.phase(t, tl, time.Minute)
	if err := os.WriteFile(s.plans, []byte("default_plan: nosuch\nplans: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The sidecar sees the change itself (it polls the file every second),
	// as it sees a ConfigMap's.
	testkit.Poll(t, 30*time.Second, "the sidecar to refuse the plans", func() bool {
		m, err := testkit.GetMetrics("http://" + s.scAddr + "/metrics")
		return err == nil && m[`sidecar_plans_reloads_total{result="error"}`] > 0
	})
	b = s.scrape(t)
	tl.once(a, b)
	s.phase(t, tl, 2*time.Minute)
	check("bad plans, 2 min after", []string{"EdgelimitPlansReloadFailed"})
	// The refused file is still the file, and a sidecar started on it
	// would not start: the alert holds.
	s.phase(t, tl, phase)
	check("bad plans, 17 min after", []string{"EdgelimitPlansReloadFailed"})
	// The file put back as it was: the same plans as those in force.
	if err := os.WriteFile(s.plans, []byte(plansFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(t, 30*time.Second, "the sidecar to load the file put back", func() bool {
		m, err := testkit.GetMetrics("http://" + s.scAddr + "/metrics")
		return err == nil && m[`sidecar_plans_last_reload_successful`] == 1
	})
	calm = s.calmPhase(t, tl, phase)
	check("good plans back", nil)

	// One scrape of the sidecar fails (it timed out, or the container
	// restarted between two scrapes): up 0 and none of its series once,
	// then healthy traffic. One failed scrape in the 40 of 10 minutes is
	// not EdgelimitScrapeFailing's one in 10.
	a = s.scrape(t)
	s.traffic(t, 200)
	b = s.scrape(t)
	tl.steady(a, b, time.Minute)
	tl.once(a, b.without("sidecar-admin"))
	calm = s.calmPhase(t, tl, phase)
	check("one failed scrape of the sidecar, 15 min of normal traffic after", nil)

	// A client sends as many requests as the others with a path the
	// connection manager refuses (400) before the filter: they are not the
	// filter's to decide, and no alert is about them.
	s.malformed = true
	calm = s.calmPhase(t, tl, phase)
	check("as many malformed requests as good ones", nil)
	s.malformed = false

	// The filter decides nothing more (its VM failed on every worker; with
	// fail_open the requests reach the router unchecked): Envoy keeps its
	// counters where they were.
	// Its traffic is a calm burst's, but for the frozen counters: on a
	// machine too busy for one, the late decisions' alerts may fire too.
	a, b, ok := s.calmBurst(t)
	tl.steady(a, frozen(a, b, "edgelimit_requests"), phase)
	check("the filter counting nothing", []string{"EdgelimitFilterNotDeciding"}, busy(ok)...)
	s.healed(t)
	calm = s.calmPhase(t, tl, phase)
	check("the filter deciding again", nil)
	// The filter exports no request counters at all.
	a, b, ok = s.calmBurst(t)
	tl.steady(a.dropped("edgelimit_requests"), b.dropped("edgelimit_requests"), phase)
	check("the filter exporting no request counters", []string{"EdgelimitFilterNotDeciding"}, busy(ok)...)
	s.healed(t)
	calm = s.calmPhase(t, tl, phase)
	check("the filter's counters back", nil)

	if err := s.sidecar.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.phase(t, tl, phase)
	// Its scrapes fail too (up 0): the sidecar's own alerts have no
	// series to fire on, and EdgelimitScrapeFailing says it.
	check("sidecar stopped", []string{"EdgelimitCircuitOpen", "EdgelimitFailingOpen", "EdgelimitScrapeFailing"})
}

func dump(m map[string][]string) string {
	var b strings.Builder
	for _, k := range names(m) {
		fmt.Fprintf(&b, "  %s: %v\n", k, m[k])
	}
	return b.String()
}

// TestFilterNotDecidingFollowsOnMissingKey: the requests without a valid
// key are among those the filter passes on to the router only when
// filter.on_missing_key lets them through, or when they are not enforced
// (mode shadow, or beside a canary list); rejected, they are 401s that
// never reach it.
func TestFilterNotDecidingFollowsOnMissingKey(t *testing.T) {
	for _, c := range []struct {
		filter map[string]any
		passed bool
	}{
		{nil, false},
		{map[string]any{"on_missing_key": "reject"}, false},
		{map[string]any{"on_missing_key": "allow"}, true},
		{map[string]any{"mode": "shadow"}, true},
		{map[string]any{"mode": "off"}, false},
		{map[string]any{"canary_clients": []any{"vip-1"}}, true},
		{map[string]any{"canary_clients": []any{}}, false},
	} {
		vals := map[string]any{}
		if c.filter != nil {
			vals["filter"] = c.filter
		}
		var expr string
		for _, r := range rules(t, vals) {
			if r.Alert == "EdgelimitFilterNotDeciding" {
				expr = r.Expr
			}
		}
		if got := strings.Contains(expr, "|missing_key|invalid_key"); got != c.passed {
			t.Errorf("filter %v: missing_key and invalid_key passed on: %t, want %t\n%s", c.filter, got, c.passed, expr)
		}
	}
}

// TestFilterNotDecidingCountsPreflights: a CORS preflight is passed on to
// the router uncharged and counted in edgelimit_requests{decision=
// "preflight"}; were it left out of the requests the filter passed on, an
// API whose browser clients send one before each call (half its requests)
// would read as a filter deciding 50% of what reaches the router, and page.
func TestFilterNotDecidingCountsPreflights(t *testing.T) {
	for _, vals := range []map[string]any{{}, {"filter": map[string]any{"on_missing_key": "allow"}}} {
		var expr string
		for _, r := range rules(t, vals) {
			if r.Alert == "EdgelimitFilterNotDeciding" {
				expr = r.Expr
			}
		}
		if !strings.Contains(expr, "|preflight|") {
			t.Errorf("values %v: the preflights passed on are not among the filter's decisions:\n%s", vals, expr)
		}
	}
}
