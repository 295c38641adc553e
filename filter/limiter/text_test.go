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

// TestDigits8 checks digits8 for every number below 10^8 against a
// decimal counter.
func TestDigits8(t *testing.T) {
	var d [8]byte // the counter's digits, the first in d[0]
	for u := uint32(0); u < 1e8; u++ {
		w := digits8(u)
		for i := range d {
			if byte(w>>(8*i)) != d[i] {
				t.Fatalf("digits8(%d) = %#016x, want the digits %v", u, w, d)
			}
		}
		for i := 7; i >= 0; i-- {
			if d[i]++; d[i] < 10 {
				break
			}
			d[i] = 0
		}
	}
}

// TestTextIntIsStrconv compares text.int, and text.large from 10,000 on,
// with strconv.AppendInt around every boundary of their fast paths and at
// the ends of int64.
func TestTextIntIsStrconv(t *testing.T) {
	check := func(n int64) {
		tx := text{b: []byte("x")}
		if got, want := tx.int(n), strconv.FormatInt(n, 10); got != want || string(tx.b) != "x"+want {
			t.Fatalf("text.int(%d) = %q (buffer %q), want %q", n, got, tx.b, want)
		}
		if n < 10000 {
			return
		}
		tx = text{b: []byte("y")}
		if got, want := tx.large(n), strconv.FormatInt(n, 10); got != want || string(tx.b) != "y"+want {
			t.Fatalf("text.large(%d) = %q (buffer %q), want %q", n, got, tx.b, want)
		}
	}
	for n := int64(-20000); n <= 20000; n++ {
		check(n)
	}
	for _, n := range []int64{math.MaxInt64, math.MinInt64, math.MaxInt32, math.MinInt32, 1 << 32, 99999, 100000} {
		check(n)
	}
	// Around every power of ten up to 10^18 (the two halves of 8 digits
	// and strconv's part past 10^16), and numbers of every length at random.
	for p := int64(10); p <= 1e18; p *= 10 {
		for d := int64(-2); d <= 2; d++ {
			check(p + d)
			check(p*9 + d)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		check(int64(rng.Uint64() >> rng.IntN(64)))
	}
}
