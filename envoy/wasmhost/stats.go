package wasmhost

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Stats holds the metrics plugins define, by full name. Like an Envoy stats
// scope it is shared by every worker's VM: two VMs defining the same name
// update one metric. Names are stored as Envoy exposes them, with the
// "wasmcustom." prefix.
type Stats struct {
	mu      sync.Mutex
	metrics map[string]*metric
	buckets func(name string) []float64 // a histogram's bucket bounds by full name; nil: Envoy's defaults
	tags    func(name string) (string, []Tag)
}

// Tag is one tag of a metric, a label in the Prometheus format: a name
// from the bootstrap's stats_tags and the value it took from the metric's
// name.
type Tag struct{ Name, Value string }

type metric struct {
	kind    MetricType
	tagged  string // the full name without what its tags took out of it
	tags    []Tag
	value   int64     // counter, gauge
	count   int64     // histogram samples recorded
	sum     float64   // histogram
	samples []float64 // histogram, the most recent maxSamples, a ring
	next    int       // where the ring's next sample goes once it is full
	bounds  []float64 // histogram bucket upper bounds, ascending
	counts  []int64   // samples per bucket (not cumulative); one more for above the last bound
}

// DefaultBuckets are Envoy's default histogram bucket bounds (the
// bootstrap's stats_config.histogram_bucket_settings replaces them for the
// histograms it matches).
var DefaultBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

// SetHistogramBuckets sets how the bucket bounds of a histogram defined from
// now on are chosen, by its full name ("wasmcustom.<name>"): what f returns
// (ascending, as envoyconfig gives them), or DefaultBuckets when it returns
// nil. Envoy fixes a histogram's buckets when the stat is made, from the
// bootstrap; so does this.
func (s *Stats) SetHistogramBuckets(f func(name string) []float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buckets = f
}

// SetTagExtractor sets how a metric defined from now on is tagged, by its
// full name: f returns the name with the tags' parts taken out (Envoy's
// tag-extracted name) and the tags, in order, as the bootstrap's
// stats_config.stats_tags give them (envoyconfig's TagsFor). Without one a
// metric has no tags. Envoy tags a stat when it is made; so does this.
func (s *Stats) SetTagExtractor(f func(name string) (string, []Tag)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags = f
}

// maxSamples bounds the memory a histogram keeps for its quantiles.
const maxSamples = 4096

// customPrefix is the namespace Envoy puts plugin-defined metrics in.
const customPrefix = "wasmcustom."

// NewStats returns an empty metrics store.
func NewStats() *Stats { return &Stats{metrics: map[string]*metric{}} }

// define returns the metric of that name, creating it. A name already
// defined with another kind keeps its first kind; the caller gets it anyway,
// as Envoy's scope would hand out two stats of the same name.
func (s *Stats) define(kind MetricType, name string) *metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	full := customPrefix + name
	m := s.metrics[full]
	if m == nil {
		m = &metric{kind: kind, tagged: full}
		if s.tags != nil {
			m.tagged, m.tags = s.tags(full)
		}
		if kind == MetricHistogram {
			if s.buckets != nil {
				m.bounds = s.buckets(full)
			}
			if m.bounds == nil {
				m.bounds = DefaultBuckets
			}
			m.counts = make([]int64, len(m.bounds)+1)
		}
		s.metrics[full] = m
	}
	return m
}

func (s *Stats) add(m *metric, d int64) {
	s.mu.Lock()
	m.value += d
	s.mu.Unlock()
}

func (s *Stats) set(m *metric, v int64) {
	s.mu.Lock()
	m.value = v
	s.mu.Unlock()
}

func (s *Stats) record(m *metric, v uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m.count++
	m.sum += float64(v)
	// A bucket counts the samples at or below its bound (Prometheus's le).
	m.counts[sort.SearchFloat64s(m.bounds, float64(v))]++
	// A ring: shifting the window by one on every sample was 4096 copies
	// per record, the largest cost of a request in the host's profile.
	if len(m.samples) < maxSamples {
		m.samples = append(m.samples, float64(v))
		return
	}
	m.samples[m.next] = float64(v)
	m.next = (m.next + 1) % maxSamples
}

func (s *Stats) get(m *metric) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m.value
}

// Value returns a metric by its plugin-given name (without "wasmcustom."):
// a counter's or gauge's value, a histogram's sample count.
func (s *Stats) Value(name string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.metrics[customPrefix+name]
	if !ok {
		return 0, false
	}
	if m.kind == MetricHistogram {
		return m.count, true
	}
	return m.value, true
}

// Metric is one metric in a snapshot.
type Metric struct {
	Name string // full name, "wasmcustom.<name>"
	// TagExtractedName is Name without the parts its Tags were taken from.
	TagExtractedName string
	Tags             []Tag
	Kind             MetricType
	Value            int64 // counter and gauge value; histogram sample count
	Sum              float64
	// Quantiles of a histogram's recent samples at 0, 25, 50, 75, 90, 95,
	// 99, 99.5, 99.9 and 100 percent; NaN when there are none.
	Quantiles []float64
	// Buckets of a histogram since it was made: each bound with the count
	// of samples at or below it (cumulative), the last one +Inf.
	Buckets []Bucket
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound float64
	Count      int64
}

// quantilePoints are the quantiles Envoy's /stats prints for a histogram.
var quantilePoints = []float64{0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100}

