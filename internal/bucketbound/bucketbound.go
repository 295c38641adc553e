// Package bucketbound says when a token bucket cannot hold a cost, from one
// decision the script made on it: the tokens τ it left and the refill rate r.
//
// Tokens come back only by refill and leave only through admitted requests,
// so at any instant t after the decision the bucket holds at most
// τ + r·(t − decision), whoever else spends from it. A caller that cannot
// read Redis's clock anchors the bound at a reading of its own clock taken
// no later than the decision (when it sent the call), which only loosens it.
// A cost c at local time t cannot be admitted when
//
//	t − sent < w − Margin(w),   w = (c − τ)/r
//
// Both the filter's deny cache and the sidecar's use it; the filter's
// RATIONALE.md, "Why the deny cache is correct", derives the margin. The
// package has no imports, so that the filter's module stays small.
package bucketbound

const (
	// MarginFixed and DriftDivisor make the margin by which a denial ends
	// before the bound says it must: 10 µs cover Redis's TIME, whole
	// microseconds (1 µs), and the float64 rounding of the script's refill
	// and of w (a few ulps of a refill time of at most a year, under
	// 0.1 µs), ten times over; w/1000 covers the two clocks running at
	// rates up to 1000 ppm apart (each may be slewed by up to 500 ppm).
	MarginFixed  = int64(10_000)
	DriftDivisor = 1000
	// MaxWindow caps how far ahead one decision reaches (ns; a very slow
	// refill); a shorter window only means more calls to Redis.
	MaxWindow = 3600 * int64(1e9)
)

// Wait returns how long (ns) after a decision that left tokens, on a bucket
// refilling rate tokens per second, the bucket may first hold cost (0 when
// it may already), capped at MaxWindow.
func Wait(cost, tokens, rate float64) int64 {
	need := cost - tokens
	if need <= 0 {
		return 0
	}
	d := need / rate * 1e9
	if !(d < float64(MaxWindow)) {
		return MaxWindow
	}
	return int64(d)
}

// Margin is how much sooner than w a denial by the bound ends.
func Margin(w int64) int64 { return MarginFixed + w/DriftDivisor }

// Stale reports whether the bound of a decision that left tokens, anchored
// at sent, denies nothing up to the capacity at now: the bucket may be
// full again, or the clock went back past the anchor.
func Stale(capacity, tokens, rate float64, sent, now int64) bool {
	return now < sent || now >= sent+Wait(capacity, tokens, rate)
}

// Denies reports whether cost cannot be admitted at now, by the bound of a
// decision that left tokens and was anchored at sent. A clock that went
// back past the anchor denies nothing.
func Denies(cost, tokens, rate float64, sent, now int64) bool {
	w := Wait(cost, tokens, rate)
	return now >= sent && now-sent < w-Margin(w)
}
