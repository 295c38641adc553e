package limiter

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestSameIsEquality compares same with == on strings of every length up to
// 40, equal ones and ones that differ in a single byte at every position,
// and strings of different lengths.
func TestSameIsEquality(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 40; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		a := string(b)
		if !same(a, strings.Clone(a)) {
			t.Fatalf("same(%q, its copy) = false", a)
		}
		for i := 0; i < n; i++ {
			c := []byte(a)
			c[i] ^= 1 << (rng.Uint32() % 8)
			if same(a, string(c)) {
				t.Fatalf("same(%q, %q) = true", a, c)
			}
		}
		if n > 0 && (same(a, a[:n-1]) || same(a[:n-1], a)) {
			t.Fatalf("same is true for %q and a prefix", a)
		}
	}
}

// TestTextIntIsStrconv compares text.int with strconv.AppendInt around
// every boundary of its fast paths and at the ends of int64.
func TestTextIntIsStrconv(t *testing.T) {
	check := func(n int64) {
		tx := text{b: []byte("x")}
		if got, want := tx.int(n), strconv.FormatInt(n, 10); got != want || string(tx.b) != "x"+want {
			t.Fatalf("text.int(%d) = %q (buffer %q), want %q", n, got, tx.b, want)
		}
	}
	for n := int64(-20000); n <= 20000; n++ {
		check(n)
	}
	for _, n := range []int64{math.MaxInt64, math.MinInt64, math.MaxInt32, math.MinInt32, 1 << 32, 99999, 100000} {
		check(n)
	}
}
