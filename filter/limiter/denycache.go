package limiter

import (
	"math"
	"strconv"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/internal/bucketbound"
)

// The deny cache lets the filter answer 429 without a callout while a denied
// client's bucket cannot possibly hold enough tokens, and only then.
//
// A 429 from the sidecar carries the bucket's exact tokens τ at the moment of
// the decision (x-ratelimit-tokens), the plan's exact refill rate r
// (x-ratelimit-rate) and the capacity (ratelimit-limit). Nothing is derived
// from a rounded figure. Tokens only come back by refill and only leave
// through admitted requests, so at any later instant t the bucket holds at
// most τ + r·(t - decision), capped at the capacity. The filter does not
// know Redis's clock; it anchors the bound at the moment it sent the
// callout, which is no later than the decision, so the bound only grows
// looser. A request of cost c' at local time t is denied from the cache when
//
//	t - sent < w - bucketbound.Margin(w),   w = (c' - τ)/r
//
// i.e. when even the most generous bucket could not admit it: the cache
// never denies what the bucket would admit, and it never admits anything (a
// miss is a callout). Costs up to τ are never denied from the cache.
// filter/RATIONALE.md, "Why the deny cache is correct", derives the margin
// and states the limits (clock steps, plan changes).
//
// What the client is told runs the other way: Retry-After, r and t come from
// the bucket's least generous state if nobody else spends, anchored at the
// moment the answer came back (no earlier than the decision), so a client
// that honours them does not come back early.
//
// Entries live in proxy-wasm shared data, shared by every worker VM of the
// process: denyShards keys per sidecar cluster, each holding up to
// denyShardEntries clients, updated with compare-and-swap. An entry also
// counts the cost of the client's callouts that any worker sent after the
// entry's answer arrived and that are still unanswered (pending), so that a
// burst spread over the workers is answered as one (filter/RATIONALE.md,
// "Callouts on their way").

const (
	denyShards       = 64
	denyShardEntries = 8
	// denyCASAttempts bounds the retries when another VM updated the shard
	// between our read and write; losing the race only loses a cache entry.
	denyCASAttempts = 4
	denyFormat      = 5
	// DenyTrust is how long one answer is taken on trust, in ns: past it, a
	// request the entry denies is asked about instead, once per DenyTrust
	// per client per process, and the others wait for that answer, denied
	// by the entry as before. The entry's bound assumes the plan of the
	// answer it came from; a plan raised, or a client moved to a bucket
	// holding more (another plan, its hot regions changed), makes it deny
	// what the sidecar would admit, for as long as the window lasts, up to
	// bucketbound.MaxWindow. Re-asking bounds that at DenyTrust, for one
	// callout per second per denied client (filter/RATIONALE.md, "A plan
	// change is in force within two seconds").
	DenyTrust = int64(1e9)
)

// denyEntry is what one sidecar denial says about a client's bucket.
type denyEntry struct {
	key    string
	plan   string
	limit  int64   // capacity (ratelimit-limit)
	tokens float64 // exact tokens at the decision (x-ratelimit-tokens)
	rate   float64 // the plan's refill in tokens per second (x-ratelimit-rate)
	// bucketRate is what the tokens refill at when less than rate
	// (Answer.BucketRate: a hot client's region's share of it), 0 when
	// they refill at rate. The bound denies by rate, which a region whose
	// share grows may reach; what the client is told comes from refill.
	bucketRate float64
	sent       int64 // local clock when the callout was sent: no later than the decision
	recv       int64 // local clock when the answer came: no earlier than it
	// pending is the cost of the client's callouts sent after recv, by any
	// worker, that are unanswered: each may still spend it.
	pending int64
	// asked is when a worker last sent a callout to ask again about a
	// request the entry denied, past DenyTrust (0: never). Until DenyTrust
	// after it, the entry answers alone again.
	asked int64
}

// trusted reports whether the entry may deny at now without asking the
// sidecar again: its answer, or its latest re-ask, is under DenyTrust old.
// A clock that went back before either trusts it (the bound itself then
// denies nothing).
func (e *denyEntry) trusted(now int64) bool {
	return now-e.refreshed() < DenyTrust
}

