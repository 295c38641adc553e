// Package stat computes what the benchmark tables report: percentiles of
// latencies and medians over repeated runs.
package stat

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for no values. ds is not modified.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[rank(len(s), p)]
}

// Percentiles returns several percentiles of ds with one sort.
func Percentiles(ds []time.Duration, ps ...float64) []time.Duration {
	out := make([]time.Duration, len(ps))
	if len(ds) == 0 {
		return out
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	for i, p := range ps {
		out[i] = s[rank(len(s), p)]
	}
	return out
}

func rank(n int, p float64) int {
	r := int(math.Ceil(p/100*float64(n))) - 1
	return min(max(r, 0), n-1)
}

// PercentilesMs is Percentiles in milliseconds, each NaN when ds is empty:
// a run in which nothing was answered has no latency, and a check that
// reads one must fail rather than read 0.
func PercentilesMs(ds []time.Duration, ps ...float64) []float64 {
	out := make([]float64, len(ps))
	for i, d := range Percentiles(ds, ps...) {
		out[i] = Ms(d)
		if len(ds) == 0 {
			out[i] = math.NaN()
		}
	}
	return out
}

// Median returns the median of xs (the mean of the middle two for an even
// count), NaN for none and NaN when any of xs is: a run without a value
// is not left out of the runs it is the median of, which would hide it.
// xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 || slices.ContainsFunc(xs, math.IsNaN) {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Join formats each of xs with prec decimals and joins them with sep: the
// runs behind a median, as the reports list them.
func Join(xs []float64, prec int, sep string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(parts, sep)
}

// MedianDuration is Median for durations.
func MedianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(Median(xs))
}

// Ms returns d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// HistogramQuantile estimates the q-quantile (0 < q <= 1) of a histogram
// from its cumulative buckets (ascending bounds, the last +Inf), as
// Prometheus's histogram_quantile does: the rank q × count falls in one
// bucket, and the value is interpolated linearly between that bucket's
// lower and upper bound (0 below the first). A rank in the +Inf bucket
// gives the last finite bound. ok is false for an empty histogram.
func HistogramQuantile(bounds, cumulative []float64, q float64) (v float64, ok bool) {
	if len(bounds) == 0 || len(bounds) != len(cumulative) || cumulative[len(cumulative)-1] <= 0 {
		return 0, false
	}
	rank := q * cumulative[len(cumulative)-1]
	i := 0
	for i < len(cumulative)-1 && cumulative[i] < rank {
		i++
	}
	if math.IsInf(bounds[i], 1) {
		if i == 0 {
			return 0, false
		}
		return bounds[i-1], true
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = bounds[i-1], cumulative[i-1]
	}
	in := cumulative[i] - below
	if in <= 0 {
		return bounds[i], true
	}
	return lower + (bounds[i]-lower)*(rank-below)/in, true
}
