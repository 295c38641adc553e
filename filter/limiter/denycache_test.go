package limiter

import (
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/filter/abi"
)

const second = int64(1e9)

// anchor is an arbitrary host clock reading for the tests.
const anchor = int64(1767225600) * second

func deniedAnswer(limit int64, tokens, retryMs float64) *Answer {
	return &Answer{Outcome: Denied, Limit: limit, Tokens: tokens, HasTokens: true, RetryAfterMs: retryMs, HasRetryMs: true, RetryAfter: 1, Plan: "p"}
}

func TestNewDenyEntry(t *testing.T) {
	e, ok := newDenyEntry("k", 5, anchor, deniedAnswer(10, 1, 4000))
	if !ok || e.rate != 1e-9 || e.tokens != 1 || e.limit != 10 || e.anchor != anchor || e.plan != "p" {
		t.Fatalf("entry %+v, %v; want 1 token/s from 1 token", e, ok)
	}
	for name, a := range map[string]*Answer{
		"no tokens":           {Limit: 10, HasRetryMs: true, RetryAfterMs: 1},
		"no retry ms":         {Limit: 10, HasTokens: true},
		"zero retry ms":       deniedAnswer(10, 1, 0),
		"tokens enough":       deniedAnswer(10, 5, 100),
		"cost above capacity": deniedAnswer(4, 1, 100),
		"no capacity":         deniedAnswer(0, 0, 100),
	} {
		if e, ok := newDenyEntry("k", 5, anchor, a); ok {
			t.Errorf("%s: cached %+v", name, e)
		}
	}
	if _, ok := newDenyEntry("k", 5, 0, deniedAnswer(10, 1, 4000)); ok {
		t.Error("cached without a clock reading")
	}
}

// TestDenyWindow checks the arithmetic: 1 token left at the anchor, a refill
// of 1 token/s, capacity 10. A cost c cannot be met before c-1 seconds; the
// cache stops denying denyMargin earlier. The rate is derived in floating
// point, which may end a window a nanosecond earlier still (never later):
// the boundaries below allow for that one nanosecond.
func TestDenyWindow(t *testing.T) {
	e, _ := newDenyEntry("k", 5, anchor, deniedAnswer(10, 1, 4000))
	for _, c := range []struct {
		cost int64
		at   int64 // after the anchor
		want bool
	}{
		{1, 0, false}, // the token left may admit it
		{2, 0, true},
		{2, second - denyMargin - 2, true},
		{2, second - denyMargin, false},
		{5, 4*second - denyMargin - 2, true},
		{5, 4*second - denyMargin, false},
		{10, 9*second - denyMargin - 2, true},
		{11, 9*second + second/2, true}, // above the capacity: never admitted
		{2, -1, false},                  // the clock went back past the anchor
	} {
		if got := e.denies(c.cost, anchor+c.at); got != c.want {
			t.Errorf("denies(cost %d, anchor%+dns) = %v, want %v", c.cost, c.at, got, c.want)
		}
	}
	if d := e.staleAt() - anchor; d < 9*second-1 || d > 9*second || !e.stale(anchor+9*second) || e.stale(anchor+9*second-2) || !e.stale(anchor-1) {
		t.Errorf("staleAt anchor%+dns, want anchor+9s", d)
	}
	retry, remaining, reset := e.reply(5, anchor+second/2)
	if retry != 4 || remaining != 1 || reset != 9 {
		t.Errorf("reply at +0.5s = retry %d, remaining %d, reset %d; want 4 (3.5 s), 1 (1.5 tokens), 9 (8.5 s)", retry, remaining, reset)
	}
	retry, _, _ = e.reply(2, anchor+second-denyMargin-2)
	if retry != 1 {
		t.Errorf("retry-after %d just before the window ends, want at least 1", retry)
	}
	slow, _ := newDenyEntry("k", 1, anchor, deniedAnswer(10, 0, 1e12))
	if !slow.denies(1, anchor+maxDenyWindow-denyMargin-1) || slow.denies(1, anchor+maxDenyWindow) {
		t.Error("a very slow refill is not capped at maxDenyWindow")
	}
}

