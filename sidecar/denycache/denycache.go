// Package denycache answers from memory the checks that Redis could only
// deny, and sends Redis the rest.
//
// It wraps a Decider. After Redis denies a check, the script's answer bounds
// the bucket: at a later instant it holds at most τ + r·Δt
// (internal/bucketbound). While that bound is below a check's cost, the check
// is denied here, without a round trip. The bound counts what every gateway
// and every sidecar spends, so no such denial is one Redis would have
// admitted.
//
// A burst adds the checks on their way. While a bucket has an entry, the
// cache counts the cost of its checks that were passed on to Redis after
// the entry's answer came back and are unanswered (pending): Redis decides
// each after the entry's decision, so τ does not hold it. If all of them
// are admitted, the bucket holds at most τ + r·Δt − pending for anything
// else, and a check that does not fit there is denied here too. This is the
// rule of the filter's deny cache ("Callouts on their way" in
// filter/RATIONALE.md), but the sidecar sees the checks of every gateway
// that shares it, where each gateway sees only its own. A pending check
// that Redis goes on to deny spent nothing, so the check denied in its
// place might have been admitted: its tokens stay in the bucket for the
// client's next request, which is admitted a little later; none is added
// or lost.
//
// A denial the bound explains, or an admission of a check counted in the
// entry, replaces the entry, which then counts nothing as pending: every
// check still out was passed on before that answer came, and Redis may
// have decided it first. Errors, never answers and answers to checks sent
// before the entry was made leave it as it is.
//
// Entries are keyed by the bucket's Redis key and its limit: a plan that
// changes its capacity or rate starts afresh. A bucket that gains tokens
// otherwise than by refill (Redis flushed or failed over to a replica that
// had not seen the last writes, a clock stepped forward) can be denied here
// until its entry ends, at most the time to refill it, capped at an hour;
// sidecar/RATIONALE.md has these limits.
package denycache

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/internal/bucketbound"
	"github.com/edgelimit/edgelimit/lua"
)

// Decider is what the cache wraps: decide.Decider, as server.Decider has it.
type Decider interface {
	Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error)
	Ready(ctx context.Context) error
	Refused() error
}

const (
	shards = 64
	// shardEntries bounds each shard's entries. A full shard drops the
	// entries past their window first; if none is, the entry a check came
	// for longest ago, which only costs that bucket's next checks a round
	// trip to Redis.
	shardEntries = 1024
)

// Cache answers checks its entries can deny and passes the rest on. It is
// safe for concurrent use.
type Cache struct {
	next   Decider
	seed   maphash.Seed
	epoch  time.Time
	clock  func() int64 // ns, > 0; tests set another
	shards [shards]shard
	// OnDenied, if set, is called for each check denied here.
	OnDenied func()
	// OnFull, if set, is called for each denial kept in a full shard none
	// of whose entries was past its window, by evicting the entry a check
	// came for longest ago.
	OnFull func()
}

type shard struct {
	mu      sync.Mutex
	entries map[string]*entry
}

// entry is what Redis's last answer says about one bucket.
type entry struct {
	limit  lua.Limit
	tokens float64 // τ, the bucket's tokens after the decision
	sent   int64   // the clock when the check was passed on: no later than the decision
	// pending is the cost of the bucket's checks passed on since the entry
	// was made, when its answer came, and still unanswered.
	pending int64
	// used is the clock when a check last came for the bucket: when the
	// entry was made, or denied or passed on a check since. A full shard
	// evicts the entry used longest ago.
	used int64
}

// New wraps next.
func New(next Decider) *Cache {
	c := &Cache{next: next, seed: maphash.MakeSeed(), epoch: time.Now()}
	c.clock = c.monotonic
	for i := range c.shards {
		c.shards[i].entries = make(map[string]*entry)
	}
	return c
}

// Ready reports whether the wrapped Decider can decide now.
func (c *Cache) Ready(ctx context.Context) error { return c.next.Ready(ctx) }

// Refused is the wrapped Decider's: a denial made here writes nothing and
// changes nothing of it.
func (c *Cache) Refused() error { return c.next.Refused() }

// monotonic is the clock, in ns since the cache was made (always > 0).
func (c *Cache) monotonic() int64 { return int64(time.Since(c.epoch)) + 1 }

func (c *Cache) shard(key string) *shard {
	return &c.shards[maphash.String(c.seed, key)%shards]
}

