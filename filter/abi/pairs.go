package abi

import (
	"errors"
	"slices"
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
// nothing. Reusing dst keeps a hot path from allocating. The encoding's size
// is known up front, so it is written in place with one copy per string
// rather than appended byte by byte, which inside wasm costs several times
// more.
func AppendPairs(dst []byte, pairs [][2]string) []byte {
	if len(pairs) == 0 {
		return dst
	}
	size := 4 + 8*len(pairs)
	for _, p := range pairs {
		size += len(p[0]) + len(p[1]) + 2
	}
	at := len(dst)
	dst = slices.Grow(dst, size)[:at+size]
	putU32(dst[at:], uint32(len(pairs)))
	sizes, body := at+4, at+4+8*len(pairs)
	for _, p := range pairs {
		putU32(dst[sizes:], uint32(len(p[0])))
		putU32(dst[sizes+4:], uint32(len(p[1])))
		sizes += 8
		body += copy(dst[body:], p[0])
		dst[body] = 0
		body += 1 + copy(dst[body+1:], p[1])
		dst[body] = 0
		body++
	}
	return dst
}

// PairsTemplate encodes header maps that all begin with the same pairs and
// end with pairs of the same names, their values changing from one map to
// the next (a callout's: its method, path and authority, then the client's
// key). The encoding puts every size before any byte, so AppendPairs
// writes each pair in two places; the template has the parts that do not
// change encoded once, and a map is then a copy of each part, its values'
// sizes and its values. Inside wasm each copy is a call out of the module,
// so this is a few calls where AppendPairs makes two per pair.
type PairsTemplate struct {
	// head is the count and every pair's sizes, the values' sizes left
	// zero: Append writes only those.
	head []byte
	body []byte // the fixed pairs' bytes and the first name, with its NUL
	// joints[i] follows values[i]: its NUL, then the next name and its
	// NUL; the last is the last value's NUL alone.
	joints []string
	size   int // the bytes of a map but its values'
}

// NewPairsTemplate returns the template of the maps that begin with fixed
// and end with one pair for each of names, in order.
func NewPairsTemplate(fixed [][2]string, names ...string) PairsTemplate {
	enc := AppendPairs(nil, fixed)
	if len(enc) == 0 {
		enc = make([]byte, 4) // no fixed pair: a count of 0 and nothing else
	}
	sizes := 4 + 8*len(fixed)
	head := append([]byte(nil), enc[:sizes]...)
	putU32(head, uint32(len(fixed)+len(names)))
	body := append([]byte(nil), enc[sizes:]...)
	joints := make([]string, len(names))
	for i, name := range names {
		head = append(head, 0, 0, 0, 0, 0, 0, 0, 0)
		putU32(head[len(head)-8:], uint32(len(name)))
		if i == 0 {
			body = append(append(body, name...), 0)
		} else {
			joints[i-1] = "\x00" + name + "\x00"
		}
	}
	if len(names) > 0 {
		joints[len(names)-1] = "\x00"
	}
	size := len(head) + len(body)
	for _, j := range joints {
		size += len(j)
	}
	return PairsTemplate{head: head, body: body, joints: joints, size: size}
}

// Append appends to dst the encoding of the template's fixed pairs
// followed by (names[i], values[i]) for each of its names, the same bytes
// as AppendPairs makes of those pairs. values must have one value per
// name.
func (t *PairsTemplate) Append(dst []byte, values ...string) []byte {
	if len(values) != len(t.joints) {
		panic("abi: PairsTemplate.Append: want one value per name")
	}
	if len(t.head) == 4 && len(values) == 0 {
		return dst // an empty map is no bytes, as AppendPairs has it
	}
	size := t.size
	for _, v := range values {
		size += len(v)
	}
	at := len(dst)
	dst = slices.Grow(dst, size)[:at+size]
	w := at + copy(dst[at:], t.head)
	for i, v := range values {
		putU32(dst[w-8*(len(values)-i)+4:], uint32(len(v)))
	}
	w += copy(dst[w:], t.body)
	for i, v := range values {
		w += copy(dst[w:], v)
		w += copy(dst[w:], t.joints[i])
	}
	return dst
}

// DecodePairs decodes a header-map buffer. Empty input is an empty map.
// Anything that is not exactly one well-formed map (short, lengths past the
// end, a missing NUL, bytes left over) is an error; it never panics and
// never allocates more than the input's size for the result's strings.
func DecodePairs(data []byte) ([][2]string, error) {
	n, err := pairCount(data)
	if err != nil || n == 0 {
		return nil, err
	}
	// One copy of the whole buffer; every key and value is a substring of it.
	pairs, err := AppendPairViews(make([][2]string, 0, n), append([]byte(nil), data...))
	if err != nil {
		return nil, err
	}
	return pairs, nil
}

// AppendPairViews decodes a header-map buffer as DecodePairs does, but
// appends to dst and copies nothing: every key and value is a view of data,
// valid for as long as data is not written. On an error dst comes back as
// it was. The map is checked and read in the same pass.
func AppendPairViews(dst [][2]string, data []byte) ([][2]string, error) {
	n, err := pairCount(data)
	if err != nil || n == 0 {
		return dst, err
	}
	keep := len(dst)
	// Room for every pair at once, written in place: inside wasm each
	// check an append makes is a jump through the function's dispatch
	// table.
	dst = slices.Grow(dst, n)[:keep+n]
	out := dst[keep:]
	// pairCount checked that the sizes fit.
	sizes, at := data[4:4+8*n], 4+8*n
	for i := range out {
		kl, vl := int(u32(sizes[8*i:])), int(u32(sizes[8*i+4:]))
		// at + kl + 1 + vl + 1 <= len(data), in an order that cannot
		// overflow: each length is below 2^32 and at below len(data).
		if kl >= len(data)-at || vl >= len(data)-at-kl-1 {
			return dst[:keep], ErrPairsTruncated
		}
		if data[at+kl] != 0 || data[at+kl+1+vl] != 0 {
			return dst[:keep], ErrPairsNoNUL
		}
		// Both strings end before their NUL, so their first bytes exist
		// (an empty one is a view of its NUL, of length 0).
		out[i] = [2]string{unsafe.String(&data[at], kl), unsafe.String(&data[at+kl+1], vl)}
		at += kl + vl + 2
	}
	if at != len(data) {
		return dst[:keep], ErrPairsTrailing
	}
	return dst, nil
}

// pairCount reads a map's count and checks that its sizes fit: 0 for an
// empty buffer.
func pairCount(data []byte) (int, error) {
	if len(data) == 0 {
		return 0, nil
	}
	if len(data) < 4 {
		return 0, ErrPairsTruncated
	}
	n := uint64(u32(data))
	// Each pair takes at least 8 bytes of sizes and 2 NULs: checking this
	// first keeps a hostile count from reserving gigabytes.
	if n*10 > uint64(len(data)-4) {
		return 0, ErrPairsTruncated
	}
	if n == 0 && len(data) > 4 {
		return 0, ErrPairsTrailing
	}
	return int(n), nil
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
