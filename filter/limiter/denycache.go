package limiter

import (
	"math"
	"strconv"

	"github.com/edgelimit/edgelimit/filter/abi"
)

// The deny cache lets the filter answer 429 without a callout while a denied
// client's bucket cannot possibly hold enough tokens, and only then.
//
// A 429 from the sidecar carries the bucket's exact tokens τ at the moment of
// the decision (x-ratelimit-tokens), the exact wait until the denied cost c is
// back (x-ratelimit-retry-after-ms) and the capacity (ratelimit-limit). From
// them the refill rate is (c-τ)/wait. Tokens only come back by refill and only
// leave through admitted requests, so at any later instant t the bucket holds
// at most τ + rate·(t - decision), capped at the capacity. The filter does
// not know Redis's clock; it anchors the bound at the moment it sent the
// callout, which is no later than the decision, so the bound only grows
// looser. A request of cost c' at local time t is denied from the cache when
//
//	t < anchor + (c' - τ)/rate - denyMargin
//
// i.e. when even the most generous bucket could not admit it: the cache
// never denies what the bucket would admit, and it never admits anything (a
// miss is a callout). Costs below τ are never denied from the cache.
// filter/RATIONALE.md, "Why the deny cache is correct", has the details and
// the limits (clock steps, plan changes).
//
// Entries live in proxy-wasm shared data, shared by every worker VM of the
// process: denyShards keys per sidecar cluster, each holding up to
// denyShardEntries clients, updated with compare-and-swap.

const (
	denyShards       = 64
	denyShardEntries = 8
	// denyMargin absorbs rounding: the sidecar's retry-after-ms may be
	// rounded up to a whole millisecond, and the rate is derived in
	// floating point.
	denyMargin = int64(1e6)
	// maxDenyWindow caps how far ahead one denial reaches (a very slow
	// refill); a shorter window only means more callouts.
	maxDenyWindow = 3600 * int64(1e9)
	// denyCASAttempts bounds the retries when another VM updated the shard
	// between our read and write; losing the race only loses a cache entry.
	denyCASAttempts = 4
	denyFormat      = 1
)

// denyEntry is what one sidecar denial says about a client's bucket.
type denyEntry struct {
	key    string
	plan   string
	limit  int64   // capacity (ratelimit-limit)
	tokens float64 // exact tokens at the decision
	rate   float64 // refill in tokens per nanosecond
	anchor int64   // local clock when the callout was sent
}

// newDenyEntry derives an entry from a 429 for a request of cost sent at
// sentAt. It reports false when the answer lacks what the arithmetic needs
// or is inconsistent (cost above the capacity: the wait is then not a
// refill time).
func newDenyEntry(key string, cost, sentAt int64, a *Answer) (denyEntry, bool) {
	if !a.HasTokens || !a.HasRetryMs || a.RetryAfterMs <= 0 || sentAt <= 0 ||
		a.Limit <= 0 || cost > a.Limit || float64(cost) <= a.Tokens {
		return denyEntry{}, false
	}
	rate := (float64(cost) - a.Tokens) / (a.RetryAfterMs * 1e6)
	if !(rate > 0) || math.IsInf(rate, 0) {
		return denyEntry{}, false
	}
	return denyEntry{key: key, plan: a.Plan, limit: a.Limit, tokens: a.Tokens, rate: rate, anchor: sentAt}, true
}

// wait returns how long after the anchor the bucket may first hold cost
// tokens (0 when it may already), capped at maxDenyWindow.
func (e *denyEntry) wait(cost int64) int64 {
	need := float64(cost) - e.tokens
	if need <= 0 {
		return 0
	}
	d := need / e.rate
	if d >= float64(maxDenyWindow) {
		return maxDenyWindow
	}
	return int64(d)
}

// denies reports whether a request of cost at now cannot be admitted.
// A clock that went back past the anchor voids the entry.
func (e *denyEntry) denies(cost, now int64) bool {
	return now >= e.anchor && now-e.anchor < e.wait(cost)-denyMargin
}

// staleAt is when the bucket may be full again: from then on the entry can
// deny no cost up to the capacity.
func (e *denyEntry) staleAt() int64 { return e.anchor + e.wait(e.limit) }

// stale reports whether the entry is past staleAt or the clock went back
// past its anchor.
func (e *denyEntry) stale(now int64) bool {
	return now < e.anchor || now >= e.staleAt()
}

// valid reports whether a decoded entry holds numbers the arithmetic can
// use; shared data is written by this filter only, but a value that is not
// what it wrote must not turn into long denials.
func (e *denyEntry) valid() bool {
	return e.limit > 0 && e.anchor > 0 && e.tokens >= 0 && e.tokens <= float64(e.limit) &&
		e.rate > 0 && !math.IsInf(e.rate, 0)
}

// reply is the 429 for a cached denial of cost at now: retry-after until the
// cost may be back, and the bucket's most generous state.
func (e *denyEntry) reply(cost, now int64) (retryAfter, remaining, reset int64) {
	retryAfter = max(ceilSeconds(e.wait(cost)-(now-e.anchor)), 1)
	est := math.Min(float64(e.limit), e.tokens+e.rate*float64(now-e.anchor))
	remaining = int64(math.Floor(est))
	reset = ceilSeconds(int64((float64(e.limit) - est) / e.rate))
	return retryAfter, remaining, reset
}

