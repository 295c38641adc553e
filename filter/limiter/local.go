package limiter

import (
	"math"
	"strconv"
	"strings"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/internal/seconds"
)

// Bounded fail-open ("on_failure": "local").
//
// Failing open lets a client through unlimited for as long as the sidecar
// cannot answer. With "local", each proxy process enforces the client's
// last known plan itself while the sidecar cannot answer, so an outage
// admits at most (number of gateways) × plan instead of everything.
//
// The plan is learned from the sidecar's 200 and 429 answers: the capacity
// (ratelimit-limit) and the exact refill rate (x-ratelimit-rate). A local
// bucket starts the first time the sidecar cannot answer for that client:
// as full as the latest answer the VM got says the sidecar's bucket can be
// (its tokens, refilled since), or full without one, and refills at the
// plan's rate on the host clock. A client no answer ever described passes,
// as with "open": the filter knows nothing to hold it to.
//
// While a bucket is in use (below full since the sidecar last failed that
// client), the sidecar's answers that still come, in an outage that is
// only partial, are settled against it: a request the sidecar admitted is
// charged to the bucket too, and the bucket is lowered to the sidecar's
// own tokens (x-ratelimit-tokens) when it holds more. The process's
// admissions of a client, the sidecar's and its own together, then stay
// within one plan, where without it the sidecar and the bucket would each
// spend the same refill. A charge can leave the bucket in debt (below
// zero, down to minus its capacity), which the refill pays first. Tokens
// are never raised from an answer, and a full bucket, the healthy state,
// is never touched.
//
// Plans and buckets live in proxy-wasm shared data, so every worker VM of
// the process enforces one bucket per client (not one per worker):
// localShards keys per sidecar cluster, each holding up to localShardEntries
// clients, updated with compare-and-swap like the deny cache. The healthy
// path writes nothing per request: each VM keeps the plans it has recorded
// in a bounded map and writes shared data only when an answer shows a plan
// it has not recorded, or a changed one, or lowers a bucket in use.
// filter/RATIONALE.md, "Why a bounded fail-open is an option", has the
// reasons.

// FailureMode is what the filter does with a request when the sidecar
// cannot answer ("on_failure").
type FailureMode uint8

// Failure modes. The zero value is FailOpen, the default.
const (
	// FailOpen lets the request through unlimited ("open").
	FailOpen FailureMode = iota
	// FailLocal holds a known client to its plan with a token bucket kept
	// in the proxy process ("local").
	FailLocal
)

func (m FailureMode) String() string {
	if m == FailLocal {
		return "local"
	}
	return "open"
}

const (
	// localShards × localShardEntries clients per sidecar cluster keep a
	// plan and a bucket; past that, the client recorded or used longest ago
	// is evicted from the shared data. A VM that recorded its plan
	// (localKnownMax) still holds it to a bucket made anew; on the others
	// it passes unlimited in an outage, as with "open".
	localShards       = 128
	localShardEntries = 16
	// localKnownMax bounds each VM's map of the plans it has recorded; a
	// plan evicted from it costs one shared-data read at its client's next
	// answer.
	localKnownMax = localShards * localShardEntries
	// localCASAttempts bounds the retries when another VM wrote the shard
	// between our read and write. Giving up admits the request (fail open)
	// or leaves a plan unrecorded until the next answer.
	localCASAttempts = 4
	// localFormat 2: a bucket's tokens can be a debt (negative), which
	// format 1 refused; the version is in the keys, so modules of the two
	// formats never read each other's shards.
	localFormat = 2
	// maxLocalWaitSeconds caps Retry-After and the reset of a local answer;
	// the sidecar refuses plans that take longer than a year to refill.
	maxLocalWaitSeconds = 365 * 24 * 3600
	// maxLocalLimit keeps capacities inside float64's exact integers.
	maxLocalLimit = int64(1) << 50
)

// localPlan is what the sidecar's answers say about a client's plan.
type localPlan struct {
	name  string  // x-ratelimit-plan, for the 429's policy header
	limit int64   // capacity in tokens (ratelimit-limit)
	rate  float64 // refill in tokens per second (x-ratelimit-rate)
}

