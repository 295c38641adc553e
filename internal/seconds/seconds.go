// Package seconds turns an exact wait in milliseconds into the whole
// seconds a client is told (Retry-After, RateLimit's t, ratelimit-reset).
// The filter and the sidecar both say waits in seconds and must round them
// the same way; this is the one place that does. It imports only math, so
// the filter's wasm module may use it.
package seconds

import "math"

// Max caps a ceiling in seconds (2^52, far beyond any plan's refill) so
// that the conversion never overflows.
const Max = int64(1) << 52

// Ceil is ms rounded up to whole seconds, never less than ms: the quotient
// ms/1000 is rounded in float64, so the result is checked against ms itself
// and raised when the rounding fell below. 0 for ms <= 0 or NaN.
func Ceil(ms float64) int64 {
	if !(ms > 0) {
		return 0
	}
	s := math.Ceil(ms / 1000)
	if !(s < float64(Max)) {
		return Max
	}
	if s*1000 < ms {
		s++
	}
	return int64(s)
}