func ceilSeconds(ns int64) int64 {
	if ns <= 0 {
		return 0
	}
	return (ns + 1e9 - 1) / 1e9
}

// denyCache is one plugin's view of the shared deny entries.
type denyCache struct {
	// shards are the shared-data keys, "edgelimit/deny/v1/<cluster>/<n>",
	// made once so that a lookup builds no string.
	shards []string
}

func newDenyCache(cluster string) denyCache {
	prefix := "edgelimit/deny/v" + strconv.Itoa(denyFormat) + "/" + cluster + "/"
	c := denyCache{shards: make([]string, denyShards)}
	for i := range c.shards {
		c.shards[i] = prefix + strconv.Itoa(i)
	}
	return c
}

func (c denyCache) shardKey(key string) string {
	// FNV-1a: spreads keys over shards; a collision only shares a shard.
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return c.shards[h%denyShards]
}

// lookup returns the entry for key if there is one.
func (c denyCache) lookup(h abi.Host, key string) (denyEntry, bool) {
	v, _, s := h.GetSharedData(c.shardKey(key))
	if s != abi.StatusOK {
		return denyEntry{}, false
	}
	return findEntry(v, key)
}

// store records e, replacing the client's previous entry and dropping stale
// ones; when the shard is full the entry that goes stale first is evicted.
func (c denyCache) store(h abi.Host, e denyEntry, now int64) {
	sk := c.shardKey(e.key)
	for attempt := 0; attempt < denyCASAttempts; attempt++ {
		v, cas, s := h.GetSharedData(sk)
		if s != abi.StatusOK && s != abi.StatusNotFound {
			return
		}
		old, _ := decodeShard(v) // an unreadable shard is overwritten
		entries := make([]denyEntry, 0, len(old)+1)
		for _, o := range old {
			if o.key != e.key && !o.stale(now) {
				entries = append(entries, o)
			}
		}
		entries = append(entries, e)
		for len(entries) > denyShardEntries {
			evict := 0
			for i := range entries {
				if entries[i].staleAt() < entries[evict].staleAt() {
					evict = i
				}
			}
			entries = append(entries[:evict], entries[evict+1:]...)
		}
		if h.SetSharedData(sk, encodeShard(entries), cas) != abi.StatusCASMismatch {
			return
		}
	}
}

// Shard format: version byte, entry count byte, then per entry a u16 key
// length and the key, a u8 plan length and the plan, limit (i64), tokens
// (f64 bits), rate (f64 bits) and anchor (i64), little-endian.

const denyEntryFixed = 32

func encodeShard(entries []denyEntry) []byte {
	b := make([]byte, 2, 2+len(entries)*(3+denyEntryFixed+32))
	b[0], b[1] = denyFormat, byte(len(entries))
	for _, e := range entries {
		plan := e.plan
		if len(plan) > 255 {
			plan = ""
		}
		b = append(b, byte(len(e.key)), byte(len(e.key)>>8))
		b = append(b, e.key...)
		b = append(b, byte(len(plan)))
		b = append(b, plan...)
		b = appendU64(b, uint64(e.limit))
		b = appendU64(b, math.Float64bits(e.tokens))
		b = appendU64(b, math.Float64bits(e.rate))
		b = appendU64(b, uint64(e.anchor))
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

// findEntry looks for key in an encoded shard, decoding only its entry.
func findEntry(b []byte, key string) (denyEntry, bool) {
	n, ok := shardHeader(b)
	if !ok {
		return denyEntry{}, false
	}
	at := 2
	for i := 0; i < n; i++ {
		k, plan, fixed, next, ok := entryAt(b, at)
		if !ok {
			return denyEntry{}, false
		}
		if string(k) == key {
			e := entryFrom(key, string(plan), fixed)
			return e, e.valid()
		}
		at = next
	}
	return denyEntry{}, false
}

func shardHeader(b []byte) (int, bool) {
	if len(b) < 2 || b[0] != denyFormat {
		return 0, false
	}
	return int(b[1]), true
}

// entryAt splits the entry at offset at into its key, plan and fixed part.
func entryAt(b []byte, at int) (key, plan, fixed []byte, next int, ok bool) {
	if len(b)-at < 2 {
		return nil, nil, nil, 0, false
	}
	kl := int(b[at]) | int(b[at+1])<<8
	at += 2
	if len(b)-at < kl+1 {
		return nil, nil, nil, 0, false
	}
	key = b[at : at+kl]
	at += kl
	pl := int(b[at])
	at++
	if len(b)-at < pl+denyEntryFixed {
		return nil, nil, nil, 0, false
	}
	plan = b[at : at+pl]
	at += pl
	return key, plan, b[at : at+denyEntryFixed], at + denyEntryFixed, true
}

func entryFrom(key, plan string, f []byte) denyEntry {
	return denyEntry{
		key:    key,
		plan:   plan,
		limit:  int64(u64(f[0:])),
		tokens: math.Float64frombits(u64(f[8:])),
		rate:   math.Float64frombits(u64(f[16:])),
		anchor: int64(u64(f[24:])),
	}
}

func appendU64(b []byte, v uint64) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
}

func u64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}
