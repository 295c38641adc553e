package rig

import (
	"math"
	"slices"

	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// CalloutLatency is the histograms a callout's time is read from, at one
// moment: the filter's edgelimit_callout_latency_us (from the callout's
// dispatch to its answer in the VM, summed over the gateways, which
// envoy.yaml gives the same bounds) and the sidecar's
// sidecar_decision_duration_seconds (from reading the check to its
// decision). What a gateway adds to a callout is the difference. Wait is
// the sidecar's sidecar_check_wait_seconds (how long checks waited to be
// read, beyond the quickest trip from the proxy), the part of that
// difference spent waiting for the sidecar.
type CalloutLatency struct{ Filter, Sidecar, Wait Histogram }

// ReadCalloutLatency reads the filter's histogram from each gateway's
// /stats/prometheus and the sidecar's from its /metrics.
func ReadCalloutLatency(b *Backend, gateways ...*harness.Gateway) (CalloutLatency, error) {
	var l CalloutLatency
	for _, g := range gateways {
		m, err := testkit.GetMetrics("http://" + g.Admin + "/stats/prometheus")
		if err != nil {
			return l, err
		}
		l.Filter = l.Filter.Plus(m.Histogram("edgelimit_callout_latency_us"))
	}
	m, err := b.SidecarMetrics()
	if err != nil {
		return l, err
	}
	l.Sidecar = l.Sidecar.Plus(testkit.Metrics(m).Histogram("sidecar_decision_duration_seconds"))
	l.Wait = l.Wait.Plus(testkit.Metrics(m).Histogram("sidecar_check_wait_seconds"))
	return l, nil
}

// Since is what the histograms recorded after earlier.
func (l CalloutLatency) Since(earlier CalloutLatency) CalloutLatency {
	return CalloutLatency{l.Filter.Since(earlier.Filter), l.Sidecar.Since(earlier.Sidecar), l.Wait.Since(earlier.Wait)}
}

// WaitP99 is the 99th percentile of the sidecar's read waits in
// milliseconds, estimated as P99's are.
func (l CalloutLatency) WaitP99() float64 { return l.Wait.Quantile(0.99) * 1000 }

// P99 is each histogram's 99th percentile in milliseconds, estimated from
// its buckets as Prometheus's histogram_quantile does (NaN with no
// samples): good to about a bucket's width.
func (l CalloutLatency) P99() (filter, sidecar float64) {
	return l.Filter.Quantile(0.99) / 1000, l.Sidecar.Quantile(0.99) * 1000
}

// Histogram is a Prometheus histogram's cumulative buckets: bounds and
// counts, the last bound +Inf.
type Histogram struct{ Bounds, Counts []float64 }

// Plus adds buckets with the same bounds (a histogram not yet made by its
// first sample has none, and adds nothing).
func (h Histogram) Plus(bs []testkit.Bucket) Histogram {
	if len(bs) == 0 {
		return h
	}
	if h.Bounds == nil {
		h.Counts = make([]float64, len(bs))
		for _, b := range bs {
			h.Bounds = append(h.Bounds, b.UpperBound)
		}
	}
	out := Histogram{Bounds: h.Bounds, Counts: slices.Clone(h.Counts)}
	for i, b := range bs {
		if i < len(out.Counts) && b.UpperBound == out.Bounds[i] {
			out.Counts[i] += b.Count
		}
	}
	return out
}

// Since is what was recorded after earlier.
func (h Histogram) Since(earlier Histogram) Histogram {
	if earlier.Bounds == nil {
		return h
	}
	out := Histogram{Bounds: h.Bounds, Counts: slices.Clone(h.Counts)}
	for i := range out.Counts {
		if i < len(earlier.Counts) {
			out.Counts[i] -= earlier.Counts[i]
		}
	}
	return out
}

// Quantile estimates the q-quantile in the histogram's unit, NaN with no
// samples.
func (h Histogram) Quantile(q float64) float64 {
	v, ok := stat.HistogramQuantile(h.Bounds, h.Counts, q)
	if !ok {
		return math.NaN()
	}
	return v
}
