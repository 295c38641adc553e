package seconds

import (
	"math"
	"testing"
)

// Whole seconds never earlier than the exact ms, also where ms/1000 rounds
// down in float64.
func TestCeil(t *testing.T) {
	for _, tc := range []struct {
		ms   float64
		want int64
	}{
		{0, 0}, {-1, 0}, {math.NaN(), 0}, {1e-300, 1}, {0.01, 1}, {999.999, 1}, {1000, 1},
		{math.Nextafter(1000, 2000), 2}, {1000.001, 2}, {1500, 2}, {2000, 2}, {1e6, 1000},
		{31536000000, 31536000}, {math.Nextafter(3e12, 4e12), 3000000001}, {1e300, Max},
	} {
		got := Ceil(tc.ms)
		if got != tc.want {
			t.Errorf("Ceil(%v) = %d, want %d", tc.ms, got, tc.want)
		}
		if tc.ms > 0 && tc.ms < 1e15 && float64(got)*1000 < tc.ms {
			t.Errorf("Ceil(%v) = %d s is earlier than the wait", tc.ms, got)
		}
	}
}
