package abi

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"unsafe"
)

func TestEncodePairsLayout(t *testing.T) {
	got := EncodePairs([][2]string{{":status", "200"}, {"k", ""}})
	want := []byte{
		2, 0, 0, 0, // count
		7, 0, 0, 0, 3, 0, 0, 0, // ":status", "200"
		1, 0, 0, 0, 0, 0, 0, 0, // "k", ""
		':', 's', 't', 'a', 't', 'u', 's', 0, '2', '0', '0', 0,
		'k', 0, 0,
	}
	if !bytes.Equal(got, want) {
		t.Errorf("EncodePairs\n got %v\nwant %v", got, want)
	}
	if EncodePairs(nil) != nil {
		t.Error("an empty map must encode as nil")
	}
}

func TestPairsRoundTrip(t *testing.T) {
	for _, pairs := range [][][2]string{
		{{"a", "b"}},
		{{":method", "POST"}, {":path", "/v1/check"}, {"x-api-key", "k"}},
		{{"", ""}, {"empty", ""}, {"nul\x00inside", "v\x00"}},
		{{"dup", "1"}, {"dup", "2"}},
	} {
		got, err := DecodePairs(EncodePairs(pairs))
		if err != nil || !slices.Equal(got, pairs) {
			t.Errorf("round trip of %q: %q, %v", pairs, got, err)
		}
	}
	for _, empty := range [][]byte{nil, {0, 0, 0, 0}} {
		got, err := DecodePairs(empty)
		if err != nil || len(got) != 0 {
			t.Errorf("DecodePairs(%v) = %q, %v; want an empty map", empty, got, err)
		}
	}
}

func TestDecodePairsRejectsMalformed(t *testing.T) {
	valid := EncodePairs([][2]string{{"key", "value"}})
	for _, c := range []struct {
		name string
		data []byte
		want error
	}{
		{"short count", []byte{1, 0}, ErrPairsTruncated},
		{"count without sizes", []byte{1, 0, 0, 0}, ErrPairsTruncated},
		{"huge count", []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, ErrPairsTruncated},
		{"cut data", valid[:len(valid)-1], ErrPairsTruncated},
		{"trailing byte", append(slices.Clone(valid), 0), ErrPairsTrailing},
		{"key length past the end", func() []byte {
			b := slices.Clone(valid)
			b[4] = 0xff
			return b
		}(), ErrPairsTruncated},
		{"length overflowing u32 sums", func() []byte {
			b := slices.Clone(valid)
			copy(b[4:8], []byte{0xff, 0xff, 0xff, 0xff})
			return b
		}(), ErrPairsTruncated},
		{"missing NUL", func() []byte {
			b := slices.Clone(valid)
			b[4+8+3] = 'x' // the NUL after "key"
			return b
		}(), ErrPairsNoNUL},
	} {
		got, err := DecodePairs(c.data)
		if !errors.Is(err, c.want) || got != nil {
			t.Errorf("%s: %q, %v; want %v", c.name, got, err, c.want)
		}
	}
}

// FuzzDecodePairs: no input panics; whatever decodes re-encodes to exactly
// the input (the decoder accepts only canonical maps).
func FuzzDecodePairs(f *testing.F) {
	f.Add([]byte{})
	f.Add(EncodePairs([][2]string{{":status", "200"}, {"ratelimit-limit", "10"}}))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		pairs, err := DecodePairs(data)
		if err != nil {
			return
		}
		if len(pairs) == 0 {
			// The only encodings of an empty map: nothing, or a zero count.
			if len(data) != 0 && !bytes.Equal(data, []byte{0, 0, 0, 0}) {
				t.Fatalf("%v decoded to an empty map", data)
			}
			return
		}
		if re := EncodePairs(pairs); !bytes.Equal(re, data) {
			t.Fatalf("decoded %q from %v, re-encoded %v", pairs, data, re)
		}
	})
}

func TestPins(t *testing.T) {
	var p pins
	a := p.alloc(16)
	b := p.alloc(0)
	if len(a) != 16 || len(b) != 0 {
		t.Fatalf("alloc lengths %d %d", len(a), len(b))
	}
	addr := func(s []byte) uintptr { return uintptrOf(s) }
	if addr(b) == 0 {
		t.Fatal("a zero-size allocation has address 0, which the host reads as failure")
	}
	copy(a, "0123456789abcdef")
	got, ok := p.take(addr(a), 4)
	if !ok || string(got) != "0123" {
		t.Fatalf("take = %q %v", got, ok)
	}
	if _, ok := p.take(addr(a), 4); ok {
		t.Error("a buffer was taken twice")
	}
	if _, ok := p.take(addr(b), 2); ok {
		t.Error("took more than was allocated")
	}
	c := p.alloc(8)
	if _, ok := p.take(addr(c)+1, 1); ok {
		t.Error("took from an address inside a buffer")
	}
	if got, ok := p.take(0, 0); !ok || got != nil {
		t.Errorf("take(0, 0) = %q %v, want the empty result", got, ok)
	}
	p.release()
	if len(p.bufs) != 0 {
		t.Errorf("%d buffers still pinned after release", len(p.bufs))
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
