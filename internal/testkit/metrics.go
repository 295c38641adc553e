package testkit

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics are the samples of a page in the Prometheus text format, keyed by
// series as the format writes them: the metric name, then the labels in
// the order the page gives them, comma-separated without spaces, e.g.
// `sidecar_decisions_total{result="allowed"}` or
// `sidecar_pipeline_batch_size_bucket{le="+Inf"}`. A histogram or a summary
// gives one sample per bucket or quantile (its le or quantile label last,
// the bound written as the format writes numbers), and its _sum and _count
// where the page has them.
type Metrics map[string]float64

// ParseMetrics reads a page in the Prometheus text exposition format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := Metrics{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := m.GetLabel()
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[series(name, labels, "", "")] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[series(name, labels, "", "")] = m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				out[series(name, labels, "", "")] = m.GetUntyped().GetValue()
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					out[series(name, labels, model.QuantileLabel, formatFloat(q.GetQuantile()))] = q.GetValue()
				}
				sumCount(out, name, labels, s.SampleSum, s.SampleCount)
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					out[series(name+"_bucket", labels, model.BucketLabel, formatFloat(b.GetUpperBound()))] = float64(b.GetCumulativeCount())
				}
				sumCount(out, name, labels, h.SampleSum, h.SampleCount)
			default:
				return nil, fmt.Errorf("metric %s: type %v is not in the text format", name, f.GetType())
			}
		}
	}
	return out, nil
}

// GetMetrics fetches url (a /metrics page) and parses it.
func GetMetrics(url string) (Metrics, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	m, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return m, nil
}

// sumCount records a histogram's or a summary's _sum and _count, each only
// if the page has it.
func sumCount(out Metrics, name string, labels []*dto.LabelPair, sum *float64, count *uint64) {
	if sum != nil {
		out[series(name+"_sum", labels, "", "")] = *sum
	}
	if count != nil {
		out[series(name+"_count", labels, "", "")] = float64(*count)
	}
}

// series writes a sample's key: name, then labels as given, then the extra
// label (le or quantile) when there is one.
func series(name string, labels []*dto.LabelPair, extra, extraValue string) string {
	if len(labels) == 0 && extra == "" {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	sep := ""
	for _, l := range labels {
		b.WriteString(sep)
		writeLabel(&b, l.GetName(), l.GetValue())
		sep = ","
	}
	if extra != "" {
		b.WriteString(sep)
		writeLabel(&b, extra, extraValue)
	}
	b.WriteByte('}')
	return b.String()
}

// labelEscaper escapes a label value as the text format does.
var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func writeLabel(b *strings.Builder, name, value string) {
	b.WriteString(name)
	b.WriteString(`="`)
	labelEscaper.WriteString(b, value)
	b.WriteByte('"')
}

// formatFloat writes an le or quantile value as the text format does.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, +1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// Bucket is one cumulative bucket of a histogram: the samples at or below
// UpperBound (+Inf for the last).
type Bucket struct {
	UpperBound float64
	Count      float64
}

// Histogram returns the buckets of the histogram name (the series
// name_bucket{le=...}, without other labels), sorted by bound; nil if the
// page has none.
func (m Metrics) Histogram(name string) []Bucket {
	prefix := name + `_bucket{le="`
	var out []Bucket
	for k, v := range m {
		le, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		b, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		out = append(out, Bucket{b, v})
	}
	slices.SortFunc(out, func(a, b Bucket) int { return cmp.Compare(a.UpperBound, b.UpperBound) })
	return out
}
