package limiter

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/internal/bucketbound"
)

const second = int64(1e9)

// anchor is an arbitrary host clock reading for the tests.
const anchor = int64(1767225600) * second

func deniedAnswer(limit int64, tokens, rate float64) *Answer {
	return &Answer{Outcome: Denied, Limit: limit, Tokens: tokens, HasTokens: true, Rate: rate, HasRate: true, RetryAfter: 1, Plan: "p"}
}

func TestNewDenyEntry(t *testing.T) {
	e, ok := newDenyEntry("k", 5, anchor, anchor+3e6, deniedAnswer(10, 1, 1))
	if !ok || e.rate != 1 || e.tokens != 1 || e.limit != 10 || e.sent != anchor || e.recv != anchor+3e6 || e.plan != "p" {
		t.Fatalf("entry %+v, %v; want 1 token/s from 1 token", e, ok)
	}
	never := deniedAnswer(10, 1, 1)
	never.Never = true
	for name, a := range map[string]*Answer{
		"no tokens":                 {Limit: 10, HasRate: true, Rate: 1},
		"no rate":                   {Limit: 10, HasTokens: true},
		"never within the capacity": never,
		"tokens enough":             deniedAnswer(10, 5, 1),
		"tokens above limit":        deniedAnswer(4, 4.5, 1),
		"no capacity":               deniedAnswer(0, 0, 1),
	} {
		if e, ok := newDenyEntry("k", 5, anchor, anchor, a); ok {
			t.Errorf("%s: cached %+v", name, e)
		}
	}
	// A cost above the capacity spent nothing: the answer's tokens bound
	// the bucket as a denial's do, whether or not it says never.
	above := deniedAnswer(4, 1, 1)
	aboveNever := deniedAnswer(4, 1, 1)
	aboveNever.Never = true
	for name, a := range map[string]*Answer{"cost above capacity": above, "cost above capacity, never": aboveNever} {
		if e, ok := newDenyEntry("k", 5, anchor, anchor, a); !ok || e.tokens != 1 || e.limit != 4 {
			t.Errorf("%s: entry %+v, %v; want 1 token of 4", name, e, ok)
		}
	}
	if _, ok := newDenyEntry("k", 5, 0, 0, deniedAnswer(10, 1, 1)); ok {
		t.Error("cached without a clock reading")
	}
	if _, ok := newDenyEntry("k", 5, anchor, anchor-1, deniedAnswer(10, 1, 1)); ok {
		t.Error("cached an answer that came before its callout left")
	}
}

// TestDenyWindow checks the arithmetic: 1 token left at the decision, the
// plan's 1 token/s, capacity 10, every figure exact in binary. A cost c
// cannot be met before c-1 seconds; the cache stops denying bucketbound.Margin
// earlier: 10 µs plus a thousandth of the wait.
func TestDenyWindow(t *testing.T) {
	e, _ := newDenyEntry("k", 5, anchor, anchor, deniedAnswer(10, 1, 1))
	m := func(w int64) int64 { return 10_000 + w/1000 }
	for _, c := range []struct {
		cost int64
		at   int64 // after the anchor
		want bool
	}{
		{1, 0, false}, // the token left may admit it
		{2, 0, true},
		{2, second - m(second) - 1, true},
		{2, second - m(second), false},
		{5, 4*second - m(4*second) - 1, true},
		{5, 4*second - m(4*second), false},
		{10, 9*second - m(9*second) - 1, true},
		{10, 9*second - m(9*second), false},
		{11, 9*second + second/2, true}, // above the capacity: never admitted
		{2, -1, false},                  // the clock went back past the anchor
	} {
		if got := e.denies(c.cost, anchor+c.at); got != c.want {
			t.Errorf("denies(cost %d, anchor%+dns) = %v, want %v", c.cost, c.at, got, c.want)
		}
	}
	if d := e.staleAt() - anchor; d != 9*second || !e.stale(anchor+9*second) || e.stale(anchor+9*second-1) || !e.stale(anchor-1) {
		t.Errorf("staleAt anchor%+dns, want anchor+9s", d)
	}
	// At +0.5 s the bucket holds 1.5 tokens if nobody spent since, 0.5 if
	// the one whole token the bound allowed was spent through another
	// gateway: what the client is told is the second, and it is unsure
	// (the entry alone would say 4 s).
	q, retry, sure := e.reply(5, 0, anchor+second/2)
	if want := (quota{plan: "p", limit: 10, rate: 1, remaining: 0, next: 1, reset: 10}); retry != 5 || q != want || sure {
		t.Errorf("reply at +0.5s = %+v, retry %d, sure %v; want %+v (0.5 tokens), retry 5 (4.5 s), unsure", q, retry, sure, want)
	}
	_, retry, _ = e.reply(2, 0, anchor+second-m(second)-1)
	if retry != 2 {
		t.Errorf("retry-after %d just before the window ends, want 2 (a token short of 2 if one was spent elsewhere)", retry)
	}
	if _, retry, _ = e.reply(11, 0, anchor+second/2); retry != 0 {
		t.Errorf("retry-after %d for a cost above the capacity, want none (0): no wait admits it", retry)
	}
	slow, _ := newDenyEntry("k", 1, anchor, anchor, deniedAnswer(10, 0, 1e-6))
	if !slow.denies(1, anchor+bucketbound.MaxWindow-bucketbound.Margin(bucketbound.MaxWindow)-1) || slow.denies(1, anchor+bucketbound.MaxWindow) {
		t.Error("a very slow refill is not capped at bucketbound.MaxWindow")
	}
}