func TestShardEncoding(t *testing.T) {
	entries := []denyEntry{
		{key: "a", plan: "gold", limit: 10, tokens: 0.5, rate: 2e-10, anchor: anchor},
		{key: string(make([]byte, MaxKeyLen)), plan: "", limit: 1, tokens: 0, rate: 1e-9, anchor: anchor + 1},
	}
	b := encodeShard(entries)
	got, ok := decodeShard(b)
	if !ok || !slices.Equal(got, entries) {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	if e, ok := findEntry(b, "a"); !ok || e != entries[0] {
		t.Errorf("findEntry(a) = %+v %v", e, ok)
	}
	if _, ok := findEntry(b, "b"); ok {
		t.Error("found a key that is not there")
	}
	for name, bad := range map[string][]byte{
		"empty":        nil,
		"version":      {2, 0},
		"count":        {denyFormat, 1},
		"truncated":    b[:len(b)-1],
		"trailing":     append(slices.Clone(b), 0),
		"zero rate":    encodeShard([]denyEntry{{key: "a", limit: 1, rate: 0, anchor: anchor}}),
		"NaN tokens":   encodeShard([]denyEntry{{key: "a", limit: 1, tokens: math.NaN(), rate: 1, anchor: anchor}}),
		"infinite":     encodeShard([]denyEntry{{key: "a", limit: 1, rate: math.Inf(1), anchor: anchor}}),
		"no capacity":  encodeShard([]denyEntry{{key: "a", limit: 0, rate: 1, anchor: anchor}}),
		"tokens above": encodeShard([]denyEntry{{key: "a", limit: 1, tokens: 2, rate: 1, anchor: anchor}}),
	} {
		if got, ok := decodeShard(bad); ok {
			t.Errorf("%s: decoded %+v", name, got)
		}
		// findEntry reads only up to the entry it looks for.
		if _, ok := findEntry(bad, "a"); ok && name != "trailing" && name != "truncated" {
			t.Errorf("%s: findEntry found an entry", name)
		}
	}
}

// FuzzDecodeShard: shared data is read without panicking, and what decodes
// re-encodes to the same bytes and only holds usable entries.
func FuzzDecodeShard(f *testing.F) {
	f.Add(encodeShard([]denyEntry{{key: "k", plan: "p", limit: 10, tokens: 1, rate: 1e-9, anchor: anchor}}))
	f.Add([]byte{denyFormat, 3, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, found := findEntry(b, "k"); found && !e.valid() {
			t.Fatalf("found unusable entry %+v", e)
		}
		entries, ok := decodeShard(b)
		if !ok {
			return
		}
		for _, e := range entries {
			if !e.valid() {
				t.Fatalf("decoded unusable entry %+v", e)
			}
		}
		if re := encodeShard(entries); !slices.Equal(re, b) {
			t.Fatalf("re-encoded %v from %v", re, b)
		}
	})
}

// sharedHost is an abi.Host with only shared data and a clock; any other
// call panics (the embedded Host is nil). casFailures makes that many
// writes fail with CAS_MISMATCH, as if another VM wrote in between.
type sharedHost struct {
	abi.Host
	data        map[string][]byte
	cas         map[string]uint32
	next        uint32
	casFailures int
	writes      int
}

func newSharedHost() *sharedHost {
	return &sharedHost{data: map[string][]byte{}, cas: map[string]uint32{}}
}

func (h *sharedHost) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	v, ok := h.data[key]
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return slices.Clone(v), h.cas[key], abi.StatusOK
}

func (h *sharedHost) SetSharedData(key string, value []byte, cas uint32) abi.Status {
	h.writes++
	if h.casFailures > 0 {
		h.casFailures--
		// Another VM's write: the stored cas moves on.
		h.next++
		h.cas[key] = h.next
		return abi.StatusCASMismatch
	}
	if _, ok := h.data[key]; ok && cas != 0 && cas != h.cas[key] {
		return abi.StatusCASMismatch
	}
	h.next++
	h.data[key], h.cas[key] = slices.Clone(value), h.next
	return abi.StatusOK
}

func entry(key string, at int64) denyEntry {
	e, _ := newDenyEntry(key, 5, at, deniedAnswer(10, 1, 4000))
	return e
}

func TestDenyCacheStore(t *testing.T) {
	c := newDenyCache("rl")
	h := newSharedHost()
	c.store(h, entry("a", anchor), anchor)
	c.store(h, entry("a", anchor+second), anchor+second) // replaces
	if e, ok := c.lookup(h, "a"); !ok || e.anchor != anchor+second {
		t.Errorf("lookup(a) = %+v %v, want the newer entry", e, ok)
	}
	if _, ok := newDenyCache("other").lookup(h, "a"); ok {
		t.Error("another sidecar cluster sees the entry")
	}

	// Lost races are retried on a fresh read.
	h.casFailures = denyCASAttempts - 1
	c.store(h, entry("b", anchor), anchor)
	if _, ok := c.lookup(h, "b"); !ok {
		t.Error("entry lost after retried CAS mismatches")
	}
	h.casFailures = denyCASAttempts
	c.store(h, entry("c", anchor), anchor)
	if _, ok := c.lookup(h, "c"); ok {
		t.Error("stored despite every attempt failing")
	}
}

func TestDenyCacheShardBounds(t *testing.T) {
	c := newDenyCache("rl")
	h := newSharedHost()
	// Keys that share one shard.
	shard := c.shardKey("k0")
	var keys []string
	for i := 0; len(keys) < denyShardEntries+3; i++ {
		k := "k" + strconv.Itoa(i)
		if c.shardKey(k) == shard {
			keys = append(keys, k)
		}
	}
	for i, k := range keys {
		c.store(h, entry(k, anchor+int64(i)*second/10), anchor+int64(i)*second/10)
	}
	all, ok := decodeShard(h.data[shard])
	if !ok || len(all) != denyShardEntries {
		t.Fatalf("shard holds %d entries (%v), want %d", len(all), ok, denyShardEntries)
	}
	// The entries that go stale first were evicted.
	for i, k := range keys {
		_, ok := c.lookup(h, k)
		if want := i >= len(keys)-denyShardEntries; ok != want {
			t.Errorf("key %d present = %v, want %v", i, ok, want)
		}
	}
	// Stale entries are dropped on the next write.
	late := anchor + 100*second
	c.store(h, entry("k0", late), late)
	if all, _ := decodeShard(h.data[shard]); len(all) != 1 {
		t.Errorf("%d entries after the others went stale, want 1", len(all))
	}
	// An unreadable value is overwritten.
	h.data[shard] = []byte("garbage")
	c.store(h, entry("k0", late), late)
	if _, ok := c.lookup(h, "k0"); !ok {
		t.Error("a garbage shard was not replaced")
	}
}
