package wasmhost

import (
	"encoding/binary"
	"strings"
)

// Limits Envoy (proxy-wasm-cpp-host limits.h) puts on a header map a plugin
// passes in: a larger one is silently treated as empty.
const (
	maxPairsBytes = 1 << 20
	maxPairsCount = 1024
)

// EncodePairs serializes headers in the proxy-wasm map format: u32 count,
// then (u32 name length, u32 value length) per pair, then every name and
// value followed by a NUL byte. An empty map encodes to nothing (Envoy hands
// a plugin ptr 0, len 0 for it).
func EncodePairs(pairs []Header) []byte {
	if len(pairs) == 0 {
		return nil
	}
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + 1 + len(p[1]) + 1
	}
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	off := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(b[off:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(b[off+4:], uint32(len(p[1])))
		off += 8
	}
	for _, p := range pairs {
		off += copy(b[off:], p[0]) + 1
		off += copy(b[off:], p[1]) + 1
	}
	return b
}

// DecodePairs parses a map a plugin passed in with Envoy's leniency: a buffer
// that is malformed (bad lengths, missing NULs, trailing bytes), over 1 MiB
// or over 1024 pairs yields an empty map, never an error.
func DecodePairs(b []byte) []Header {
	if len(b) > maxPairsBytes || len(b) < 4 {
		return nil
	}
	n := binary.LittleEndian.Uint32(b)
	if n > maxPairsCount || uint64(4+8*uint64(n)) > uint64(len(b)) {
		return nil
	}
	lens := b[4 : 4+8*n]
	pos := 4 + 8*int(n)
	// One copy of the buffer, every name and value a substring of it.
	all := string(b)
	pairs := make([]Header, n)
	for i := range pairs {
		var p Header
		for j := 0; j < 2; j++ {
			l := int(binary.LittleEndian.Uint32(lens[8*i+4*j:]))
			if l < 0 || pos+l+1 > len(b) || b[pos+l] != 0 {
				return nil
			}
			p[j] = all[pos : pos+l]
			pos += l + 1
		}
		pairs[i] = p
	}
	if pos != len(b) {
		return nil
	}
	return pairs
}

// lowerKeys returns pairs with every name lower-cased, as Envoy's
// LowerCaseString does to names a plugin passes in.
func lowerKeys(pairs []Header) []Header {
	out := make([]Header, len(pairs))
	for i, p := range pairs {
		out[i] = Header{strings.ToLower(p[0]), p[1]}
	}
	return out
}
