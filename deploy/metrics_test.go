// Package deploy checks the deployment documents against the software: the
// metric names, and the label values of the filter's request counters,
// that envoy/README.md, the chart's alert rules and the other documents use
// are ones the filter and the sidecar export, as the Envoy of each
// deployment form names them; and every metric they export is in the
// Metrics table of filter/README.md or sidecar/README.md.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/stats"
	"sigs.k8s.io/yaml"
)

// How an Envoy's /stats/prometheus names the filter's metrics depends on
// the stats_tags of its bootstrap.
const (
	// tagged: envoy/envoy.yaml's stats_tags (compose, and the chart, whose
	// bootstrap has the same stats_config): the request counters are one
	// family, edgelimit_requests{decision,reason}.
	tagged = "envoy.yaml's stats_tags"
	// untagged: a bootstrap with none of ours and none that match the
	// filter's names (Envoy Gateway's): one family per counter,
	// edgelimit_requests_<decision>[_<reason>].
	untagged = "no stats_tags"
	// istio: Istio's bootstrap. Its stats_tags (istio/istio
	// tools/packaging/common/envoy_bootstrap.json) are its own; one of them
	// matches a filter metric: authz_dry_run_result, meant for RBAC's
	// shadow_allowed and shadow_denied stats, takes any ".shadow_allowed"
	// or ".shadow_denied" out of any name.
	istio = "Istio's bootstrap"
)

// bootstraps are the stats_tags of each form but tagged (read from
// envoy.yaml).
var bootstraps = map[string]*envoyconfig.Config{
	untagged: {},
	istio: {Tags: []envoyconfig.TagSpecifier{
		{Name: "authz_dry_run_result", Regex: regexp.MustCompile(`(\.shadow_(allowed|denied))`)},
	}},
}

// A document names metrics in the form of its default, or of the form its
// sections give (a Markdown heading and everything under it, down to the
// next heading of the same or a higher level).
type document struct {
	path     string
	form     string
	sections map[string]string // heading text → form
}

// documents name the filter's and the sidecar's metrics.
var documents = []document{
	{path: "../README.md", form: tagged},
	{path: "../filter/README.md", form: tagged},
	{path: "../envoy/README.md", form: tagged, sections: map[string]string{
		"At an Istio gateway": istio,
		"On Envoy Gateway":    untagged,
	}},
	{path: "../envoy/envoy.yaml", form: tagged},
	{path: "helm/edgelimit/values.yaml", form: tagged},
	{path: "helm/edgelimit/templates/prometheusrule.yaml", form: tagged},
	{path: "helm/edgelimit/templates/secret-envoy.yaml", form: tagged},
	{path: "helm/edgelimit/README.md", form: tagged},
	{path: "mesh/istio/README.md", form: istio},
	{path: "mesh/envoy-gateway/README.md", form: untagged},
}

// notMetrics are names of the same shape that are not metrics: the
// filter's configuration fields and the response details of a local 429.
var notMetrics = []string{"sidecar_cluster", "sidecar_authority", "edgelimit_rate_limited_local"}

// names is what one form exports.
type names struct {
	// families are the Prometheus names (a histogram's also with _bucket,
	// _sum and _count), the filter's and the sidecar's.
	families []string
	// labels are the tags of the filter's metrics by family: tag name →
	// the values it takes.
	labels map[string]map[string][]string
}