// TestDenyReplyAnchors: the decision uses the bound from the moment the
// callout left (the most the bucket can hold); what the client is told uses
// the moment the answer came (the least it holds if nobody else spends), so
// that Retry-After is never early. 0 tokens, 0.5 tokens/s, a callout that
// took 1 s to be answered.
func TestDenyReplyAnchors(t *testing.T) {
	e, _ := newDenyEntry("k", 2, anchor, anchor+second, deniedAnswer(10, 0, 0.5))
	now := anchor + 3*second/2
	if !e.denies(2, now) {
		t.Fatal("cost 2 not denied 1.5 s into a 4 s wait")
	}
	q, retry, sure := e.reply(2, 0, now)
	// 0.5 s after the answer: 0.25 tokens; 1.75 more take 3.5 s (4), the
	// next whole token 1.5 s (2), full 19.5 s (20). The bound, from the
	// callout's departure, is 0.75 tokens: nothing can have been spent
	// elsewhere, so the reply is sure.
	if want := (quota{plan: "p", limit: 10, rate: 0.5, remaining: 0, next: 2, reset: 20}); q != want || retry != 4 || !sure {
		t.Errorf("reply = %+v, retry %d, sure %v; want %+v, retry 4, sure", q, retry, sure, want)
	}
}

// TestDenyReplyRegionBucket: a hot client's region bucket refills at its
// share of the plan's rate (x-ratelimit-bucket-rate). The bound denies by
// the plan's rate, which a growing share may reach; what the client is
// told comes from the region's: a third of 1 token/s, 0 tokens, cost 1,
// so Retry-After and t are 3 s, not the plan's 1 s, and the region's 2
// tokens are full in 6 s. The entry keeps the bucket rate through the
// shard's encoding.
func TestDenyReplyRegionBucket(t *testing.T) {
	a := deniedAnswer(6, 0, 1)
	a.BucketRate = 1.0 / 3
	e, ok := newDenyEntry("k", 1, anchor, anchor, a)
	if !ok {
		t.Fatal("no entry")
	}
	if !e.denies(1, anchor+second/2) || e.denies(1, anchor+second) {
		t.Error("the bound does not deny by the plan's rate")
	}
	got, ok := findEntry(encodeShard([]denyEntry{e}), "k")
	if !ok || got != e {
		t.Fatalf("round trip: %+v %v, want %+v", got, ok, e)
	}
	q, retry, _ := got.reply(1, 0, anchor)
	if want := (quota{plan: "p", limit: 6, rate: 1, remaining: 0, next: 3, reset: 6}); q != want || retry != 3 {
		t.Errorf("reply = %+v, retry %d; want %+v, retry 3", q, retry, want)
	}
}

