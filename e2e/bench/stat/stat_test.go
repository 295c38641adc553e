package stat

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100..1, unsorted
	}
	tests := []struct {
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(hundred...), 50, 50 * time.Millisecond},
		{ms(hundred...), 99, 99 * time.Millisecond},
		{ms(hundred...), 99.9, 100 * time.Millisecond},
		{ms(hundred...), 100, 100 * time.Millisecond},
		{ms(3, 1, 2), 50, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Percentile(tt.ds, tt.p); got != tt.want {
			t.Errorf("Percentile(%d values, %v) = %v, want %v", len(tt.ds), tt.p, got, tt.want)
		}
	}
	if got := PercentilesMs(nil, 50, 99); len(got) != 2 || !math.IsNaN(got[0]) || !math.IsNaN(got[1]) {
		t.Errorf("PercentilesMs(none) = %v, want NaN for each", got)
	}
	if got := PercentilesMs(ms(3, 1, 2), 50, 100); got[0] != 2 || got[1] != 3 {
		t.Errorf("PercentilesMs(3, 1, 2 ms) = %v, want [2 3]", got)
	}
	in := ms(hundred...)
	got := Percentiles(in, 50, 99)
	if got[0] != 50*time.Millisecond || got[1] != 99*time.Millisecond || in[0] != 100*time.Millisecond {
		t.Errorf("Percentiles = %v (input changed: %v)", got, in[0] != 100*time.Millisecond)
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{9}, 9},
	}
	for _, tt := range tests {
		if got := Median(tt.xs); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", tt.xs, got, tt.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
	if got := Median([]float64{1, math.NaN(), 2}); !math.IsNaN(got) {
		t.Errorf("Median of values one of which is NaN = %v, want NaN", got)
	}
	if got := MedianDuration([]time.Duration{3, 1, 2}); got != 2 {
		t.Errorf("MedianDuration = %v", got)
	}
}

func TestJoin(t *testing.T) {
	if got := Join([]float64{0.641, 0.5, 12}, 2, ", "); got != "0.64, 0.50, 12.00" {
		t.Errorf("Join = %q", got)
	}
	if got := Join([]float64{10793.4, 6474.6}, 0, " "); got != "10793 6475" {
		t.Errorf("Join with no decimals = %q", got)
	}
	if got := Join(nil, 2, ", "); got != "" {
		t.Errorf("Join(nil) = %q", got)
	}
}

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	bounds := []float64{1, 2, 4, inf}
	cases := []struct {
		name string
		cum  []float64
		q    float64
		want float64
		ok   bool
	}{
		// 10 samples at or below 1, 10 more in (1,2], none above.
		{"median on a bound", []float64{10, 20, 20, 20}, 0.5, 1, true},
		{"interpolated in a bucket", []float64{10, 20, 20, 20}, 0.75, 1.5, true},
		{"in the first bucket, from 0", []float64{10, 10, 10, 10}, 0.5, 0.5, true},
		{"in (2,4]", []float64{0, 0, 4, 4}, 0.99, 2 + 2*0.99, true},
		{"past the last bound: the last bound", []float64{1, 1, 1, 100}, 0.99, 4, true},
		{"empty", []float64{0, 0, 0, 0}, 0.99, 0, false},
	}
	for _, c := range cases {
		got, ok := HistogramQuantile(bounds, c.cum, c.q)
		if ok != c.ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: %v, %t; want %v, %t", c.name, got, ok, c.want, c.ok)
		}
	}
}
