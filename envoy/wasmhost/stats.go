package wasmhost

import (
	"fmt"
	"io"
	"math"
	"sort"
	"sync"
)

// Stats holds the metrics plugins define, by full name. Like an Envoy stats
// scope it is shared by every worker's VM: two VMs defining the same name
// update one metric. Names are stored as Envoy exposes them, with the
// "wasmcustom." prefix.
type Stats struct {
	mu      sync.Mutex
	metrics map[string]*metric
}

type metric struct {
	kind    MetricType
	value   int64     // counter, gauge
	count   int64     // histogram samples recorded
	sum     float64   // histogram
	samples []float64 // histogram, the most recent maxSamples, a ring
	next    int       // where the ring's next sample goes once it is full
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