// Snapshot returns every metric, sorted by name.
func (s *Stats) Snapshot() []Metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Metric, 0, len(s.metrics))
	for name, m := range s.metrics {
		mm := Metric{Name: name, TagExtractedName: m.tagged, Tags: m.tags, Kind: m.kind, Value: m.value}
		if m.kind == MetricHistogram {
			mm.Value = m.count
			mm.Sum = m.sum
			mm.Quantiles = quantiles(m.samples)
			var n int64
			for i, c := range m.counts {
				n += c
				le := math.Inf(1)
				if i < len(m.bounds) {
					le = m.bounds[i]
				}
				mm.Buckets = append(mm.Buckets, Bucket{le, n})
			}
		}
		out = append(out, mm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func quantiles(samples []float64) []float64 {
	q := make([]float64, len(quantilePoints))
	if len(samples) == 0 {
		for i := range q {
			q[i] = math.NaN()
		}
		return q
	}
	sorted := append([]float64(nil), samples...)
	sort.Float64s(sorted)
	for i, p := range quantilePoints {
		idx := int(math.Ceil(p/100*float64(len(sorted)))) - 1
		if idx < 0 {
			idx = 0
		}
		q[i] = sorted[idx]
	}
	return q
}

// WriteText writes the metrics in the text format of Envoy's admin /stats:
// one "name: value" line per counter and gauge, and for a histogram its
// quantiles as "P0(v,v) P25(v,v) ..." (interval and cumulative alike, as
// this host keeps no intervals).
func (s *Stats) WriteText(w io.Writer) error {
	for _, m := range s.Snapshot() {
		var err error
		if m.Kind != MetricHistogram {
			_, err = fmt.Fprintf(w, "%s: %d\n", m.Name, m.Value)
		} else {
			_, err = fmt.Fprintf(w, "%s: %s\n", m.Name, formatQuantiles(m.Quantiles))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func formatQuantiles(q []float64) string {
	out := ""
	for i, p := range quantilePoints {
		if i > 0 {
			out += " "
		}
		v := "nan"
		if !math.IsNaN(q[i]) {
			v = fmt.Sprintf("%g", q[i])
		}
		out += fmt.Sprintf("P%g(%s,%s)", p, v, v)
	}
	return out
}

// WritePrometheus writes the metrics in the Prometheus text format as
// Envoy's admin /stats/prometheus does: counters, then gauges, then
// histograms; within each, one family per tag-extracted name (sorted), its
// metrics sorted by full name, each with its tags as labels
// (`edgelimit_requests{decision="allowed"} 3`, `{}` when it has none).
// PrometheusName names a family. Histograms get their cumulative buckets
// (le last among the labels), _sum and _count; bounds and sums are written
// as Envoy's %.32g writes them.
func (s *Stats) WritePrometheus(w io.Writer) error {
	bw := bufio.NewWriter(w)
	snap := s.Snapshot() // sorted by full name
	for _, kind := range []MetricType{MetricCounter, MetricGauge, MetricHistogram} {
		families := map[string][]Metric{}
		var names []string
		for _, m := range snap {
			if m.Kind != kind {
				continue
			}
			if _, ok := families[m.TagExtractedName]; !ok {
				names = append(names, m.TagExtractedName)
			}
			families[m.TagExtractedName] = append(families[m.TagExtractedName], m)
		}
		sort.Strings(names)
		for _, extracted := range names {
			name, ok := PrometheusName(extracted)
			if !ok {
				continue
			}
			fmt.Fprintf(bw, "# TYPE %s %s\n", name, promType(kind))
			for _, m := range families[extracted] {
				tags := formatTags(m.Tags)
				if kind != MetricHistogram {
					fmt.Fprintf(bw, "%s{%s} %d\n", name, tags, m.Value)
					continue
				}
				sep := ""
				if tags != "" {
					sep = ","
				}
				for _, b := range m.Buckets {
					le := "+Inf"
					if !math.IsInf(b.UpperBound, 1) {
						le = strconv.FormatFloat(b.UpperBound, 'g', 32, 64)
					}
					fmt.Fprintf(bw, "%s_bucket{%s%sle=\"%s\"} %d\n", name, tags, sep, le, b.Count)
				}
				fmt.Fprintf(bw, "%s_sum{%s} %s\n%s_count{%s} %d\n", name, tags, strconv.FormatFloat(m.Sum, 'g', 32, 64), name, tags, m.Value)
			}
		}
	}
	return bw.Flush()
}

func promType(k MetricType) string {
	switch k {
	case MetricCounter:
		return "counter"
	case MetricGauge:
		return "gauge"
	}
	return "histogram"
}

// PrometheusName is the family name Envoy's /stats/prometheus gives a
// metric of this tag-extracted name: a plugin's metric (in the wasmcustom
// namespace) without the namespace and without the envoy_ prefix, any
// other name with it; every character Prometheus does not allow in a name
// made '_'. A plugin's metric whose name would then be empty or start with
// a digit is not exported at all (ok false), as in Envoy.
func PrometheusName(tagExtracted string) (string, bool) {
	if rest, ok := strings.CutPrefix(tagExtracted, customPrefix); ok {
		name := sanitize(rest)
		if name == "" || name[0] >= '0' && name[0] <= '9' {
			return "", false
		}
		return name, true
	}
	return "envoy_" + sanitize(tagExtracted), true
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// labelValue escapes a tag's value as Envoy does for the text format.
var labelValue = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func formatTags(tags []Tag) string {
	var b strings.Builder
	for i, t := range tags {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(sanitize(t.Name))
		b.WriteString(`="`)
		labelValue.WriteString(&b, t.Value)
		b.WriteByte('"')
	}
	return b.String()
}
