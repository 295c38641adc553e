package alerttest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// meshRules are the forms of EdgelimitFailingOpen and
// EdgelimitFilterNotDeciding that envoy/README.md gives under heading (a
// mesh's or a gateway controller's Envoy), with the chart's for: (10m and
// 5m) and subst's replacements of the placeholders made, each parsed by
// Prometheus's parser.
func meshRules(t *testing.T, heading string, subst ...string) []rulefmt.Rule {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "envoy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i := strings.Index(s, heading)
	if i < 0 {
		t.Fatalf("envoy/README.md has no %q", heading)
	}
	s = s[i+len(heading):]
	if end := regexp.MustCompile(`\n#{2,4} `).FindStringIndex(s); end != nil {
		s = s[:end[0]] // to the next heading
	}
	s = strings.NewReplacer(subst...).Replace(s)
	var out []rulefmt.Rule
	for _, r := range []struct {
		name string
		for_ time.Duration
	}{{"EdgelimitFailingOpen", 10 * time.Minute}, {"EdgelimitFilterNotDeciding", 5 * time.Minute}} {
		i = strings.Index(s, "# "+r.name)
		if i < 0 {
			t.Fatalf("%s has no %q", heading, "# "+r.name)
		}
		var expr []string
		for _, line := range strings.Split(s[i:], "\n")[1:] {
			if line == "" || strings.HasPrefix(line, "```") {
				break
			}
			if !strings.HasPrefix(line, "#") {
				expr = append(expr, line)
			}
		}
		rule := rulefmt.Rule{Alert: r.name, Expr: strings.Join(expr, "\n"), For: model.Duration(r.for_)}
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(rule.Expr); err != nil {
			t.Fatalf("%s: %s does not parse: %v\n%s", heading, r.name, err, rule.Expr)
		}
		out = append(out, rule)
	}
	return out
}

// mesh is s as an Istio gateway's Envoy (istio true) or an Envoy
// Gateway's exports it (envoy/README.md, "At an Istio gateway" and "On
// Envoy Gateway", says why): each of the filter's request counters a
// family of its own, edgelimit_requests_<decision> and
// edgelimit_requests_failed_open_<reason>. At Istio, shadow_allowed is
// taken by Istio's authz_dry_run_result tag, Istio's http.* stats are left
// out, and every request the gateway handled is in istio_requests_total,
// which a gateway reports as the source (istio.io, "Istio Standard
// Metrics": reporter is source for a client proxy or a gateway), its
// workload the gateway's Deployment (deploy/mesh/istio: edge-gateway); the
// connection manager's downstream_rq_total stands for it, every request
// the listener got. At Envoy Gateway, Envoy's default tags name the
// router's rq_total as the chart's form reads it.
func mesh(s scrape, istio bool) scrape {
	out := scrape{values: map[string]float64{}, lsets: map[string]labels.Labels{}, gauge: map[string]bool{}}
	for key, l := range s.lsets {
		name, v, g := l.Get(labels.MetricName), s.values[key], s.gauge[key]
		b := labels.NewBuilder(l)
		switch {
		case name == "edgelimit_requests":
			b.Del("decision", "reason")
			switch d := l.Get("decision"); {
			case d == "shadow_allowed" && istio:
				b.Set("authz_dry_run_result", "allowed")
			case d == "failed_open":
				b.Set(labels.MetricName, "edgelimit_requests_failed_open_"+l.Get("reason"))
			default:
				b.Set(labels.MetricName, "edgelimit_requests_"+d)
			}
		case name == "envoy_http_downstream_rq_total" && istio:
			b.Del("envoy_http_conn_manager_prefix")
			b.Set(labels.MetricName, "istio_requests_total")
			b.Set("reporter", "source")
			b.Set("source_workload", "edge-gateway")
		case strings.HasPrefix(name, "envoy_http_") && istio:
			continue
		}
		out.add(b.Labels(), v, g)
	}
	return out
}

// TestMeshAlerts: the Istio and Envoy Gateway forms of
// EdgelimitFailingOpen and EdgelimitFilterNotDeciding in envoy/README.md,
// on the binaries' metrics named as each names them: both silent under
// normal traffic; EdgelimitFailingOpen firing with Redis stopped;
// EdgelimitFilterNotDeciding firing when the filter's counters stop, and
// when there are none (at Istio, a WasmPlugin's module that could not be
// fetched: failStrategy FAIL_OPEN runs the gateway without it).
func TestMeshAlerts(t *testing.T) {
	t.Run("istio", func(t *testing.T) { meshAlerts(t, meshRules(t, "#### At an Istio gateway"), true) })
	// The listener prefix, a placeholder there, is envoy.yaml's.
	t.Run("envoy-gateway", func(t *testing.T) {
		meshAlerts(t, meshRules(t, "#### On Envoy Gateway", "<listener prefix>", "edge"), false)
	})
}

func meshAlerts(t *testing.T, rs []rulefmt.Rule, istio bool) {
	s := startStack(t)
	tl := newTimeline()
	const phase = 15 * time.Minute
	// check: the alerts firing at the end of the last phase are want. A
	// phase whose burst had late decisions (calm false: the machine was
	// busy) may fire EdgelimitFailingOpen beside them.
	check := func(what string, calm bool, want ...string) {
		t.Helper()
		got := tl.firing(t, rs, tl.now-phase.Milliseconds())
		t.Logf("%s: firing %v\n%s", what, names(got), dump(got))
		g := names(got)
		if !calm {
			g = slices.DeleteFunc(g, func(n string) bool { return n == "EdgelimitFailingOpen" && !slices.Contains(want, n) })
		}
		if !slices.Equal(g, want) {
			t.Errorf("%s: firing %v, want %v", what, names(got), want)
		}
	}
	a, b, ok := s.calmBurst(t)
	tl.steady(mesh(a, istio), mesh(b, istio), phase)
	check("normal traffic", ok)

	if err := s.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	a = s.scrape(t)
	s.traffic(t, 200)
	b = s.scrape(t)
	tl.steady(mesh(a, istio), mesh(b, istio), phase)
	check("Redis stopped", true, "EdgelimitFailingOpen")
	if err := s.redis.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.healed(t)

	a, b, ok = s.calmBurst(t)
	tl.steady(mesh(a, istio), mesh(frozen(a, b, "edgelimit_requests"), istio), phase)
	check("the filter counting nothing", ok, "EdgelimitFilterNotDeciding")

	a, b, ok = s.calmBurst(t)
	tl.steady(mesh(a, istio), mesh(b, istio), phase)
	check("the filter deciding again", ok)

	a, b, ok = s.calmBurst(t)
	tl.steady(mesh(a.dropped("edgelimit_requests"), istio), mesh(b.dropped("edgelimit_requests"), istio), phase)
	check("the filter exporting no request counters", ok, "EdgelimitFilterNotDeciding")
}