func TestShardEncoding(t *testing.T) {
	entries := []denyEntry{
		{key: "a", plan: "gold", limit: 10, tokens: 0.5, rate: 2e-10, sent: anchor, recv: anchor, pending: 3},
		{key: string(make([]byte, MaxKeyLen)), plan: "", limit: 1, tokens: 0, rate: 1e-9, sent: anchor + 1, recv: anchor + 1},
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
		"version":      {1, 0},
		"count":        {denyFormat, 1},
		"truncated":    b[:len(b)-1],
		"trailing":     append(slices.Clone(b), 0),
		"zero rate":    encodeShard([]denyEntry{{key: "a", limit: 1, rate: 0, sent: anchor, recv: anchor}}),
		"NaN tokens":   encodeShard([]denyEntry{{key: "a", limit: 1, tokens: math.NaN(), rate: 1, sent: anchor, recv: anchor}}),
		"infinite":     encodeShard([]denyEntry{{key: "a", limit: 1, rate: math.Inf(1), sent: anchor, recv: anchor}}),
		"no capacity":  encodeShard([]denyEntry{{key: "a", limit: 0, rate: 1, sent: anchor, recv: anchor}}),
		"tokens above": encodeShard([]denyEntry{{key: "a", limit: 1, tokens: 2, rate: 1, sent: anchor, recv: anchor}}),
		"recv first":   encodeShard([]denyEntry{{key: "a", limit: 1, rate: 1, sent: anchor, recv: anchor - 1}}),
		"pending < 0":  encodeShard([]denyEntry{{key: "a", limit: 1, rate: 1, sent: anchor, recv: anchor, pending: -1}}),
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
	f.Add(encodeShard([]denyEntry{{key: "k", plan: "p", limit: 10, tokens: 1, rate: 1e-9, sent: anchor, recv: anchor}}))
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
	reads       int
	writes      int
}

func newSharedHost() *sharedHost {
	return &sharedHost{data: map[string][]byte{}, cas: map[string]uint32{}}
}

func (h *sharedHost) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	h.reads++
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
	e, _ := newDenyEntry(key, 5, at, at, deniedAnswer(10, 1, 1))
	return e
}

