package abi

import "errors"

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
func EncodePairs(pairs [][2]string) []byte {
	if len(pairs) == 0 {
		return nil
	}
	size := 4 + 8*len(pairs)
	for _, p := range pairs {
		size += len(p[0]) + len(p[1]) + 2
	}
	buf := make([]byte, size)
	putU32(buf, uint32(len(pairs)))
	at := 4
	for _, p := range pairs {
		putU32(buf[at:], uint32(len(p[0])))
		putU32(buf[at+4:], uint32(len(p[1])))
		at += 8
	}
	for _, p := range pairs {
		// make zeroed the buffer, so the NUL after each string is already there.
		at += copy(buf[at:], p[0]) + 1
		at += copy(buf[at:], p[1]) + 1
	}
	return buf
}

// DecodePairs decodes a header-map buffer. Empty input is an empty map.
// Anything that is not exactly one well-formed map (short, lengths past the
// end, a missing NUL, bytes left over) is an error; it never panics and
// never allocates more than the input's size for the result's strings.
func DecodePairs(data []byte) ([][2]string, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if len(data) < 4 {
		return nil, ErrPairsTruncated
	}
	n := uint64(u32(data))
	// Each pair takes at least 8 bytes of sizes and 2 NULs: checking this
	// before allocating keeps a hostile count from reserving gigabytes.
	if n*10 > uint64(len(data)-4) {
		return nil, ErrPairsTruncated
	}
	sizes := data[4 : 4+8*n]
	at := 4 + 8*n
	for i := uint64(0); i < n; i++ {
		at += uint64(u32(sizes[8*i:])) + 1
		at += uint64(u32(sizes[8*i+4:])) + 1
		if at > uint64(len(data)) {
			return nil, ErrPairsTruncated
		}
	}
	if at != uint64(len(data)) {
		return nil, ErrPairsTrailing
	}
	// One copy of the whole buffer; every key and value is a substring of it.
	all := string(data)
	pairs := make([][2]string, n)
	at = 4 + 8*n
	for i := range pairs {
		for j := 0; j < 2; j++ {
			l := uint64(u32(sizes[8*uint64(i)+4*uint64(j):]))
			if all[at+l] != 0 {
				return nil, ErrPairsNoNUL
			}
			pairs[i][j] = all[at : at+l]
			at += l + 1
		}
	}
	return pairs, nil
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
