package abi

import (
	"bytes"
	"errors"
	"math/rand/v2"
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

// TestPairsTemplateMatchesAppendPairs: a template's map is byte for byte
// the one AppendPairs makes of the same pairs, appended after what dst
// held, for fixed pairs and names of every count from none up, empty
// strings and NULs inside included.
func TestPairsTemplateMatchesAppendPairs(t *testing.T) {
	words := []string{"", "a", ":method", "POST", "x-ratelimit-cost", "12", "nul\x00inside", "a-longer-value-than-most"}
	rng := rand.New(rand.NewPCG(5, 6))
	pick := func() string { return words[rng.IntN(len(words))] }
	for range 2000 {
		fixed := make([][2]string, rng.IntN(4))
		for i := range fixed {
			fixed[i] = [2]string{pick(), pick()}
		}
		names, values := make([]string, rng.IntN(4)), make([]string, 0, 3)
		for i := range names {
			names[i] = pick()
		}
		tmpl := NewPairsTemplate(fixed, names...)
		for range 3 {
			values = values[:0]
			all := slices.Clone(fixed)
			for _, name := range names {
				v := pick()
				values = append(values, v)
				all = append(all, [2]string{name, v})
			}
			prefix := []byte("held")
			got := tmpl.Append(slices.Clone(prefix), values...)
			want := AppendPairs(slices.Clone(prefix), all)
			if !bytes.Equal(got, want) {
				t.Fatalf("template of %q and names %q with values %q:\n got %v\nwant %v", fixed, names, values, got, want)
			}
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

func TestArena(t *testing.T) {
	a := newArena()
	a.begin()
	x := a.alloc(16)
	y := a.alloc(0)
	if len(x) != 16 || len(y) != 0 {
		t.Fatalf("alloc lengths %d %d", len(x), len(y))
	}
	if addrOf(y) == 0 || addrOf(y) == addrOf(x) {
		t.Fatal("a zero-size allocation needs an address of its own, never 0")
	}
	copy(x, "0123456789abcdef")
	if got, ok := a.take(addrOf(x), 4); !ok || string(got) != "0123" {
		t.Fatalf("take = %q %v", got, ok)
	}
	if _, ok := a.take(addrOf(y), 2); ok {
		t.Error("took more than was allocated")
	}
	if _, ok := a.take(addrOf(x)+1, 1); ok {
		t.Error("took from an address inside an allocation")
	}
	if got, ok := a.take(0, 0); !ok || got != nil {
		t.Errorf("take(0, 0) = %q %v, want the empty result", got, ok)
	}
	a.begin()
	if _, ok := a.take(addrOf(x), 4); ok {
		t.Error("took an allocation of an earlier host call")
	}
	z := a.alloc(8)
	if addrOf(z) <= addrOf(x) {
		t.Error("the arena reused memory before a reset")
	}
	big := a.alloc(arenaSize + 1)
	if len(big) != arenaSize+1 || len(a.spill) != 1 {
		t.Fatalf("an allocation larger than the arena: %d bytes, %d spilled", len(big), len(a.spill))
	}
	if got, ok := a.take(addrOf(big), arenaSize+1); !ok || len(got) != arenaSize+1 {
		t.Error("a spilled allocation cannot be taken")
	}
	for range maxTracked {
		a.alloc(1)
	}
	a.reset()
	if len(a.spill) != 0 || a.used != 0 {
		t.Errorf("after reset: %d spilled, %d used", len(a.spill), a.used)
	}
	if w := a.alloc(8); addrOf(w) != addrOf(x) {
		t.Error("a reset arena does not start over")
	}
	// Filling the arena exactly, then a zero-size allocation: it spills
	// rather than sharing an address.
	a.reset()
	a.alloc(arenaSize)
	e := a.alloc(0)
	if addrOf(e) == 0 || len(a.spill) != 1 {
		t.Errorf("zero-size allocation of a full arena: address %#x, %d spilled", addrOf(e), len(a.spill))
	}
}

func TestAppendPairViews(t *testing.T) {
	data := EncodePairs([][2]string{{"a", "1"}, {"bb", ""}})
	dst := make([][2]string, 0, 4)
	got, err := AppendPairViews(dst[:1], data)
	if err != nil || !slices.Equal(got[1:], [][2]string{{"a", "1"}, {"bb", ""}}) {
		t.Fatalf("AppendPairViews = %q, %v", got, err)
	}
	if unsafe.StringData(got[1][0]) != &data[20] {
		t.Error("the key is a copy, not a view of the buffer")
	}
	if got, err := AppendPairViews(dst[:0], data[:len(data)-1]); err == nil || len(got) != 0 {
		t.Errorf("truncated map: %q, %v", got, err)
	}
	if testing.AllocsPerRun(100, func() { _, _ = AppendPairViews(dst[:0], data) }) != 0 {
		t.Error("AppendPairViews allocates")
	}
	buf := make([]byte, 0, 64)
	if testing.AllocsPerRun(100, func() { buf = AppendPairs(buf[:0], [][2]string{{"a", "1"}}) }) != 0 {
		t.Error("AppendPairs into a large enough buffer allocates")
	}
	pairs := [][2]string{{"x-api-key", "k"}, {"", ""}, {":path", "/v1/check"}}
	if got := AppendPairs([]byte("prefix"), pairs); string(got) != "prefix"+string(EncodePairs(pairs)) {
		t.Errorf("AppendPairs after a prefix = %q", got)
	}
}
