package limiter

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"strconv"
	"unsafe"
)

// text is a scratch buffer that header values are formatted into without
// allocating: each value is a view of the bytes it was written to. Bytes are
// only ever appended until reset, and a buffer that grows leaves the views
// taken so far in the old array, untouched; so a view stays valid until the
// next reset. The host copies every value it is handed during the call, so
// one callback's values never need to outlive it.
type text struct{ b []byte }

func (t *text) reset() { t.b = t.b[:0] }

// since returns what was written from mark on.
func (t *text) since(mark int) string {
	if len(t.b) == mark {
		return ""
	}
	return unsafe.String(&t.b[mark], len(t.b)-mark)
}

// int appends n in decimal, as strconv.AppendInt does. What a header value
// holds is mostly below 10,000 (a cost, the tokens left, seconds to wait),
// and those are appended in one go: inside wasm strconv's digit loop and
// the two calls into it cost several times as much (filter/RATIONALE.md,
// "What a request costs inside wasm"). Larger numbers, the clock of
// every callout among them, are appendLarge's.
func (t *text) int(n int64) string {
	m := len(t.b)
	if u := uint32(n); uint64(n) >= 10000 {
		t.b = appendLarge(t.b, n)
	} else if u < 10 {
		t.b = append(t.b, byte('0'+u))
	} else if u < 100 {
		t.b = append(t.b, digitPairs[2*u], digitPairs[2*u+1])
	} else if hi, lo := u/100, u%100; u < 1000 {
		t.b = append(t.b, byte('0'+hi), digitPairs[2*lo], digitPairs[2*lo+1])
	} else {
		t.b = append(t.b, digitPairs[2*hi], digitPairs[2*hi+1], digitPairs[2*lo], digitPairs[2*lo+1])
	}
	return t.since(m)
}

// large is int for a number known to be 10,000 or more (a clock), which
// skips int's call.
func (t *text) large(n int64) string {
	m := len(t.b)
	t.b = appendLarge(t.b, n)
	return t.since(m)
}

// appendLarge is text.int for the rest, in a call of its own so that int
// stays small enough to be inlined where it is called. Below 10^16 the
// number is two halves of 8 digits, each made into 8 ASCII bytes in a word
// (digits8), where strconv would divide a 64-bit number by 100 eight
// times, each a 128-bit product that wasm has no instruction for.
func appendLarge(b []byte, n int64) []byte {
	u := uint64(n)
	if u >= 1e16 { // and the negative
		return strconv.AppendInt(b, n, 10)
	}
	at := len(b)
	b = slices.Grow(b, 16)[:at+16]
	if hi := digits8(uint32(u / 1e8)); hi != 0 {
		// The first word's leading zeros are shifted out, and the second
		// word written over what that left at its top.
		skip := bits.TrailingZeros64(hi) / 8
		binary.LittleEndian.PutUint64(b[at:], (hi|asciiZeros)>>(8*skip))
		binary.LittleEndian.PutUint64(b[at+8-skip:], digits8(uint32(u%1e8))|asciiZeros)
		return b[:at+16-skip]
	}
	lo := digits8(uint32(u)) // u < 10^8, and >= 10^4: not zero
	skip := bits.TrailingZeros64(lo) / 8
	binary.LittleEndian.PutUint64(b[at:], (lo|asciiZeros)>>(8*skip))
	return b[:at+8-skip]
}

// asciiZeros is "00000000" as a little-endian word: digits8's digits OR
// it are their ASCII.
const asciiZeros = 0x3030303030303030

// digits8 is the decimal digits of u < 10^8 as the bytes of a
// little-endian word, the first digit in the lowest byte, each a value
// 0-9 (zeros in front included). Each step splits every lane of the word
// in two: u into two lanes of 4 digits, each of those into two of 2, each
// of those into two of 1, with quotients by multiplication, which stay
// inside their lanes for these ranges (x*5243>>19 is x/100 for x < 43,699;
// x*103>>10 is x/10 for x < 179).
func digits8(u uint32) uint64 {
	x := uint64(u/10000) | uint64(u%10000)<<32
	q := (x * 5243 >> 19) & 0x0000007f0000007f
	x = q | (x-q*100)<<16
	q = (x * 103 >> 10) & 0x000f000f000f000f
	return q | (x-q*10)<<8
}

// digitPairs holds "00" to "99".
const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// cat returns the concatenation of its arguments.
func (t *text) cat(parts ...string) string {
	m := len(t.b)
	for _, p := range parts {
		t.b = append(t.b, p...)
	}
	return t.since(m)
}

// owned copies s into dst, which must be large enough, and returns the copy
// as a string: dst's owner keeps it for as long as it needs.
func owned(dst []byte, s string) string {
	n := copy(dst, s)
	if n == 0 {
		return ""
	}
	return unsafe.String(&dst[0], n)
}

// same is a == b, compared eight bytes at a time. Inside wasm a string
// comparison is runtime.memequal, whose loop compares one byte per turn,
// and every turn of a Go loop there is a jump through the function's
// dispatch table: comparing a 15-byte header name cost some 400
// instructions (filter/RATIONALE.md, "What a request costs inside wasm").
// The loads are little-endian words assembled from bytes, which the
// compiler turns into one load each.
func same(a, b string) bool {
	n := len(a)
	if n != len(b) {
		return false
	}
	switch {
	case n >= 8:
		for i := 0; i < n-8; i += 8 {
			if le64(a, i) != le64(b, i) {
				return false
			}
		}
		return le64(a, n-8) == le64(b, n-8)
	case n >= 4:
		return le32(a, 0) == le32(b, 0) && le32(a, n-4) == le32(b, n-4)
	}
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func le64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string, i int) uint32 {
	s = s[i : i+4]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}
