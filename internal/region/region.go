// Package region is the rule for a region name, which the filter sends to
// the sidecar in x-ratelimit-region and the sidecar splits a hot client's
// bucket by. The filter refuses at start a region the sidecar would answer
// 400 to, so both must apply the same rule; this is the one place that
// states it. It imports nothing, so the filter's wasm module may use it.
package region

// MaxLen bounds a region's length in bytes.
const MaxLen = 64

// Rule is the rule in words, for error messages.
const Rule = "at most 64 characters of A-Z a-z 0-9 . _ -"

// Valid reports whether s is a region: at most MaxLen bytes, each one of
// A-Z a-z 0-9 . _ -. The empty region is valid (no region).
func Valid[T ~string | ~[]byte](s T) bool {
	if len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