// newDenyEntry makes an entry from a 429 for a request of cost sent at
// sentAt and answered at recvAt, or from a 200 for a client that already has
// an entry (the bound is the same: the exact tokens after the decision, and
// what they told the client stays true after the client spent). A 429 for a
// cost above the capacity (can never succeed) makes one too: it spent
// nothing, and its tokens bound the bucket as any denial's do, so that the
// client's next such requests are answered from the entry while it is
// trusted (fromCache). It reports false when the answer lacks the exact
// tokens or rate, or would cache nothing sound: a denial of a cost the
// tokens already cover, or a "never" for a cost within the plan's capacity
// (a hot client's region share, which another region's bucket may take).
func newDenyEntry(key string, cost, sentAt, recvAt int64, a *Answer) (denyEntry, bool) {
	if !a.HasTokens || !a.HasRate || sentAt <= 0 || recvAt < sentAt || a.Limit <= 0 || a.Tokens > float64(a.Limit) ||
		(a.Outcome == Denied && cost <= a.Limit && (a.Never || float64(cost) <= a.Tokens)) {
		return denyEntry{}, false
	}
	e := denyEntry{key: key, plan: a.Plan, limit: a.Limit, tokens: a.Tokens, rate: a.Rate, bucketRate: a.BucketRate, sent: sentAt, recv: recvAt}
	return e, e.valid()
}

// wait returns how long (ns) after the decision the bucket may first hold
// cost tokens (0 when it may already), capped at bucketbound.MaxWindow.
func (e *denyEntry) wait(cost int64) int64 {
	return bucketbound.Wait(float64(cost), e.tokens, e.rate)
}

// denies reports whether a request of cost at now cannot be admitted.
// A clock that went back past the anchor voids the entry.
func (e *denyEntry) denies(cost, now int64) bool {
	return bucketbound.Denies(float64(cost), e.tokens, e.rate, e.sent, now)
}

// staleAt is when the bucket may be full again: from then on the entry can
// deny no cost up to the capacity.
func (e *denyEntry) staleAt() int64 { return e.sent + e.wait(e.limit) }

// refreshed is when the entry last stood for a request: its answer came,
// or a worker asked again about a request it denied. A client that keeps
// sending while denied refreshes its entry every DenyTrust; an entry not
// refreshed for longer denies nothing without first asking again, so it is
// the one a full shard evicts first, whatever its plan's window: evicting
// the entry that goes stale first kept a scanner's spent keys on a plan
// refilling over an hour and dropped a busy client's on a plan refilling
// in seconds, whose every request then went to the sidecar.
func (e *denyEntry) refreshed() int64 { return max(e.recv, e.asked) }

// stale reports whether the entry is past staleAt or the clock went back
// past its anchor.
func (e *denyEntry) stale(now int64) bool {
	return now < e.sent || now >= e.staleAt()
}

// valid reports whether a decoded entry holds numbers the arithmetic can
// use; shared data is written by this filter only, but a value that is not
// what it wrote must not turn into long denials.
func (e *denyEntry) valid() bool {
	return e.limit > 0 && e.sent > 0 && e.recv >= e.sent && e.tokens >= 0 && e.tokens <= float64(e.limit) &&
		e.rate > 0 && !math.IsInf(e.rate, 0) && e.bucketRate >= 0 && e.bucketRate < e.rate && e.pending >= 0 && e.asked >= 0
}

// refill is the rate the entry's tokens refill at: bucketRate, or rate.
func (e *denyEntry) refill() float64 {
	if e.bucketRate > 0 {
		return e.bucketRate
	}
	return e.rate
}

