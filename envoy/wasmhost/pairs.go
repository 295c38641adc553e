package wasmhost

import (
	"encoding/binary"
	"strings"
	"unsafe"
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
	b := make([]byte, pairsSize(pairs))
	encodePairs(b, pairs)
	return b
}

// pairsSize is the length of EncodePairs(pairs).
func pairsSize(pairs []Header) int {
	if len(pairs) == 0 {
		return 0
	}
	size := 4
	for _, p := range pairs {
		size += 8 + len(p[0]) + 1 + len(p[1]) + 1
	}
	return size
}

// encodePairs writes EncodePairs(pairs) into b, pairsSize(pairs) bytes.
func encodePairs(b []byte, pairs []Header) {
	if len(pairs) == 0 {
		return
	}
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	off := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(b[off:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(b[off+4:], uint32(len(p[1])))
		off += 8
	}
	for _, p := range pairs {
		off += copy(b[off:], p[0])
		b[off] = 0 // written: the module's allocation is not zeroed
		off++
		off += copy(b[off:], p[1])
		b[off] = 0
		off++
	}
}

// DecodePairs parses a map a plugin passed in with Envoy's leniency: a buffer
// that is malformed (bad lengths, missing NULs, trailing bytes), over 1 MiB
// or over 1024 pairs yields an empty map, never an error.
func DecodePairs(b []byte) []Header {
	if len(b) > maxPairsBytes {
		return nil
	}
	// One copy of the buffer, every name and value a view of it.
	return decodePairs(append([]byte(nil), b...), false, 0)
}

// decodePairs is DecodePairs over buf, a copy that no one else holds or
// changes: every name and value is a view of it, each name lower-cased in
// it first if lower is set (ASCII only, as Envoy's LowerCaseString,
// absl::AsciiStrToLower). The map has room for that many more headers
// before it grows.
func decodePairs(buf []byte, lower bool, room int) []Header {
	if len(buf) > maxPairsBytes || len(buf) < 4 {
		return nil
	}
	n := binary.LittleEndian.Uint32(buf)
	if n > maxPairsCount || uint64(4+8*uint64(n)) > uint64(len(buf)) {
		return nil
	}
	lens := buf[4 : 4+8*n]
	pos := 4 + 8*int(n)
	pairs := make([]Header, n, int(n)+room)
	for i := range pairs {
		var p Header
		for j := 0; j < 2; j++ {
			l := int(binary.LittleEndian.Uint32(lens[8*i+4*j:]))
			if l < 0 || pos+l+1 > len(buf) || buf[pos+l] != 0 {
				return nil
			}
			v := buf[pos : pos+l]
			if j == 0 && lower {
				lowerASCII(v)
			}
			if l > 0 {
				p[j] = unsafe.String(&v[0], l)
			}
			pos += l + 1
		}
		pairs[i] = p
	}
	if pos != len(buf) {
		return nil
	}
	return pairs
}

// lowerASCII lower-cases b's ASCII letters in place.
func lowerASCII(b []byte) {
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
}

// headerRoom is the room a stream's header map has for headers a plugin
// adds (a rate-limit filter adds five to a response) before it grows.
const headerRoom = 8

// lowerKeys returns a copy of pairs with every name lower-cased, as
// Envoy's LowerCaseString does to names a plugin passes in, and room for
// that many more headers.
func lowerKeys(pairs []Header, room int) []Header {
	out := make([]Header, len(pairs), len(pairs)+room)
	for i, p := range pairs {
		out[i] = Header{strings.ToLower(p[0]), p[1]}
	}
	return out
}