// Decide answers a check of cost on the bucket key with limit l: denied
// here when the bucket's entry shows it cannot hold the cost beside the
// checks on their way, otherwise by next.
func (c *Cache) Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error) {
	sh := c.shard(key)
	sent := c.clock()
	sh.mu.Lock()
	e := sh.entries[key]
	if e != nil && (e.limit != l || e.stale(sent)) {
		delete(sh.entries, key)
		e = nil
	}
	if e != nil {
		e.used = sent
	}
	var counted *entry // the entry this check's cost was added to
	if e != nil && cost > 0 && float64(cost) <= l.Capacity {
		if res, ok := e.deny(cost, sent); ok {
			sh.mu.Unlock()
			if c.OnDenied != nil {
				c.OnDenied()
			}
			return res, nil
		}
		e.pending += cost
		counted = e
	}
	sh.mu.Unlock()

	res, err := c.next.Decide(deadline, key, l, cost)
	if counted == nil && (err != nil || res.Allowed) {
		// Nothing to take off, and no entry to make: an admission only
		// renews an entry, and one made while this check was out bounds
		// the bucket without it (this check was sent before it, so Redis
		// may have decided it first). The healthy path stops here.
		return res, err
	}

	recv := c.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	cur := sh.entries[key]
	if counted != nil && cur == counted {
		cur.pending -= cost
	}
	if err != nil || res.Never || float64(cost) > l.Capacity || res.Tokens < 0 || res.Tokens > l.Capacity {
		return res, err
	}
	// A denial makes an entry; an admission replaces one, so that the
	// entry does not go on counting what this check spent as pending.
	if res.Allowed && cur == nil {
		return res, err
	}
	if !res.Allowed && float64(cost) <= res.Tokens {
		return res, err // not a denial the bound can explain
	}
	n := &entry{limit: l, tokens: res.Tokens, sent: sent, used: recv}
	if cur == nil && len(sh.entries) >= shardEntries && sh.makeRoom(recv) && c.OnFull != nil {
		c.OnFull()
	}
	sh.entries[key] = n
	return res, err
}

// makeRoom drops the shard's entries past their window and, when that
// frees no room, the entry a check came for longest ago, reporting that it
// did. Keeping the entries in use rather than the oldest ones matters when
// many buckets are denied once and never asked about again (a scanner's
// keys on a plan refilling over an hour): a full shard used to keep them
// and refuse every new entry, so that a busy client denied after the scan
// had its every check sent to Redis.
func (sh *shard) makeRoom(now int64) (evicted bool) {
	oldest, used := "", int64(0)
	for k, e := range sh.entries {
		if e.stale(now) {
			delete(sh.entries, k)
		} else if oldest == "" || e.used < used {
			oldest, used = k, e.used
		}
	}
	if len(sh.entries) < shardEntries {
		return false
	}
	delete(sh.entries, oldest)
	return true
}

func (e *entry) stale(now int64) bool {
	return bucketbound.Stale(e.limit.Capacity, e.tokens, e.limit.Rate, e.sent, now)
}

// deny decides a check of cost at now from the entry, counting the checks
// on their way as spent, and reports whether it is denied.
func (e *entry) deny(cost, now int64) (lua.Result, bool) {
	need := cost + e.pending
	if float64(need) <= e.limit.Capacity && !bucketbound.Denies(float64(need), e.tokens, e.limit.Rate, e.sent, now) {
		return lua.Result{}, false
	}
	// Only Redis knows what other sidecars spent from the bucket since the
	// entry's decision. While the bound shows that nothing but the checks
	// on their way here can have been (not a whole token more: costs are
	// whole), the denial's waits count everything spent before it; past
	// that, the check goes to Redis, so that a client told to wait is told
	// the wait the bucket really needs.
	if !bucketbound.Denies(float64(e.pending+1), e.tokens, e.limit.Rate, e.sent, now) {
		return lua.Result{}, false
	}
	return e.denial(cost, now), true
}

// denial is the script's answer to a denied check of cost at now, for a
// bucket holding the most it can then hold for this check: the bound from
// the anchor before the decision, the checks on their way counted as
// spent. A filter that caches the answer so bounds the bucket as from
// Redis's own, and the waits are the script's from those tokens.
func (e *entry) denial(cost, now int64) lua.Result {
	r := e.limit.Rate
	tokens := max(min(e.tokens+r*float64(now-e.sent)/1e9, e.limit.Capacity)-float64(e.pending), 0)
	return lua.Denial(tokens, (float64(cost)-tokens)/r*1000, (e.limit.Capacity-tokens)/r*1000)
}