// exported returns, for each form, every metric name as Envoy's
// /stats/prometheus and the sidecar's /metrics write them, and every name
// of the filter's as Envoy's /stats writes it (wasmcustom.<name>, the same
// in every form).
func exported(t *testing.T) (forms map[string]*names, dotted []string) {
	t.Helper()
	shipped, err := envoyconfig.Load("../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	configs := map[string]*envoyconfig.Config{tagged: shipped}
	for f, c := range bootstraps {
		configs[f] = c
	}
	sidecar := sidecarNames(t)
	forms = map[string]*names{}
	for f, c := range configs {
		n := &names{labels: map[string]map[string][]string{}}
		for _, m := range limiter.MetricNames() {
			extracted, tags := c.TagsFor("wasmcustom." + m)
			family, ok := wasmhost.PrometheusName(extracted)
			if !ok {
				t.Fatalf("%s: %s (tag-extracted %s) is not exported", f, m, extracted)
			}
			if !slices.Contains(n.families, family) {
				n.families = append(n.families, family)
				if m == limiter.MetricCalloutLatency {
					n.families = append(n.families, family+"_bucket", family+"_sum", family+"_count")
				}
			}
			for _, tag := range tags {
				if n.labels[family] == nil {
					n.labels[family] = map[string][]string{}
				}
				if !slices.Contains(n.labels[family][tag.Name], tag.Value) {
					n.labels[family][tag.Name] = append(n.labels[family][tag.Name], tag.Value)
				}
			}
		}
		for _, s := range sidecar {
			if !slices.Contains(n.families, s) {
				n.families = append(n.families, s)
			}
		}
		forms[f] = n
	}
	for _, m := range limiter.MetricNames() {
		dotted = append(dotted, "wasmcustom."+m)
	}
	return forms, dotted
}

// sidecarSeries is the sidecar's /metrics, parsed, with a sample in each
// histogram (a histogram is written once it has one).
func sidecarSeries(t *testing.T) testkit.Metrics {
	t.Helper()
	s := stats.New()
	s.Latency.Update(0.001)
	s.Wait.Update(0.001)
	s.ObserveBatch(1)
	var buf bytes.Buffer
	s.WritePrometheus(&buf)
	m, err := testkit.ParseMetrics(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sidecarNames are the names of the sidecar's /metrics.
func sidecarNames(t *testing.T) []string {
	t.Helper()
	m := sidecarSeries(t)
	var out []string
	for series := range m {
		name, _, _ := strings.Cut(series, "{")
		// A histogram is also named without its _bucket, _sum, _count.
		for _, n := range []string{name, strings.TrimSuffix(name, "_bucket")} {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// TestExportedForms: the names the check below holds the documents to are
// the ones each form's Envoy exports, derived through envoyconfig's
// TagsFor and wasmhost's PrometheusName from the filter's metric names.
func TestExportedForms(t *testing.T) {
	forms, _ := exported(t)
	req := forms[tagged].labels["edgelimit_requests"]
	for _, d := range []string{"allowed", "denied", "shadow_allowed", "shadow_would_deny", "failed_open", "local_allowed", "local_denied"} {
		if !slices.Contains(req["decision"], d) {
			t.Errorf("tagged: decision %q missing from %v", d, req["decision"])
		}
	}
	if !slices.Contains(req["reason"], "timeout") || slices.Contains(req["reason"], "failed_open") {
		t.Errorf("tagged: reasons %v", req["reason"])
	}
	if slices.ContainsFunc(forms[tagged].families, func(f string) bool { return strings.HasPrefix(f, "edgelimit_requests_") }) {
		t.Errorf("tagged: a request counter not in the family: %v", forms[tagged].families)
	}
	for _, f := range []string{"edgelimit_requests_allowed", "edgelimit_requests_failed_open_timeout", "edgelimit_requests_shadow_allowed"} {
		if !slices.Contains(forms[untagged].families, f) {
			t.Errorf("untagged: %s missing from %v", f, forms[untagged].families)
		}
	}
	if got := forms[istio].labels["edgelimit_requests"]; !slices.Equal(got["authz_dry_run_result"], []string{"allowed"}) || len(got) != 1 {
		t.Errorf("istio: edgelimit_requests labels %v, want authz_dry_run_result allowed (shadow_allowed) only", got)
	}
	if slices.Contains(forms[istio].families, "edgelimit_requests_shadow_allowed") || !slices.Contains(forms[istio].families, "edgelimit_requests_shadow_would_deny") {
		t.Errorf("istio: families %v", forms[istio].families)
	}
}

// TestDocumentedMetricsExist: in each document, every edgelimit_* and
// sidecar_* name (a trailing _ is a prefix, as in a __name__ regex) is a
// family its form exports, every wasmcustom.edgelimit.* name one the filter
// defines, and every matcher on a tag of the filter's metrics (decision,
// reason, ...) names a tag of that form with a value it takes.
func TestDocumentedMetricsExist(t *testing.T) {
	forms, dotted := exported(t)
	seen := 0
	for _, doc := range documents {
		raw, err := os.ReadFile(doc.path)
		if err != nil {
			t.Fatal(err)
		}
		segs, missing := segments(doc, string(raw))
		for _, h := range missing {
			t.Errorf("%s: no section %q", doc.path, h)
		}
		for _, s := range segs {
			n, problems := check(forms, s.form, dotted, s.text)
			seen += n
			for _, p := range problems {
				t.Errorf("%s (%s): %s", doc.path, s.form, p)
			}
		}
	}
	if seen < 80 {
		t.Errorf("found %d metric names and label matchers in the documents: the documents or the patterns changed", seen)
	}
}

// TestCheckRefuses: the check fails a stale or mistyped name, label or
// value, and passes what each form exports.
func TestCheckRefuses(t *testing.T) {
	forms, dotted := exported(t)
	for _, c := range []struct {
		form, text string
		ok         bool
	}{
		{tagged, `sum(rate(edgelimit_requests{decision="failed_open",reason="timeout"}[5m]))`, true},
		{tagged, `rate(edgelimit_requests{decision!~"local_.*"}[5m])`, true},
		{tagged, `edgelimit_requests{decision=~"denied|denied_cached"}`, true},
		{tagged, "`edgelimit_requests_denied`", false},
		{tagged, `{__name__=~"edgelimit_requests_.+"}`, false},
		{tagged, `edgelimit_requests{decision="denyed"}`, false},
		{tagged, `edgelimit_requests{decision=~"denied|denyed"}`, false},
		{tagged, `edgelimit_requests{reason="slow"}`, false},
		{tagged, `edgelimit_breaker_state{decision="allowed"}`, false},
		{tagged, `edgelimit_requests{authz_dry_run_result="allowed"}`, false},
		{tagged, "`wasmcustom.edgelimit.requests.failed_open.timeout`", true},
		{tagged, "`wasmcustom.edgelimit.requests.failed_open.slow`", false},
		{untagged, `{__name__=~"edgelimit_requests_failed_open_.+"}`, true},
		{untagged, "`edgelimit_requests_failed_open_timeout`", true},
		{untagged, `edgelimit_requests{decision="allowed"}`, false},
		{istio, `edgelimit_requests{authz_dry_run_result="allowed"}`, true},
		{istio, "`edgelimit_requests_shadow_would_deny`", true},
		{istio, "`edgelimit_requests_shadow_allowed`", false},
		{istio, `edgelimit_requests{decision="failed_open"}`, false},
	} {
		n, problems := check(forms, c.form, dotted, c.text)
		if n == 0 || (len(problems) == 0) != c.ok {
			t.Errorf("%s: %s: %d found, problems %q; want ok %t", c.form, c.text, n, problems, c.ok)
		}
	}
}

// TestEnvoyGatewayStatsConfig: the bootstrap that mesh/envoy-gateway's
// README offers to add to the example's EnvoyProxy merges envoy.yaml's
// stats_config into Envoy Gateway's bootstrap, exactly.
func TestEnvoyGatewayStatsConfig(t *testing.T) {
	raw, err := os.ReadFile("mesh/envoy-gateway/README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(  bootstrap:\n.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal("no EnvoyProxy spec.bootstrap in mesh/envoy-gateway/README.md")
	}
	var proxy struct {
		Spec struct {
			Bootstrap struct{ Type, Value string }
		}
	}
	if err := yaml.UnmarshalStrict(append([]byte("spec:\n"), m[1]...), &proxy); err != nil {
		t.Fatalf("EnvoyProxy spec: %v", err)
	}
	var merged, shipped map[string]any
	if err := yaml.Unmarshal([]byte(proxy.Spec.Bootstrap.Value), &merged); err != nil {
		t.Fatalf("bootstrap value: %v", err)
	}
	boot, err := os.ReadFile("../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(boot, &shipped); err != nil {
		t.Fatal(err)
	}
	if proxy.Spec.Bootstrap.Type != "Merge" || len(merged) != 1 || !reflect.DeepEqual(merged["stats_config"], shipped["stats_config"]) {
		t.Errorf("EnvoyProxy bootstrap %s:\n%s\nwant Merge of envoy.yaml's stats_config only:\n%v", proxy.Spec.Bootstrap.Type, proxy.Spec.Bootstrap.Value, shipped["stats_config"])
	}
}

var (
	promRE   = regexp.MustCompile(`\b(?:edgelimit|sidecar)_[a-z0-9_]*`)
	dottedRE = regexp.MustCompile(`wasmcustom\.edgelimit\.[a-z0-9_.]*`)
	// matcherRE is a label matcher: name, operator, value.
	matcherRE = regexp.MustCompile(`\b([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	// selectorRE is a family's selector, edgelimit_requests{...}.
	selectorRE = regexp.MustCompile(`\b((?:edgelimit|sidecar)_[a-z0-9_]*)\{([^{}]*)\}`)
	headingRE  = regexp.MustCompile(`^(#+)\s+(.*?)\s*$`)
)

type segment struct{ form, text string }

// segments cuts a document into runs of lines of one form, and returns the
// section headings doc names that it does not have.
func segments(doc document, text string) ([]segment, []string) {
	var segs []segment
	form, level := doc.form, 0 // level: of the heading that set form; 0 none
	found := map[string]bool{}
	var cur strings.Builder
	fenced := false // inside a ``` block, whose # lines are no headings
	flush := func() {
		if cur.Len() > 0 {
			segs = append(segs, segment{form, cur.String()})
			cur.Reset()
		}
	}
	markdown := strings.HasSuffix(doc.path, ".md")
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if m := headingRE.FindStringSubmatch(line); m != nil && markdown && !fenced {
			l := len(m[1])
			next := form
			if level > 0 && l <= level {
				next, level = doc.form, 0
			}
			if f, ok := doc.sections[m[2]]; ok {
				next, level = f, l
				found[m[2]] = true
			}
			if next != form {
				flush()
				form = next
			}
		}
		cur.WriteString(line)
	}
	flush()
	var missing []string
	for h := range doc.sections {
		if !found[h] {
			missing = append(missing, h)
		}
	}
	slices.Sort(missing)
	return segs, missing
}

// check holds text to what form exports; it returns how many names and
// matchers it checked and what is wrong.
func check(forms map[string]*names, form string, dotted []string, text string) (int, []string) {
	n := forms[form]
	var problems []string
	seen := 0
	for _, c := range []struct {
		re    *regexp.Regexp
		names []string
	}{{promRE, n.families}, {dottedRE, dotted}} {
		for _, name := range c.re.FindAllString(text, -1) {
			if slices.Contains(notMetrics, name) {
				continue
			}
			seen++
			prefix := strings.HasSuffix(name, "_") || strings.HasSuffix(name, ".")
			if !slices.ContainsFunc(c.names, func(e string) bool { return e == name || prefix && strings.HasPrefix(e, name) }) {
				problems = append(problems, fmt.Sprintf("names %q, which neither the filter nor the sidecar exports in this form", name))
			}
		}
	}
	// Every tag name of every form: a matcher on one of these is on the
	// filter's labels (others are the scrape's: pod, job, le, result...).
	tagNames := map[string]bool{}
	all := map[string][]string{} // this form's tags, over its families
	for f, fn := range forms {
		for _, tags := range fn.labels {
			for name, values := range tags {
				tagNames[name] = true
				if f == form {
					all[name] = append(all[name], values...)
				}
			}
		}
	}
	// Matchers in a family's selector are held to that family's tags, the
	// others to the form's.
	inSelector := map[int]string{} // matcher offset → family
	for _, m := range selectorRE.FindAllStringSubmatchIndex(text, -1) {
		family := text[m[2]:m[3]]
		for _, mm := range matcherRE.FindAllStringIndex(text[m[4]:m[5]], -1) {
			inSelector[m[4]+mm[0]] = family
		}
	}
	for _, m := range matcherRE.FindAllStringSubmatchIndex(text, -1) {
		label, op, value := text[m[2]:m[3]], text[m[4]:m[5]], text[m[6]:m[7]]
		if !tagNames[label] {
			continue
		}
		seen++
		tags, where := all, "this form's metrics"
		if family, ok := inSelector[m[0]]; ok {
			tags, where = n.labels[family], family
		}
		values, ok := tags[label]
		if !ok {
			problems = append(problems, fmt.Sprintf("matches on label %s, which %s does not have", label, where))
			continue
		}
		if op == "=" || op == "!=" {
			if !slices.Contains(values, value) {
				problems = append(problems, fmt.Sprintf("%s%s%q: %s takes %v", label, op, value, label, values))
			}
			continue
		}
		// A regex: each alternative must match one of the values.
		for _, alt := range alternatives(value) {
			re, err := regexp.Compile("^(?:" + alt + ")$")
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s%s%q: %v", label, op, value, err))
				continue
			}
			if !slices.ContainsFunc(values, re.MatchString) {
				problems = append(problems, fmt.Sprintf("%s%s%q: %q matches none of %v", label, op, value, alt, values))
			}
		}
	}
	return seen, problems
}

// alternatives splits a regex at its top-level |s.
func alternatives(re string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(re); i++ {
		switch re[i] {
		case '\\':
			i++
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case '|':
			if depth == 0 {
				out = append(out, re[start:i])
				start = i + 1
			}
		}
	}
	return append(out, re[start:])
}

// TestExportedMetricsDocumented: the other way round, every metric the
// filter defines has its row in filter/README.md's Metrics table (a
// failed_open reason in the row of failed_open.<reason>), and every series
// of the sidecar's /metrics but the Go runtime's and the process's (go_*,
// process_*) has its family's row in sidecar/README.md's, with each of its
// label values there quoted (but sidecar_build_info's, which are versions,
// and a histogram's le).
func TestExportedMetricsDocumented(t *testing.T) {
	rows := func(path string) []string {
		t.Helper()
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, section, ok := strings.Cut(string(raw), "\n## Metrics\n")
		if !ok {
			t.Fatalf("%s: no section Metrics", path)
		}
		if i := strings.Index(section, "\n## "); i >= 0 {
			section = section[:i]
		}
		var out []string
		for _, line := range strings.Split(section, "\n") {
			if strings.HasPrefix(line, "| `") {
				out = append(out, line)
			}
		}
		return out
	}
	// row returns the first cell of rows that names name in backticks, and
	// the whole row.
	row := func(rows []string, name string) (string, bool) {
		for _, r := range rows {
			cells := strings.Split(r, " | ")
			if strings.Contains(cells[0], "`"+name+"`") || strings.Contains(cells[0], "`"+name+"{") {
				return r, true
			}
		}
		return "", false
	}

	filterRows := rows("../filter/README.md")
	for _, m := range limiter.MetricNames() {
		if reason, ok := strings.CutPrefix(m, limiter.MetricFailedOpenPrefix); ok {
			r, found := row(filterRows, limiter.MetricFailedOpenPrefix+"<reason>")
			if !found || !strings.Contains(r, "`"+reason+"`") {
				t.Errorf("filter/README.md: %s: no `%s` in the row of %s<reason>", m, reason, limiter.MetricFailedOpenPrefix)
			}
			continue
		}
		if _, found := row(filterRows, m); !found {
			t.Errorf("filter/README.md: %s has no row in Metrics", m)
		}
	}

	sidecarRows := rows("../sidecar/README.md")
	m := sidecarSeries(t)
	labelRE := regexp.MustCompile(`([a-z_]+)="([^"]*)"`)
	n := 0
	for series := range m {
		name, labels, _ := strings.Cut(series, "{")
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		n++
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, suffix)
		}
		r, found := row(sidecarRows, name)
		if !found {
			t.Errorf("sidecar/README.md: %s has no row in Metrics", name)
			continue
		}
		if name == "sidecar_build_info" {
			continue
		}
		for _, l := range labelRE.FindAllStringSubmatch(labels, -1) {
			if l[1] != "le" && !strings.Contains(r, `"`+l[2]+`"`) {
				t.Errorf("sidecar/README.md: %s: its row does not name %s=%q", series, l[1], l[2])
			}
		}
	}
	if n < 20 {
		t.Errorf("%d series of the sidecar's own: the test no longer reads its /metrics", n)
	}
}