func (p *localPlan) valid() bool {
	return p.limit > 0 && p.limit <= maxLocalLimit && p.rate > 0 &&
		!math.IsInf(p.rate, 0) && !math.IsNaN(p.rate) && len(p.name) <= 255
}

// localEntry is one client's plan and local bucket.
type localEntry struct {
	key  string
	plan localPlan
	// tokens is the bucket at time at (host clock, ns); at 0 means the
	// bucket was never used and is full.
	tokens float64
	at     int64
	// touched is when the entry was last written, for eviction.
	touched int64
}

// level returns the tokens in the bucket at now. A clock that went back
// adds nothing.
func (e *localEntry) level(now int64) float64 {
	limit := float64(e.plan.limit)
	if e.at == 0 {
		return limit
	}
	if now <= e.at {
		return math.Min(e.tokens, limit)
	}
	return math.Min(limit, e.tokens+e.plan.rate*(float64(now-e.at)/1e9))
}

// fullAt returns when the bucket is full again if nothing is taken from it
// (host clock, ns), 0 when it is full at now. Capped at
// maxLocalWaitSeconds from now.
func (e *localEntry) fullAt(now int64) int64 {
	missing := float64(e.plan.limit) - e.level(now)
	if e.at == 0 || missing <= 0 {
		return 0
	}
	return now + int64(math.Ceil(math.Min(missing/e.plan.rate, maxLocalWaitSeconds)*1e9))
}

// settle applies a sidecar's answer at now to a bucket in use: admitted
// is the cost the sidecar admitted (0 for a denial), charged to the bucket
// as well, down to a debt of one capacity at most; with hasTokens, the
// bucket is then lowered to the sidecar's tokens if it holds more. It
// reports whether it changed the bucket. A bucket never used or full is
// left as it is: full is the state a healthy client's bucket keeps.
func (e *localEntry) settle(admitted int64, tokens float64, hasTokens bool, now int64) bool {
	if e.at == 0 {
		return false
	}
	level, limit := e.level(now), float64(e.plan.limit)
	if level >= limit {
		return false
	}
	next := level - float64(admitted)
	if hasTokens {
		next = math.Min(next, math.Max(tokens, 0))
	}
	next = math.Max(next, -limit)
	if next >= level {
		return false
	}
	e.tokens, e.at = next, now
	return true
}

// bound lowers the bucket at now to what a sidecar's answer says the shared
// bucket can hold: its tokens after the decision, refilled since at (the
// callout's dispatch, no later than the decision). It reports whether the
// bucket held more. The shared bucket can only have spent since, so the
// bound never denies what it would admit, whatever other gateways did.
func (e *localEntry) bound(tokens float64, at, now int64) bool {
	b := tokens
	if now > at {
		b += e.plan.rate * (float64(now-at) / 1e9)
	}
	if b >= e.level(now) {
		return false
	}
	e.tokens, e.at = math.Max(b, 0), now
	return true
}

// localDecision is the local bucket's answer to one request.
type localDecision struct {
	allowed bool
	// quota describes the bucket after the request (its plan name left to
	// the caller); retryAfter (seconds, ceiling, at least 1, no earlier
	// than t) is set on a denial that a wait can help, 0 when the cost is
	// above the capacity.
	quota      quota
	retryAfter int64
}

