package abi

import (
	"errors"
	"unsafe"
)

// Header maps cross the ABI as one buffer: a little-endian u32 count N, then
// N pairs of (u32 key length, u32 value length), then every key's bytes and
// value's bytes, each followed by a NUL.

// Limits Envoy applies to a map a plugin hands it: above either, Envoy
// silently uses an empty map instead.
const (
	MaxPairs      = 1024
	MaxPairsBytes = 1 << 20
)

// Errors of DecodePairs.
var (
	ErrPairsTruncated = errors.New("header map: truncated")
	ErrPairsTrailing  = errors.New("header map: bytes after the last pair")
	ErrPairsNoNUL     = errors.New("header map: key or value not NUL-terminated")
)

// EncodePairs encodes pairs as a header-map buffer. An empty map encodes as
// nil, which the host reads as "no headers".
func EncodePairs(pairs [][2]string) []byte { return AppendPairs(nil, pairs) }

// AppendPairs appends the encoding of pairs to dst; an empty map appends
// nothing. Reusing dst keeps a hot path from allocating.
func AppendPairs(dst []byte, pairs [][2]string) []byte {
	if len(pairs) == 0 {
		return dst
	}
	dst = appendU32(dst, uint32(len(pairs)))
	for _, p := range pairs {
		dst = appendU32(dst, uint32(len(p[0])))
		dst = appendU32(dst, uint32(len(p[1])))
	}
	for _, p := range pairs {
		dst = append(dst, p[0]...)
		dst = append(dst, 0)
		dst = append(dst, p[1]...)
		dst = append(dst, 0)
	}
	return dst
}

// DecodePairs decodes a header-map buffer. Empty input is an empty map.
// Anything that is not exactly one well-formed map (short, lengths past the
// end, a missing NUL, bytes left over) is an error; it never panics and
// never allocates more than the input's size for the result's strings.
func DecodePairs(data []byte) ([][2]string, error) {
	if err := checkPairs(data); err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, nil
	}
	// One copy of the whole buffer; every key and value is a substring of it.
	return appendViews(make([][2]string, 0, u32(data)), append([]byte(nil), data...)), nil
}

// AppendPairViews decodes a header-map buffer as DecodePairs does, but
// appends to dst and copies nothing: every key and value is a view of data,
// valid for as long as data is not written.
func AppendPairViews(dst [][2]string, data []byte) ([][2]string, error) {
	if err := checkPairs(data); err != nil {
		return dst, err
	}
	return appendViews(dst, data), nil
}

// checkPairs reports whether data is exactly one well-formed map.
func checkPairs(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	if len(data) < 4 {
		return ErrPairsTruncated
	}
	n := uint64(u32(data))
	// Each pair takes at least 8 bytes of sizes and 2 NULs: checking this
	// first keeps a hostile count from reserving gigabytes.
	if n*10 > uint64(len(data)-4) {
		return ErrPairsTruncated
	}
	sizes := data[4 : 4+8*n]
	at := 4 + 8*n
	for i := uint64(0); i < n; i++ {
		for j := uint64(0); j < 2; j++ {
			l := uint64(u32(sizes[8*i+4*j:]))
			at += l
			if at >= uint64(len(data)) {
				return ErrPairsTruncated
			}
			if data[at] != 0 {
				return ErrPairsNoNUL
			}
			at++
		}
	}
	if at != uint64(len(data)) {
		return ErrPairsTrailing
	}
	return nil
}

// appendViews appends the pairs of a map checkPairs accepted.
func appendViews(dst [][2]string, data []byte) [][2]string {
	if len(data) == 0 {
		return dst
	}
	n := uint64(u32(data))
	at := 4 + 8*n
	for i := uint64(0); i < n; i++ {
		kl, vl := uint64(u32(data[4+8*i:])), uint64(u32(data[8+8*i:]))
		k := view(data[at : at+kl])
		at += kl + 1
		v := view(data[at : at+vl])
		at += vl + 1
		dst = append(dst, [2]string{k, v})
	}
	return dst
}

// view is b as a string without a copy; b must not be written while the
// string is in use.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// u32 and putU32 read and write the ABI's little-endian u32; written out
// rather than taken from encoding/binary to keep reflect out of the module.
func u32(b []byte) uint32 {
	_ = b[3]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func putU32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func appendU32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}