// reply is what a cached denial of cost at now tells the client: the least
// the bucket can hold at now, and a Retry-After no earlier than the wait
// from there (none for a cost above the capacity: retryAfterFor). The least
// is what the answer left, refilled since it came, less the larger of spent
// (the cost of the callouts on their way that the denial counted) and all
// that can have been spent since the decision, through this proxy or any
// other (spendable): what the client spent through another gateway since
// this entry's answer is in neither the entry nor spent. sure reports
// whether that made no difference to the Retry-After: nothing beyond spent
// can have been spent, or the wait rounds to the same whole seconds.
func (e *denyEntry) reply(cost, spent, now int64) (q quota, retry int64, sure bool) {
	br := e.refill()
	tokens := e.tokens
	if now > e.recv {
		tokens += br * (float64(now-e.recv) / 1e9)
	}
	tokens = math.Min(tokens, bucketCapacity(e.limit, e.rate, br))
	known := tokens - float64(spent)
	least := math.Min(known, math.Max(0, tokens-float64(e.spendable(now))))
	q = quotaAt(e.plan, e.limit, e.rate, br, least)
	retry = retryAfterFor(cost, e.limit, least, br, q.next)
	if least == known {
		return q, retry, true
	}
	known0 := quotaAt(e.plan, e.limit, e.rate, br, known)
	return q, retry, retry == retryAfterFor(cost, e.limit, known, br, known0.next)
}

// spendable is the most that can have been spent from the bucket between
// the entry's decision and now, by anyone: costs are whole tokens, and no
// more can be spent than the bound lets the bucket hold, τ + rate × the time
// since the callout was sent (capped at the capacity), with the bound's
// margin for the two clocks (bucketbound.Margin).
func (e *denyEntry) spendable(now int64) int64 {
	if now <= e.sent {
		return int64(math.Floor(e.tokens))
	}
	el := now - e.sent
	most := e.tokens + e.rate*(float64(el+bucketbound.Margin(el))/1e9)
	return int64(math.Floor(math.Min(most, float64(e.limit))))
}

// denyCache is one plugin's view of the shared deny entries.
type denyCache struct {
	// shards are the shared-data keys, "edgelimit/deny/v4/<cluster>/<n>",
	// made once so that a lookup builds no string.
	shards []string
	// buf is the scratch a shard is rewritten in (the VM runs one callback
	// at a time, and the host copies what is set).
	buf *[]byte
}