// take decides a request of cost at now and updates the bucket. A denial
// leaves the bucket as it was (only its refill is brought up to now, and a
// bucket stamped after now, the clock having stepped back, is stamped now
// with the tokens it held). A
// cost above the capacity can never be admitted: it gets no Retry-After.
// Waits are capped at maxLocalWaitSeconds.
func (e *localEntry) take(cost, now int64) localDecision {
	tokens := e.level(now)
	var d localDecision
	c := float64(cost)
	if c <= tokens {
		tokens -= c
		d.allowed = true
	}
	e.tokens, e.at = tokens, now
	d.quota = quotaAt("", e.plan.limit, e.plan.rate, e.plan.rate, tokens)
	if tokens < 0 {
		// A debt, which quotaAt reads as an empty bucket: the first whole
		// token and the full bucket are further off by the debt.
		d.quota.next = seconds.Ceil((1 - tokens) / e.plan.rate * 1000)
		d.quota.reset = seconds.Ceil((float64(e.plan.limit) - tokens) / e.plan.rate * 1000)
	}
	d.quota.next = min(d.quota.next, maxLocalWaitSeconds)
	d.quota.reset = min(d.quota.reset, maxLocalWaitSeconds)
	if !d.allowed {
		d.retryAfter = min(retryAfterFor(cost, e.plan.limit, tokens, e.plan.rate, d.quota.next), maxLocalWaitSeconds)
	}
	return d
}

// localLimiter is one plugin's view of the shared local buckets; nil when
// on_failure is "open".
type localLimiter struct {
	prefix string // shared-data key prefix, one per sidecar cluster
	// known holds the plans this VM has recorded in shared data (or found
	// there), so that an answer repeating one costs no host call.
	known map[string]*localKnown
	// m counts the entries this VM's writes evict; nil counts nothing.
	m *metrics
}

// localKnown is what a VM remembers of a client's entry.
type localKnown struct {
	plan localPlan
	// settleUntil is when the client's bucket, as this VM last wrote or read
	// it, is full again (host clock, ns; 0: full then). Until then the
	// sidecar's answers are settled against the bucket (localEntry.settle).
	// Another VM's takes can keep the bucket below full for longer than
	// this VM knows; the answers this VM gets then are not settled, and
	// the sidecar's admissions they carry go uncharged.
	settleUntil int64
	// tokens is the sidecar's bucket after its latest answer this VM got,
	// decided after tokensAt (the callout's dispatch, host clock, ns; 0:
	// none). A bucket's first use starts from them rather than full.
	tokens   float64
	tokensAt int64
}

func newLocalLimiter(cfg *Config) *localLimiter {
	if cfg.OnFailure != FailLocal {
		return nil
	}
	return &localLimiter{
		prefix: "edgelimit/local/v" + strconv.Itoa(localFormat) + "/" + cfg.SidecarCluster + "/",
		known:  map[string]*localKnown{},
	}
}

// learn records the plan an enforced client's 200 or 429 describes, and
// settles the answer against the client's bucket while it is in use. It
// is on the healthy path: a plan the VM already recorded, for a bucket full
// when the VM last saw it, costs one map lookup and no host call.
func (c *localLimiter) learn(h abi.Host, s *stream, a *Answer, now int64) {
	if c == nil || !s.enforce || (a.Outcome != Allowed && a.Outcome != Denied) || !a.HasRate {
		return
	}
	p := localPlan{name: a.Plan, limit: a.Limit, rate: a.Rate}
	if len(p.name) > maxPlanLen {
		p.name = "" // the policy header would say "default" anyway
	}
	if !p.valid() {
		return
	}
	k := c.known[s.key]
	if k != nil && a.HasTokens && s.sentAt >= k.tokensAt {
		k.tokens, k.tokensAt = a.Tokens, s.sentAt
	}
	var admitted int64
	if a.Outcome == Allowed {
		admitted = s.cost
	}
	settle := k != nil && now < k.settleUntil && (admitted > 0 || a.HasTokens)
	if k != nil && k.plan == p && !settle {
		return
	}
	c.record(h, s.key, k, p, settle, admitted, a, s.sentAt, now)
}

