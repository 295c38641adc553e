package rig

import (
	"math"
	"testing"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// TestHistogram: buckets read at two moments add up per bound across
// gateways, and Since leaves what was recorded between them, whose p99 is
// interpolated inside its bucket as histogram_quantile does.
func TestHistogram(t *testing.T) {
	buckets := func(counts ...float64) []testkit.Bucket {
		bounds := []float64{1000, 2000, 5000, math.Inf(1)}
		var bs []testkit.Bucket
		for i, c := range counts {
			bs = append(bs, testkit.Bucket{UpperBound: bounds[i], Count: c})
		}
		return bs
	}
	var before Histogram
	if got := before.Quantile(0.99); !math.IsNaN(got) {
		t.Fatalf("no samples: p99 %v, want NaN", got)
	}
	// Two gateways, before the run: 10 and 5 samples, all under 1 ms.
	before = before.Plus(buckets(10, 10, 10, 10)).Plus(buckets(5, 5, 5, 5))
	// After: 100 more samples, 98 under 1 ms, 1 in (1, 2] and 1 in (2, 5].
	after := Histogram{}.Plus(buckets(108, 109, 110, 110)).Plus(buckets(5, 5, 5, 5))
	run := after.Since(before)
	want := []float64{98, 99, 100, 100}
	for i, c := range run.Counts {
		if c != want[i] {
			t.Fatalf("counts since: %v, want %v", run.Counts, want)
		}
	}
	// Rank 99 of 100 is the last sample of (1000, 2000].
	if got := run.Quantile(0.99); math.Abs(got-2000) > 1e-9 {
		t.Errorf("p99 = %v, want 2000", got)
	}
	// Rank 99.5 lies halfway into (2000, 5000].
	if got := run.Quantile(0.995); math.Abs(got-3500) > 1e-9 {
		t.Errorf("p99.5 = %v, want 3500", got)
	}
	// A histogram not yet made adds nothing.
	if got := run.Plus(nil); len(got.Counts) != 4 || got.Counts[0] != 98 {
		t.Errorf("plus none: %v", got.Counts)
	}
	secs := Histogram{Bounds: []float64{0.001, 0.002, math.Inf(1)}, Counts: []float64{50, 100, 100}}
	l := CalloutLatency{Filter: run, Sidecar: secs, Wait: Histogram{Bounds: secs.Bounds, Counts: []float64{100, 100, 100}}}
	f, s := l.P99()
	if math.Abs(f-2) > 1e-9 || math.Abs(s-1.98) > 1e-9 {
		t.Errorf("P99() = %v ms, %v ms; want 2 ms (µs histogram) and 1.98 ms (seconds)", f, s)
	}
	// Every wait under 1 ms: rank 99 of 100 is 99% into (0, 1 ms].
	if w := l.WaitP99(); math.Abs(w-0.99) > 1e-9 {
		t.Errorf("WaitP99() = %v ms, want 0.99 ms", w)
	}
	// Since takes each histogram's earlier counts off its own.
	if w := l.Since(CalloutLatency{Wait: Histogram{Bounds: secs.Bounds, Counts: []float64{90, 90, 90}}}).Wait.Counts; w[0] != 10 || w[2] != 10 {
		t.Errorf("waits since: %v, want 10 in all", w)
	}
}
