// Package deploy checks the deployment documents against the software: the
// metric names that envoy/README.md and the chart's alert rules use are
// ones the filter and the sidecar export.
package deploy

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// documents name the filter's and the sidecar's metrics.
var documents = []string{
	"../README.md",
	"../envoy/README.md",
	"../envoy/envoy.yaml",
	"helm/edgelimit/values.yaml",
	"helm/edgelimit/templates/prometheusrule.yaml",
	"helm/edgelimit/README.md",
	"mesh/istio/README.md",
	"mesh/envoy-gateway/README.md",
}

// notMetrics are names of the same shape that are not metrics: the
// filter's configuration fields.
var notMetrics = []string{"sidecar_cluster", "sidecar_authority"}

// exported returns every metric name as Envoy's /stats/prometheus and the
// sidecar's /metrics write them, and as Envoy's /stats writes the filter's
// (wasmcustom.<name>).
func exported(t *testing.T) (prom, dotted []string) {
	t.Helper()
	for _, n := range limiter.MetricNames() {
		dotted = append(dotted, "wasmcustom."+n)
		p := wasmhost.PrometheusName("wasmcustom." + n)
		prom = append(prom, p)
		if n == limiter.MetricCalloutLatency {
			prom = append(prom, p+"_bucket", p+"_sum", p+"_count")
		}
	}
	s := stats.New()
	s.Latency.Update(0.001) // a histogram is written once it has a sample
	s.ObserveBatch(1)
	var buf bytes.Buffer
	s.WritePrometheus(&buf)
	m, err := testkit.ParseMetrics(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for series := range m {
		name, _, _ := strings.Cut(series, "{")
		// A histogram is also named without its _bucket, _sum, _count.
		for _, n := range []string{name, strings.TrimSuffix(name, "_bucket")} {
			if !slices.Contains(prom, n) {
				prom = append(prom, n)
			}
		}
	}
	return prom, dotted
}

// TestDocumentedMetricsExist: every edgelimit_* and sidecar_* name (a
// trailing _ is a prefix, as in a __name__ regex) and every
// wasmcustom.edgelimit.* name in the documents is one the software exports.
func TestDocumentedMetricsExist(t *testing.T) {
	prom, dotted := exported(t)
	promRE := regexp.MustCompile(`\b(?:edgelimit|sidecar)_[a-z0-9_]*`)
	dottedRE := regexp.MustCompile(`wasmcustom\.edgelimit\.[a-z0-9_.]*`)
	seen := 0
	for _, doc := range documents {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			re    *regexp.Regexp
			names []string
		}{{promRE, prom}, {dottedRE, dotted}} {
			for _, name := range c.re.FindAllString(string(raw), -1) {
				if slices.Contains(notMetrics, name) {
					continue
				}
				seen++
				prefix := strings.HasSuffix(name, "_") || strings.HasSuffix(name, ".")
				ok := slices.ContainsFunc(c.names, func(n string) bool {
					return n == name || prefix && strings.HasPrefix(n, name)
				})
				if !ok {
					t.Errorf("%s names %q, which neither the filter nor the sidecar exports", doc, name)
				}
			}
		}
	}
	if seen < 50 {
		t.Errorf("found %d metric names in %v: the documents or the patterns changed", seen, documents)
	}
}
