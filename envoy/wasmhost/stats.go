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
}

type metric struct {
	kind    MetricType
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
		m = &metric{kind: kind}
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
	Name  string // full name, "wasmcustom.<name>"
	Kind  MetricType
	Value int64 // counter and gauge value; histogram sample count
	Sum   float64
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
		mm := Metric{Name: name, Kind: m.kind, Value: m.value}
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

// WritePrometheus writes the metrics in the Prometheus text format, named as
// Envoy's admin /stats/prometheus names a plugin's metrics: the wasmcustom
// namespace taken off, no envoy_ prefix (Envoy's custom stat namespaces),
// and every character Prometheus does not allow in a name made '_'.
// Histograms get their cumulative buckets, _sum and _count.
func (s *Stats) WritePrometheus(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, m := range s.Snapshot() {
		name := PrometheusName(m.Name)
		switch m.Kind {
		case MetricCounter:
			fmt.Fprintf(bw, "# TYPE %s counter\n%s %d\n", name, name, m.Value)
		case MetricGauge:
			fmt.Fprintf(bw, "# TYPE %s gauge\n%s %d\n", name, name, m.Value)
		case MetricHistogram:
			fmt.Fprintf(bw, "# TYPE %s histogram\n", name)
			for _, b := range m.Buckets {
				le := "+Inf"
				if !math.IsInf(b.UpperBound, 1) {
					le = strconv.FormatFloat(b.UpperBound, 'g', -1, 64)
				}
				fmt.Fprintf(bw, "%s_bucket{le=%q} %d\n", name, le, b.Count)
			}
			fmt.Fprintf(bw, "%s_sum %s\n%s_count %d\n", name, strconv.FormatFloat(m.Sum, 'g', -1, 64), name, m.Value)
		}
	}
	return bw.Flush()
}

// PrometheusName is the name Envoy's /stats/prometheus gives a plugin
// metric of this full name.
func PrometheusName(full string) string {
	b := []byte(strings.TrimPrefix(full, customPrefix))
	for i, c := range b {
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && i > 0) {
			b[i] = '_'
		}
	}
	return string(b)
}
