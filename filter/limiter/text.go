package limiter

import (
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

func (t *text) int(n int64) string {
	m := len(t.b)
	t.b = strconv.AppendInt(t.b, n, 10)
	return t.since(m)
}

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