// record is learn's way to shared data: it writes a plan the VM has not
// recorded (k nil) or a changed one, and with settle, settles a's
// admission and tokens against the bucket.
func (c *localLimiter) record(h abi.Host, key string, k *localKnown, p localPlan, settle bool, admitted int64, a *Answer, sentAt, now int64) {
	if k == nil || k.plan != p {
		// Kept beyond the request: copies, not views of request memory.
		key = strings.Clone(key)
		p.name = strings.Clone(p.name)
	}
	var full int64
	ok := c.update(h, key, now, func(e *localEntry, found bool) bool {
		changed := false
		if !found || e.plan != p {
			e.plan = p
			// A smaller plan caps the bucket at once; a larger one leaves
			// the tokens to refill.
			e.tokens = math.Min(e.tokens, float64(p.limit))
			changed = true
		}
		if settle && e.settle(admitted, a.Tokens, a.HasTokens, now) {
			changed = true
		}
		full = e.fullAt(now)
		return changed
	})
	switch {
	case !ok:
	case k != nil && k.plan == p:
		k.settleUntil = full
	default:
		n := &localKnown{plan: p, settleUntil: full}
		if a.HasTokens {
			n.tokens, n.tokensAt = a.Tokens, sentAt
		}
		c.remember(key, n)
	}
}

// remember adds a client to the VM's map (key a copy, never a view),
// evicting an arbitrary one when the map is full.
func (c *localLimiter) remember(key string, k *localKnown) {
	if _, ok := c.known[key]; !ok && len(c.known) >= localKnownMax {
		for k := range c.known {
			delete(c.known, k)
			break
		}
	}
	c.known[key] = k
}

// take runs a request of cost through the client's local bucket. ok is
// false when the filter knows no plan for the client, or could not update
// the shared bucket: the request then fails open as with "open".
func (c *localLimiter) take(h abi.Host, key string, cost, now int64) (d localDecision, plan localPlan, ok bool) {
	decided := false
	var full int64
	k := c.known[key]
	settled := c.update(h, key, now, func(e *localEntry, found bool) bool {
		decided = false
		if !found {
			// The shard lost the entry (evicted, or written by a VM that
			// never saw the client) but this VM knows the plan.
			if k == nil {
				return false
			}
			e.plan = k.plan
		}
		// No fuller than this VM's latest answer from the sidecar says the
		// shared bucket can be: a bucket's first use starts there.
		lowered := k != nil && k.tokensAt != 0 && e.bound(k.tokens, k.tokensAt, now)
		// Stamped ahead of the clock: the host's wall clock stepped back.
		ahead := now < e.at
		d, plan, decided = e.take(cost, now), e.plan, true
		full = e.fullAt(now)
		// A denial changes nothing a later refill would not recompute, but
		// for a bucket stamped ahead of the clock, which take stamped now:
		// left as it was, it would refill nothing until the clock is back
		// at its stamp (the step, an hour for a step of an hour), and
		// every Retry-After told meanwhile would be short.
		return d.allowed || !found || lowered || ahead
	})
	if !settled || !decided {
		return d, plan, false
	}
	// From now until the bucket is full again, this VM settles the
	// sidecar's answers against it.
	if k != nil && k.plan == plan {
		k.settleUntil = max(k.settleUntil, full)
	} else {
		// plan is the shard's, decoded into strings of its own, or k's.
		c.remember(strings.Clone(key), &localKnown{plan: plan, settleUntil: full})
	}
	return d, plan, true
}

func (c *localLimiter) shardKey(key string) string {
	return c.prefix + strconv.Itoa(int(fnv1a(key)%localShards))
}

// update reads key's shard, lets fn change the client's entry (a fresh,
// full one when found is false) and, when fn reports a change, writes the
// shard back with compare-and-swap, retrying on a concurrent write. It
// reports false when the shard could not be read or the write kept losing.
func (c *localLimiter) update(h abi.Host, key string, now int64, fn func(e *localEntry, found bool) bool) bool {
	sk := c.shardKey(key)
	for attempt := 0; attempt < localCASAttempts; attempt++ {
		v, cas, s := h.GetSharedData(sk)
		if s != abi.StatusOK && s != abi.StatusNotFound {
			return false
		}
		entries, _ := decodeLocalShard(v) // an unreadable shard is overwritten
		i := 0
		for i < len(entries) && entries[i].key != key {
			i++
		}
		found := i < len(entries)
		e := localEntry{key: key}
		if found {
			e = entries[i]
		}
		if !fn(&e, found) {
			return true
		}
		e.touched = now
		evicted := false
		if found {
			entries[i] = e
		} else {
			if evicted = len(entries) >= localShardEntries; evicted {
				evict := 0
				for j := range entries {
					if entries[j].touched < entries[evict].touched {
						evict = j
					}
				}
				entries = append(entries[:evict], entries[evict+1:]...)
			}
			entries = append(entries, e)
		}
		switch h.SetSharedData(sk, encodeLocalShard(entries), cas) {
		case abi.StatusCASMismatch:
			continue
		case abi.StatusOK:
			if evicted && c.m != nil {
				c.m.inc(h, cLocalEvicted)
			}
		}
		return true
	}
	return false
}