func newDenyCache(cluster string) denyCache {
	prefix := "edgelimit/deny/v" + strconv.Itoa(denyFormat) + "/" + cluster + "/"
	buf := make([]byte, 0, 2+denyShardEntries*(3+denyEntryFixed+64))
	c := denyCache{shards: make([]string, denyShards), buf: &buf}
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
// ones; when the shard is full the entry refreshed longest ago is evicted
// (refreshed). It reports whether e was written, and how many trusted
// entries the write evicted (rewrite).
func (c denyCache) store(h abi.Host, e denyEntry, now int64) (stored bool, evicted int) {
	sk := c.shardKey(e.key)
	for attempt := 0; attempt < denyCASAttempts; attempt++ {
		v, cas, s := h.GetSharedData(sk)
		if s != abi.StatusOK && s != abi.StatusNotFound {
			return false, 0
		}
		b, evicted := c.withEntry(v, e, now)
		switch h.SetSharedData(sk, b, cas) {
		case abi.StatusOK:
			return true, evicted
		case abi.StatusCASMismatch:
			continue
		}
		return false, 0
	}
	return false, 0
}

// anchors identify one entry of a client: the local times its answer's
// callout was sent and the answer came. An entry with the same anchors as
// another is taken for it, which can only make what is pending smaller.
type anchors struct{ sent, recv int64 }

// addPending counts cost as pending in key's entry, sent at sentAt: the
// entry the shard holds now, if its answer came before sentAt. It reports
// the anchors of the entry it counted in.
func (c denyCache) addPending(h abi.Host, key string, cost, sentAt int64) (anchors, bool) {
	return c.changePending(h, key, cost, anchors{}, sentAt)
}

// subPending takes cost off what is pending in key's entry, if that is still
// the entry with anchors at: a newer entry does not count the callout.
func (c denyCache) subPending(h abi.Host, key string, cost int64, at anchors) {
	c.changePending(h, key, -cost, at, 0)
}

// reask marks key's entry, the one with anchors at, as asked about again at
// now, with compare-and-swap, if it is not trusted at now, or, when unsure
// (the denial's Retry-After would count spending the entry cannot tell
// from none), if no request asked about the client in the last DenyTrust.
// It reports whether it did: exactly one of the workers that find the
// entry so at once wins, and its request goes to the sidecar.
func (c denyCache) reask(h abi.Host, key string, at anchors, unsure bool, now int64) bool {
	_, ok := c.patch(h, key, askedOffset,
		func(e denyEntry) bool {
			return at == anchors{e.sent, e.recv} && (!e.trusted(now) || unsure && !(now >= e.asked && now-e.asked < DenyTrust))
		},
		func(denyEntry) uint64 { return uint64(now) })
	return ok
}

// drop removes key's entry, if any: the sidecar no longer knows the key
// (a 403), so no bucket of it bounds anything.
func (c denyCache) drop(h abi.Host, key string, now int64) {
	sk := c.shardKey(key)
	for attempt := 0; attempt < denyCASAttempts; attempt++ {
		v, cas, s := h.GetSharedData(sk)
		if s != abi.StatusOK {
			return
		}
		if _, _, ok := locateEntry(v, key); !ok {
			return
		}
		if b, _ := c.without(v, key, now); h.SetSharedData(sk, b, cas) != abi.StatusCASMismatch {
			return
		}
	}
}

// changePending adds d to the pending cost of key's entry in place, with
// compare-and-swap: the entry with anchors at, or, when at is zero, the
// entry whose answer came before sentAt. Pending never goes below zero.
func (c denyCache) changePending(h abi.Host, key string, d int64, at anchors, sentAt int64) (anchors, bool) {
	e, ok := c.patch(h, key, pendingOffset,
		func(e denyEntry) bool {
			if at == (anchors{}) {
				return e.recv < sentAt
			}
			return at == anchors{e.sent, e.recv}
		},
		func(e denyEntry) uint64 { return uint64(max(e.pending+d, 0)) })
	return anchors{e.sent, e.recv}, ok
}

// patch writes one field of key's entry in place, at offset field of its
// fixed part, with compare-and-swap: the value value gives for the entry
// the shard holds, if match accepts it. It reports the entry it patched
// (as it was read), or none.
func (c denyCache) patch(h abi.Host, key string, field int, match func(denyEntry) bool, value func(denyEntry) uint64) (denyEntry, bool) {
	sk := c.shardKey(key)
	for attempt := 0; attempt < denyCASAttempts; attempt++ {
		v, cas, s := h.GetSharedData(sk)
		if s != abi.StatusOK {
			return denyEntry{}, false
		}
		off, e, ok := locateEntry(v, key)
		if !ok || !match(e) {
			return denyEntry{}, false
		}
		b := append((*c.buf)[:0], v...)
		putU64(b[off+field:], value(e))
		*c.buf = b
		switch h.SetSharedData(sk, b, cas) {
		case abi.StatusOK:
			return e, true
		case abi.StatusCASMismatch:
			continue
		}
		return denyEntry{}, false
	}
	return denyEntry{}, false
}

// withEntry returns shard v with e stored, in the cache's scratch buffer
// (valid until the next call): the entries of other clients that are not
// stale are copied as they are, without decoding their keys, so a denial
// allocates nothing. A shard that is unreadable, or holds more entries than
// this filter writes, is overwritten. evicted is how many trusted entries
// it left out for want of room (rewrite).
func (c denyCache) withEntry(v []byte, e denyEntry, now int64) (b []byte, evicted int) {
	return c.rewrite(v, &e, e.key, now)
}

// without returns shard v without key's entry, as withEntry does.
func (c denyCache) without(v []byte, key string, now int64) (b []byte, evicted int) {
	return c.rewrite(v, nil, key, now)
}

// rewrite returns shard v with key's entry replaced by e, or removed when e
// is nil, and the stale entries of other clients dropped, and how many
// entries it evicted for want of room were trusted at now: each could
// have answered its client's requests for the rest of its trust without a
// callout. An entry past its trust asks about the next request it denies
// anyway, so evicting it costs nothing worth counting.
func (c denyCache) rewrite(v []byte, e *denyEntry, key string, now int64) (b []byte, evicted int) {
	type kept struct {
		from, to  int
		refreshed int64
	}
	var keep [denyShardEntries + 1]kept
	n := 0
	if count, ok := shardHeader(v); ok && count <= denyShardEntries {
		at := 2
		for i := 0; i < count && ok; i++ {
			var k, fixed []byte
			var next int
			if k, _, fixed, next, ok = entryAt(v, at); !ok {
				break
			}
			o := entryFrom("", "", fixed)
			if ok = o.valid(); ok && e != nil && string(k) == key {
				// The client's turn to ask outlives its entry: an
				// answer replacing the entry leaves the next ask a
				// DenyTrust after the last (reask).
				e.asked = max(e.asked, o.asked)
			}
			if ok && string(k) != key && !o.stale(now) {
				keep[n] = kept{at, next, o.refreshed()}
				n++
			}
			at = next
		}
		if !ok || at != len(v) {
			n = 0
		}
	}
	if e != nil {
		keep[n] = kept{-1, -1, e.refreshed()} // the new entry, last
		n++
	}
	for n > denyShardEntries {
		evict := 0
		for i := 1; i < n; i++ {
			if keep[i].refreshed < keep[evict].refreshed {
				evict = i
			}
		}
		if now-keep[evict].refreshed < DenyTrust {
			evicted++
		}
		copy(keep[evict:n], keep[evict+1:n])
		n--
	}
	b = append((*c.buf)[:0], denyFormat, byte(n))
	for _, k := range keep[:n] {
		if k.from < 0 {
			b = appendEntry(b, *e)
		} else {
			b = append(b, v[k.from:k.to]...)
		}
	}
	*c.buf = b
	return b, evicted
}

// Shard format: version byte, entry count byte, then per entry a u16 key
// length and the key, a u8 plan length and the plan, limit (i64), tokens
// (f64 bits), rate (tokens per second, f64 bits), sent, recv and pending
// (i64), bucket rate (f64 bits, 0 for the plan's), asked (i64),
// little-endian. The format is in the keys (deny/v5): formats 1 (a rate per
// ns derived from a rounded wait, one anchor), 2 (nothing pending), 3 (no
// bucket rate) and 4 (no re-ask) live under other keys, so an older
// filter's VM in the same process never reads these, nor they its.

const (
	denyEntryFixed = 64
	pendingOffset  = 40 // of pending in the fixed part
	askedOffset    = 56 // of asked in the fixed part
)

// appendEntry appends e in the shard format.
func appendEntry(b []byte, e denyEntry) []byte {
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
	b = appendU64(b, uint64(e.sent))
	b = appendU64(b, uint64(e.recv))
	b = appendU64(b, uint64(e.pending))
	b = appendU64(b, math.Float64bits(e.bucketRate))
	return appendU64(b, uint64(e.asked))
}

// findEntry looks for key in an encoded shard, decoding only its entry.
func findEntry(b []byte, key string) (denyEntry, bool) {
	_, e, ok := locateEntry(b, key)
	return e, ok
}

// locateEntry finds key's entry in an encoded shard and returns it with the
// offset of its fixed part.
func locateEntry(b []byte, key string) (int, denyEntry, bool) {
	n, ok := shardHeader(b)
	if !ok {
		return 0, denyEntry{}, false
	}
	at := 2
	for i := 0; i < n; i++ {
		k, plan, fixed, next, ok := entryAt(b, at)
		if !ok {
			return 0, denyEntry{}, false
		}
		if string(k) == key {
			e := entryFrom(key, string(plan), fixed)
			return next - denyEntryFixed, e, e.valid()
		}
		at = next
	}
	return 0, denyEntry{}, false
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
		key:        key,
		plan:       plan,
		limit:      int64(u64(f[0:])),
		tokens:     math.Float64frombits(u64(f[8:])),
		rate:       math.Float64frombits(u64(f[16:])),
		sent:       int64(u64(f[24:])),
		recv:       int64(u64(f[32:])),
		pending:    int64(u64(f[pendingOffset:])),
		bucketRate: math.Float64frombits(u64(f[48:])),
		asked:      int64(u64(f[askedOffset:])),
	}
}

func appendU64(b []byte, v uint64) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
}

func putU64(b []byte, v uint64) {
	_ = b[7]
	b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
}

func u64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}