func TestDenyCacheStore(t *testing.T) {
	c := newDenyCache("rl")
	h := newSharedHost()
	c.store(h, entry("a", anchor), anchor)
	c.store(h, entry("a", anchor+second), anchor+second) // replaces
	if e, ok := c.lookup(h, "a"); !ok || e.sent != anchor+second {
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

// TestDenyCachePending: a callout's cost is added to the entry whose answer
// came before it was sent, and taken off only that entry; lost races are
// retried, and what is pending never goes below zero.
func TestDenyCachePending(t *testing.T) {
	c := newDenyCache("rl")
	h := newSharedHost()
	if _, ok := c.addPending(h, "a", 1, anchor+1); ok {
		t.Error("counted a callout for a client with no entry")
	}
	c.store(h, entry("a", anchor), anchor)
	pending := func(want int64) {
		t.Helper()
		if e, ok := c.lookup(h, "a"); !ok || e.pending != want {
			t.Errorf("lookup(a) = %+v %v, want pending %d", e, ok, want)
		}
	}
	if _, ok := c.addPending(h, "a", 1, anchor); ok {
		t.Error("counted a callout sent as the entry's answer came")
	}
	first, ok := c.addPending(h, "a", 2, anchor+1)
	if !ok || first != (anchors{anchor, anchor}) {
		t.Fatalf("addPending = %+v %v, want the entry's anchors", first, ok)
	}
	h.casFailures = denyCASAttempts - 1
	if _, ok := c.addPending(h, "a", 3, anchor+2); !ok {
		t.Error("count lost after retried CAS mismatches")
	}
	pending(5)
	h.casFailures = denyCASAttempts
	if _, ok := c.addPending(h, "a", 1, anchor+3); ok {
		t.Error("counted despite every attempt failing")
	}
	pending(5)
	c.subPending(h, "a", 2, first)
	pending(3)
	c.subPending(h, "a", 4, first)
	pending(0)

	// A newer entry counts nothing, and a callout counted in the older one
	// does not take its cost off it.
	c.addPending(h, "a", 2, anchor+4)
	c.store(h, entry("a", anchor+second), anchor+second)
	pending(0)
	if _, ok := c.addPending(h, "a", 1, anchor+second+1); !ok {
		t.Fatal("no count in the newer entry")
	}
	c.subPending(h, "a", 2, first)
	pending(1)
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
	// The entries refreshed longest ago were evicted.
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

// A full shard evicts the entry refreshed longest ago, whatever its plan:
// a busy client's entry, on a plan that refills in seconds, is kept beside
// entries of a plan that refills over an hour, which nobody has asked
// about since (a scanner's spent keys), and an entry asked about again
// counts as refreshed then.
func TestDenyCacheEvictsTheLeastRefreshed(t *testing.T) {
	c := newDenyCache("rl")
	h := newSharedHost()
	shard := c.shardKey("busy")
	var scan []string
	for i := 0; len(scan) < denyShardEntries; i++ {
		if k := "scan" + strconv.Itoa(i); c.shardKey(k) == shard {
			scan = append(scan, k)
		}
	}
	hourly := func(key string, at int64) denyEntry { // 1 token an hour: stale an hour later
		e, ok := newDenyEntry(key, 1, at, at, deniedAnswer(1, 0, 1.0/3600))
		if !ok {
			t.Fatal("no entry for the hourly plan")
		}
		return e
	}
	for i, k := range scan {
		c.store(h, hourly(k, anchor+int64(i)*second/100), anchor+int64(i)*second/100)
	}
	// scan[0] is asked about again after the others were stored.
	e0, _ := c.lookup(h, scan[0])
	if !c.reask(h, scan[0], anchors{e0.sent, e0.recv}, false, anchor+2*second) {
		t.Fatal("no re-ask")
	}
	busy := entry("busy", anchor+3*second) // 10 + 1/s: stale 10 s later
	// The entry it evicts is past its trust: not counted.
	if stored, evicted := c.store(h, busy, anchor+3*second); !stored || evicted != 0 {
		t.Fatalf("busy client's entry: stored %v, counting %d evicted; want stored, none counted", stored, evicted)
	}
	if _, ok := c.lookup(h, "busy"); !ok {
		t.Error("the busy client's new entry was evicted at once")
	}
	if _, ok := c.lookup(h, scan[0]); !ok {
		t.Error("the entry asked about again was evicted")
	}
	if _, ok := c.lookup(h, scan[1]); ok {
		t.Error("the entry refreshed longest ago was kept")
	}
	// Eight more clients 100 ms later evict the other seven scan entries
	// and scan[0] (asked about 1.1 s before: past its trust), then the
	// busy client's (answered 0.1 s before: trusted), the one counted.
	counted := 0
	for i, n := 0, 0; n < denyShardEntries; i++ {
		if k := "more" + strconv.Itoa(i); c.shardKey(k) == shard {
			_, evicted := c.store(h, entry(k, anchor+3*second+second/10), anchor+3*second+second/10)
			counted += evicted
			n++
		}
	}
	if _, ok := c.lookup(h, "busy"); ok || counted != 1 {
		t.Errorf("after 8 more clients: busy client's entry kept %v, %d evictions counted; want evicted, 1 counted", ok, counted)
	}
}

// encodeShard and decodeShard are the shard format written out whole: the
// model the cache's byte-level rewrite (withEntry) is checked against.

func encodeShard(entries []denyEntry) []byte {
	b := make([]byte, 2, 2+len(entries)*(3+denyEntryFixed+32))
	b[0], b[1] = denyFormat, byte(len(entries))
	for _, e := range entries {
		b = appendEntry(b, e)
	}
	return b
}

// decodeShard reads every entry; false for a value it does not understand.
func decodeShard(b []byte) ([]denyEntry, bool) {
	n, ok := shardHeader(b)
	if !ok {
		return nil, false
	}
	entries := make([]denyEntry, 0, n)
	at := 2
	for i := 0; i < n; i++ {
		key, plan, fixed, next, ok := entryAt(b, at)
		if !ok {
			return nil, false
		}
		e := entryFrom(string(key), string(plan), fixed)
		if !e.valid() {
			return nil, false
		}
		entries = append(entries, e)
		at = next
	}
	return entries, at == len(b)
}

// modelStore is what storing e into shard v must give: decode every entry,
// drop the client's old one (keeping the later of the two times it was
// asked about) and the stale ones, add e, evict whichever was
// refreshed longest ago while the shard is over its size (the earliest such
// on a tie), encode; and count the evicted entries that were trusted.
func modelStore(v []byte, e denyEntry, now int64) (b []byte, evicted int) {
	old, ok := decodeShard(v)
	if !ok || len(old) > denyShardEntries {
		old = nil
	}
	entries := make([]denyEntry, 0, len(old)+1)
	for _, o := range old {
		if o.key == e.key {
			e.asked = max(e.asked, o.asked) // the client's turn to ask outlives its entry
		} else if !o.stale(now) {
			entries = append(entries, o)
		}
	}
	entries = append(entries, e)
	for len(entries) > denyShardEntries {
		evict := 0
		for i := range entries {
			if entries[i].refreshed() < entries[evict].refreshed() {
				evict = i
			}
		}
		if now-entries[evict].refreshed() < DenyTrust {
			evicted++
		}
		entries = append(entries[:evict], entries[evict+1:]...)
	}
	return encodeShard(entries), evicted
}

// The byte-level rewrite of a shard equals the model on random shards:
// few keys (so the client's old entry is often there), entries stale and
// live, full shards, ties in when they were refreshed, and unreadable
// values.
func TestWithEntryMatchesTheModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := newDenyCache("sidecar")
	// Few distinct values, so that ties and full shards are common.
	entry := func() denyEntry {
		limit := int64(4 * (1 + rng.IntN(2)))
		e := denyEntry{key: fmt.Sprintf("k%d", rng.IntN(24)), plan: []string{"", "free", "pro"}[rng.IntN(3)], limit: limit,
			tokens: float64(limit) * float64(rng.IntN(3)) / 4, rate: float64(1 + rng.IntN(2)),
			sent: anchor + int64(rng.IntN(3))*second}
		e.recv = e.sent + int64(rng.IntN(3))*1e6
		if rng.IntN(3) == 0 {
			e.asked = e.recv + int64(rng.IntN(3))*second
		}
		return e
	}
	full := 0
	for i := 0; i < 20000; i++ {
		var shard []byte
		switch rng.IntN(10) {
		case 0: // nothing stored yet
		case 1: // not what this filter writes
			shard = []byte{denyFormat, 3, 1}
		case 2: // more entries than this filter writes
			var es []denyEntry
			for range denyShardEntries + 1 {
				es = append(es, entry())
			}
			shard = encodeShard(es)
		default:
			var es []denyEntry
			seen := map[string]bool{}
			n := denyShardEntries
			if rng.IntN(2) == 0 {
				n = rng.IntN(denyShardEntries + 1)
			}
			for range n {
				if o := entry(); !seen[o.key] {
					seen[o.key] = true
					es = append(es, o)
				}
			}
			shard = encodeShard(es)
		}
		e := entry()
		now := anchor + int64(rng.IntN(6))*second
		want, wantEvicted := modelStore(shard, e, now)
		if old, ok := decodeShard(want); ok && len(old) == denyShardEntries {
			full++
		}
		got, evicted := c.withEntry(shard, e, now)
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: storing %+v at %d into %x\ngot  %x\nwant %x", i, e, now, shard, got, want)
		}
		if evicted != wantEvicted {
			t.Fatalf("case %d: storing %+v at %d into %x evicted %d, want %d", i, e, now, shard, evicted, wantEvicted)
		}
	}
	// Eviction is where the two could part: make sure it was reached.
	if full < 200 {
		t.Fatalf("only %d of 20000 stores left a full shard: the cases no longer reach eviction", full)
	}
}