// fnv1a spreads keys over shards; a collision only shares a shard.
func fnv1a(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}

// Shard format: version byte, entry count byte, then per entry a u16 key
// length and the key, a u8 plan-name length and the name, limit (i64), rate
// (f64 bits), tokens (f64 bits), at (i64) and touched (i64), little-endian.

const localEntryFixed = 40

func encodeLocalShard(entries []localEntry) []byte {
	b := make([]byte, 2, 2+len(entries)*(3+localEntryFixed+32))
	b[0], b[1] = localFormat, byte(len(entries))
	for _, e := range entries {
		b = append(b, byte(len(e.key)), byte(len(e.key)>>8))
		b = append(b, e.key...)
		b = append(b, byte(len(e.plan.name)))
		b = append(b, e.plan.name...)
		b = appendU64(b, uint64(e.plan.limit))
		b = appendU64(b, math.Float64bits(e.plan.rate))
		b = appendU64(b, math.Float64bits(e.tokens))
		b = appendU64(b, uint64(e.at))
		b = appendU64(b, uint64(e.touched))
	}
	return b
}

// decodeLocalShard reads every entry; false (and no entries) for a value it
// does not understand, which must never turn into denials.
func decodeLocalShard(b []byte) ([]localEntry, bool) {
	if len(b) < 2 || b[0] != localFormat || int(b[1]) > localShardEntries {
		return nil, false
	}
	n := int(b[1])
	entries := make([]localEntry, 0, min(n+1, localShardEntries))
	at := 2
	for i := 0; i < n; i++ {
		if len(b)-at < 2 {
			return nil, false
		}
		kl := int(b[at]) | int(b[at+1])<<8
		at += 2
		if len(b)-at < kl+1 {
			return nil, false
		}
		key := string(b[at : at+kl])
		at += kl
		pl := int(b[at])
		at++
		if len(b)-at < pl+localEntryFixed {
			return nil, false
		}
		name := string(b[at : at+pl])
		at += pl
		f := b[at : at+localEntryFixed]
		at += localEntryFixed
		e := localEntry{
			key:     key,
			plan:    localPlan{name: name, limit: int64(u64(f[0:])), rate: math.Float64frombits(u64(f[8:]))},
			tokens:  math.Float64frombits(u64(f[16:])),
			at:      int64(u64(f[24:])),
			touched: int64(u64(f[32:])),
		}
		if !e.plan.valid() || !(e.tokens >= -float64(e.plan.limit)) || e.tokens > float64(e.plan.limit) || e.at < 0 {
			return nil, false
		}
		entries = append(entries, e)
	}
	if at != len(b) {
		return nil, false
	}
	return entries, true
}

// localLimit is the fail-open hook: with on_failure "local", an enforced
// request the sidecar could not decide goes through the client's local
// bucket. It reports whether the request was answered (a 429); false lets
// it fail open as before.
func (l *Limiter) localLimit(s *stream, now int64) bool {
	c := s.root.local
	if c == nil || !s.enforce {
		return false
	}
	d, plan, ok := c.take(l.host, s.key, s.cost, now)
	if !ok {
		return false
	}
	if d.allowed {
		l.m.inc(l.host, cLocalAllowed)
		return false
	}
	l.m.inc(l.host, cLocalDenied)
	d.quota.plan = plan.name
	l.deny(s, &d.quota, d.retryAfter, "edgelimit_rate_limited_local")
	return true
}
