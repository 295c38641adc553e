package limiter

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// TestLocalBucket walks one client's local bucket through a sequence of
// requests with exact numbers: capacity 10, 2 tokens/s, full at the first
// request. Every rate and offset is exact in binary floating point.
func TestLocalBucket(t *testing.T) {
	e := localEntry{key: "k", plan: localPlan{name: "p", limit: 10, rate: 2}}
	for i, c := range []struct {
		at   int64 // after anchor, ns
		cost int64
		want localDecision
		// tokens in the bucket after the request
		tokens float64
	}{
		// Full: 10 tokens. t is the next whole token: 0.5 s, so 1 s.
		{0, 4, ld(true, 6, 1, 2, 0), 6},
		{0, 6, ld(true, 0, 1, 5, 0), 0},
		// Empty: 1 token needs 0.5 s, rounded up to 1 s.
		{0, 1, ld(false, 0, 1, 5, 1), 0},
		// 0.25 s later: 0.5 tokens; 3 tokens need 1.25 s more, so 2 s.
		{second / 4, 3, ld(false, 0, 1, 5, 2), 0.5},
		// A denial took nothing: 1.25 s after the start, 2.5 tokens.
		{5 * second / 4, 2, ld(true, 0, 1, 5, 0), 0.5},
		// Exactly enough is enough: 0.5 + 2 × 1.25 = 3 at 2.5 s.
		{5 * second / 2, 3, ld(true, 0, 1, 5, 0), 0},
		// Refill stops at the capacity: 100 s later, 10 tokens.
		{10250 * second / 100, 1, ld(true, 9, 1, 1, 0), 9},
		// A cost above the capacity never passes: no Retry-After.
		{10250 * second / 100, 11, ld(false, 9, 1, 1, 0), 9},
		// A clock that went back adds nothing and takes nothing away.
		{50 * second, 9, ld(true, 0, 1, 5, 0), 0},
	} {
		got := e.take(c.cost, anchor+c.at)
		if got != c.want || e.tokens != c.tokens {
			t.Fatalf("step %d (cost %d at +%d ns): got %+v with %v tokens, want %+v with %v", i, c.cost, c.at, got, e.tokens, c.want, c.tokens)
		}
	}
}

// ld is a decision of TestLocalBucket's plan (10 tokens, 2/s).
func ld(allowed bool, remaining, next, reset, retry int64) localDecision {
	return localDecision{allowed: allowed, retryAfter: retry,
		quota: quota{limit: 10, rate: 2, remaining: remaining, next: next, reset: reset}}
}

func TestLocalBucketSlowPlan(t *testing.T) {
	// 0.001 tokens/s, as the e2e plans use: one token per 1000 s.
	e := localEntry{plan: localPlan{limit: 2, rate: 0.001}}
	for i, want := range []localDecision{
		{allowed: true, quota: quota{limit: 2, rate: 0.001, remaining: 1, next: 1000, reset: 1000}},
		{allowed: true, quota: quota{limit: 2, rate: 0.001, remaining: 0, next: 1000, reset: 2000}},
		{quota: quota{limit: 2, rate: 0.001, remaining: 0, next: 1000, reset: 2000}, retryAfter: 1000},
	} {
		if got := e.take(1, anchor); got != want {
			t.Fatalf("request %d: %+v, want %+v", i, got, want)
		}
	}
	// A refill longer than a year is capped.
	e = localEntry{plan: localPlan{limit: 1, rate: 1e-12}, tokens: 0, at: anchor}
	if got := e.take(1, anchor); got.retryAfter != maxLocalWaitSeconds || got.quota.reset != maxLocalWaitSeconds || got.quota.next != maxLocalWaitSeconds {
		t.Fatalf("%+v, want waits capped at %d s", got, maxLocalWaitSeconds)
	}
}

func TestParseAnswerRate(t *testing.T) {
	base := [][2]string{{":status", "200"}, {"ratelimit-limit", "10"}, {"ratelimit-remaining", "9"}, {"ratelimit-reset", "1"}}
	for _, c := range []struct {
		value string
		rate  float64
		ok    bool
	}{
		{"1", 1, true}, {"0.001", 0.001, true}, {"0.3333333333333333", 0.3333333333333333, true},
		{"1e+09", 1e9, true}, {"2.5e-05", 2.5e-5, true},
		{"", 0, false}, {"0", 0, false}, {"-1", 0, false}, {"NaN", 0, false}, {"Inf", 0, false},
		{"+Inf", 0, false}, {"1e400", 0, false}, {"0x1p-2", 0, false},
	} {
		a := ParseAnswer(append(slices.Clone(base), [2]string{"x-ratelimit-rate", c.value}))
		if a.Outcome != Allowed || a.HasRate != c.ok || (c.ok && a.Rate != c.rate) {
			t.Errorf("x-ratelimit-rate %q: outcome %d rate %v has %v, want %v %v", c.value, a.Outcome, a.Rate, a.HasRate, c.rate, c.ok)
		}
	}
}

func localConfig() *Config {
	cfg := DefaultConfig()
	cfg.OnFailure = FailLocal
	return cfg
}

func answerFor(outcome Outcome, plan string, limit int64, rate float64) *Answer {
	return &Answer{Outcome: outcome, Plan: plan, Limit: limit, Rate: rate, HasRate: true}
}

func TestLocalLearn(t *testing.T) {
	if newLocalLimiter(DefaultConfig()) != nil {
		t.Fatal("a local limiter with on_failure open")
	}
	c := newLocalLimiter(localConfig())
	h := newSharedHost()
	s := &stream{key: "alice", enforce: true}
	c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
	if h.writes != 1 {
		t.Fatalf("%d writes for a new plan, want 1", h.writes)
	}
	// The healthy path: the same plan again costs no host call.
	for range 100 {
		c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
		c.learn(h, s, answerFor(Denied, "gold", 10, 2), anchor)
	}
	if h.writes != 1 {
		t.Fatalf("%d writes after repeating the plan, want 1", h.writes)
	}
	// Nothing to learn from: another outcome, no rate, a bad plan, a client
	// not enforced.
	c.learn(h, s, &Answer{Outcome: FailedOpen, Limit: 5, Rate: 1, HasRate: true}, anchor)
	c.learn(h, s, &Answer{Outcome: Allowed, Limit: 5}, anchor)
	c.learn(h, s, answerFor(Allowed, "gold", 0, 2), anchor)
	c.learn(h, &stream{key: "bob"}, answerFor(Allowed, "gold", 10, 2), anchor)
	if h.writes != 1 {
		t.Fatalf("%d writes, want 1: nothing was worth learning", h.writes)
	}
	if _, _, ok := c.take(h, "bob", 1, anchor); ok {
		t.Error("bob was learned while not enforced")
	}

	// Spend 8 of 10, then the plan shrinks to 5: the bucket is capped at
	// once and keeps its tokens.
	if d, _, ok := c.take(h, "alice", 8, anchor); !ok || !d.allowed || d.quota.remaining != 2 {
		t.Fatalf("take 8: %+v %v", d, ok)
	}
	c.learn(h, s, answerFor(Allowed, "small", 5, 1), anchor)
	d, plan, ok := c.take(h, "alice", 3, anchor)
	if !ok || d.allowed || d.retryAfter != 1 || plan != (localPlan{"small", 5, 1}) {
		t.Fatalf("after the plan changed: %+v %+v %v, want a denial under the new plan", d, plan, ok)
	}

	// Another VM finds the plan and the bucket in shared data.
	o := newLocalLimiter(localConfig())
	if d, _, ok := o.take(h, "alice", 2, anchor); !ok || !d.allowed || d.quota.remaining != 0 {
		t.Fatalf("second VM: %+v %v, want the 2 tokens left", d, ok)
	}
	// A VM that learns a plan shared data already holds writes nothing.
	w := h.writes
	o.learn(h, s, answerFor(Allowed, "small", 5, 1), anchor)
	o.learn(h, s, answerFor(Allowed, "small", 5, 1), anchor)
	if h.writes != w {
		t.Errorf("%d writes to learn a plan already shared", h.writes-w)
	}
	// Another sidecar cluster has its own buckets.
	cfg := localConfig()
	cfg.SidecarCluster = "other"
	if _, _, ok := newLocalLimiter(cfg).take(h, "alice", 1, anchor); ok {
		t.Error("another sidecar cluster sees the plan")
	}
}

// withTokens is answer with the sidecar's exact tokens after its decision.
func withTokens(a *Answer, tokens float64) *Answer {
	a.Tokens, a.HasTokens = tokens, true
	return a
}

// TestLocalSettle: while a client's bucket is in use, the sidecar's
// answers are settled against it: what the sidecar admitted is charged,
// down to a debt of one capacity, and the bucket is lowered to the
// answer's tokens, never raised. A full bucket, the healthy path, costs no
// host call.
func TestLocalSettle(t *testing.T) {
	c := newLocalLimiter(localConfig())
	h := newSharedHost()
	s := &stream{key: "alice", enforce: true, cost: 1}
	const second = int64(1e9)
	// gold: 10 tokens, 2 a second. Learned, never used: answers change
	// nothing and read nothing.
	c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
	// A second VM finds the plan while the bucket is full.
	o := newLocalLimiter(localConfig())
	o.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
	reads, writes := h.reads, h.writes
	for range 10 {
		c.learn(h, s, withTokens(answerFor(Allowed, "gold", 10, 2), 0), anchor)
	}
	if h.reads != reads || h.writes != writes {
		t.Fatalf("%d reads and %d writes for answers about a full bucket, want none", h.reads-reads, h.writes-writes)
	}
	take := func(l *localLimiter, cost, at int64) localDecision {
		t.Helper()
		d, _, ok := l.take(h, "alice", cost, at)
		if !ok {
			t.Fatalf("take %d: not decided", cost)
		}
		return d
	}
	if d := take(c, 4, anchor); !d.allowed || d.quota.remaining != 6 {
		t.Fatalf("take 4: %+v", d)
	}
	// Three admissions the sidecar reports without its tokens: charged.
	for range 3 {
		c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
	}
	if d := take(c, 4, anchor); d.allowed || d.quota.remaining != 3 {
		t.Fatalf("take 4 after the sidecar admitted 3: %+v, want a denial with 3 left", d)
	}
	// Half a second on the bucket holds 4; the sidecar's holds 1 after
	// admitting one more.
	c.learn(h, s, withTokens(answerFor(Allowed, "gold", 10, 2), 1), anchor+second/2)
	if d := take(c, 2, anchor+second/2); d.allowed || d.quota.remaining != 1 {
		t.Fatalf("take 2 after the sidecar answered 1 token left: %+v, want a denial with 1 left", d)
	}
	// A denial with more tokens than the bucket holds changes nothing; a
	// 429 with fewer lowers it, charging nothing.
	writes = h.writes
	c.learn(h, s, withTokens(answerFor(Denied, "gold", 10, 2), 9), anchor+second/2)
	if h.writes != writes {
		t.Fatal("a 429 with more tokens than the bucket changed it")
	}
	c.learn(h, s, withTokens(answerFor(Denied, "gold", 10, 2), 0.25), anchor+second/2)
	if d := take(c, 1, anchor+second/2); d.allowed || d.quota.remaining != 0 {
		t.Fatalf("take 1 after a 429 at 0.25 tokens: %+v, want a denial", d)
	}
	// Admissions past the bucket leave a debt, at most one capacity: 0.25
	// less 20 is -10. The next whole token is then 5.5 s away, the full
	// bucket 10 s.
	for range 20 {
		c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor+second/2)
	}
	d := take(c, 1, anchor+second/2)
	if d.allowed || d.quota.remaining != 0 || d.quota.next != 6 || d.quota.reset != 10 || d.retryAfter != 6 {
		t.Fatalf("take 1 in debt: %+v, want a denial, t=6, reset 10, Retry-After 6", d)
	}
	at := anchor + second/2 + 5*second
	if d := take(c, 1, at); d.allowed {
		t.Fatalf("take 1 after 5 s of a debt of 10: %+v, want a denial", d)
	}
	if d := take(c, 1, at+second/2); !d.allowed {
		t.Fatalf("take 1 after 5.5 s: %+v", d)
	}
	// Full 10 s after the take (1 token spent from 1 at at+0.5s: 0 left).
	full := at + second/2 + 5*second
	reads, writes = h.reads, h.writes
	c.learn(h, s, withTokens(answerFor(Allowed, "gold", 10, 2), 0), full)
	if h.reads != reads || h.writes != writes {
		t.Fatalf("%d reads and %d writes once the bucket was full again", h.reads-reads, h.writes-writes)
	}
	if d := take(c, 10, full); !d.allowed {
		t.Fatalf("take 10 from the full bucket: %+v", d)
	}

	// The second VM has not seen the bucket since it was full: it does
	// not know it is in use and settles nothing. Once it takes from it,
	// it settles too.
	writes = h.writes
	o.learn(h, s, withTokens(answerFor(Allowed, "gold", 10, 2), 0), full+second)
	if h.writes != writes {
		t.Fatal("a VM that never took from the bucket settled an answer")
	}
	if d := take(o, 1, full+second); !d.allowed || d.quota.remaining != 1 {
		t.Fatalf("second VM's take: %+v, want 1 left of the 2 refilled", d)
	}
	o.learn(h, s, answerFor(Allowed, "gold", 10, 2), full+second)
	if d := take(c, 1, full+second); d.allowed {
		t.Fatalf("first VM's take after the second was charged the last token: %+v", d)
	}
}

// TestLocalSettleBound drives one VM's bucket through outages that come
// and go: each request either fails (the bucket decides) or is decided by
// a shared bucket standing for Redis, which admits at most C + r·Δt in any
// window Δt. Over the whole run the process admits the client, whoever
// decides, at most C + r·t plus one capacity, the debt forgiven below
// minus C: the bucket starts from the latest answer's tokens, and is
// charged for what the sidecar admits. Starting full instead, the count
// goes past the bound (in seed 7); without settling, sooner (seed 1,
// after 1.2 s). The shared bucket is a plain one: the bound holds for any
// that admits no more than the plan, the script's exact rounding aside.
func TestLocalSettleBound(t *testing.T) {
	const (
		capacity = 3
		rate     = 10.0 // tokens per second
		second   = int64(1e9)
	)
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x10ca1))
		c := newLocalLimiter(localConfig())
		h := newSharedHost()
		s := &stream{key: "alice", enforce: true, cost: 1}
		shared, sharedAt := float64(capacity), anchor // the sidecar's bucket
		decide := func(now int64) *Answer {
			shared = math.Min(capacity, shared+rate*float64(now-sharedAt)/1e9)
			sharedAt = now
			a := answerFor(Denied, "gold", capacity, rate)
			if shared >= 1 {
				shared--
				a.Outcome = Allowed
			}
			return withTokens(a, shared)
		}
		now := anchor
		s.sentAt = now
		a := decide(now)
		c.learn(h, s, a, now)
		var firstUse, admitted int64
		if a.Outcome == Allowed {
			admitted++
		}
		// Failures come in spells: a request fails with probability 0.6
		// in a spell and 0.02 between them, and a spell starts or ends
		// after each request with probability 0.05.
		spell := false
		for now < anchor+20*second {
			now += rng.Int64N(second / 50) // up to 20 ms apart: ~100/s
			if rng.Float64() < 0.05 {
				spell = !spell
			}
			fail := rng.Float64() < 0.02
			if spell {
				fail = rng.Float64() < 0.6
			}
			ok := false
			if fail {
				d, _, decided := c.take(h, s.key, s.cost, now)
				if !decided {
					t.Fatalf("seed %d: the bucket did not decide", seed)
				}
				if firstUse == 0 {
					firstUse = now
				}
				ok = d.allowed
			} else {
				// Decided as the callout is sent, answered at once.
				s.sentAt = now
				a := decide(now)
				c.learn(h, s, a, now)
				ok = a.Outcome == Allowed
			}
			if ok {
				admitted++
			}
			bound := 2*capacity + rate*float64(now-anchor)/1e9
			if float64(admitted) > bound+1e-9 {
				t.Fatalf("seed %d: %d admitted in the first %v s (the bucket first used at %v s), over C + r·t + C = %.1f",
					seed, admitted, float64(now-anchor)/1e9, float64(firstUse-anchor)/1e9, bound)
			}
		}
	}
}

// TestLocalStartsFromTheLastAnswer: a bucket's first use starts from the
// tokens of the latest answer the VM got, refilled since the callout was
// sent; without one, or from one long enough ago, full.
func TestLocalStartsFromTheLastAnswer(t *testing.T) {
	const second = int64(1e9)
	for _, c := range []struct {
		name   string
		answer *Answer
		sent   int64
		want   int64 // remaining after a take of 1 at anchor + 0.5 s
	}{
		{"1 token left, refilled by 1", withTokens(answerFor(Allowed, "gold", 10, 2), 1), anchor, 1},
		{"a 429 at 0.5 tokens", withTokens(answerFor(Denied, "gold", 10, 2), 0.5), anchor, 0},
		{"no tokens in the answer", answerFor(Allowed, "gold", 10, 2), anchor, 9},
		{"an hour ago", withTokens(answerFor(Allowed, "gold", 10, 2), 0), anchor - 3600*second, 9},
	} {
		l := newLocalLimiter(localConfig())
		h := newSharedHost()
		l.learn(h, &stream{key: "alice", enforce: true, cost: 1, sentAt: c.sent}, c.answer, c.sent)
		d, _, ok := l.take(h, "alice", 1, anchor+second/2)
		if !ok || !d.allowed || d.quota.remaining != c.want {
			t.Errorf("%s: %+v %v, want allowed with %d left", c.name, d, ok, c.want)
		}
	}
}

func TestLocalTakeNeverSeen(t *testing.T) {
	c := newLocalLimiter(localConfig())
	h := newSharedHost()
	if _, _, ok := c.take(h, "stranger", 1, anchor); ok || h.writes != 0 {
		t.Fatalf("a client never seen was decided (writes %d)", h.writes)
	}
}

func TestLocalCAS(t *testing.T) {
	c := newLocalLimiter(localConfig())
	h := newSharedHost()
	s := &stream{key: "alice", enforce: true}
	h.casFailures = localCASAttempts
	c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
	if _, ok := c.known["alice"]; ok {
		t.Fatal("a plan whose write kept losing was remembered; it would never be written")
	}
	h.casFailures = localCASAttempts - 1
	c.learn(h, s, answerFor(Allowed, "gold", 10, 2), anchor)
	if _, ok := c.known["alice"]; !ok {
		t.Fatal("plan not recorded after retried CAS mismatches")
	}
	// A take that keeps losing fails open rather than deciding.
	h.casFailures = localCASAttempts
	if _, _, ok := c.take(h, "alice", 1, anchor); ok {
		t.Error("decided without storing the bucket")
	}
	if d, _, ok := c.take(h, "alice", 10, anchor); !ok || !d.allowed {
		t.Errorf("%+v %v: the lost take must not have spent tokens", d, ok)
	}
}

func TestLocalShardBounds(t *testing.T) {
	c := newLocalLimiter(localConfig())
	h := newSharedHost()
	shard := c.shardKey("k0")
	var keys []string
	for i := 0; len(keys) < localShardEntries+3; i++ {
		if k := "k" + strconv.Itoa(i); c.shardKey(k) == shard {
			keys = append(keys, k)
		}
	}
	for i, k := range keys {
		c.learn(h, &stream{key: k, enforce: true}, answerFor(Allowed, "p", 10, 1), anchor+int64(i))
	}
	all, ok := decodeLocalShard(h.data[shard])
	if !ok || len(all) != localShardEntries {
		t.Fatalf("shard holds %d entries (%v), want %d", len(all), ok, localShardEntries)
	}
	// The entries written longest ago went; this VM still knows their
	// plans, so it puts them back when it needs them.
	for i, k := range keys {
		if want := i >= len(keys)-localShardEntries; slices.ContainsFunc(all, func(e localEntry) bool { return e.key == k }) != want {
			t.Errorf("key %d in the shard = %v, want %v", i, !want, want)
		}
	}
	if d, _, ok := c.take(h, keys[0], 1, anchor+100); !ok || !d.allowed {
		t.Errorf("evicted key with a known plan: %+v %v", d, ok)
	}
	// Only localShards keys per cluster ever exist.
	for i := 0; i < 5000; i++ {
		c.learn(h, &stream{key: "x" + strconv.Itoa(i), enforce: true}, answerFor(Allowed, "p", 10, 1), anchor)
	}
	if n := len(h.data); n != localShards {
		t.Errorf("%d shared-data keys, want %d", n, localShards)
	}
	if n := len(c.known); n != localKnownMax {
		t.Errorf("%d plans in the VM's map, want the bound %d", n, localKnownMax)
	}
	// A value that is not ours is overwritten, never decoded into denials.
	h.data[shard] = []byte("garbage")
	if _, _, ok := c.take(h, "stranger", 1, anchor); ok {
		t.Error("garbage decided a request")
	}
	c.learn(h, &stream{key: keys[1], enforce: true}, answerFor(Allowed, "q", 3, 1), anchor)
	if all, ok := decodeLocalShard(h.data[shard]); !ok || len(all) != 1 {
		t.Errorf("garbage shard not replaced: %d entries, %v", len(all), ok)
	}
}

func TestLocalShardCodec(t *testing.T) {
	entries := []localEntry{
		{key: "a", plan: localPlan{"gold", 100, 0.3333333333333333}, tokens: 12.5, at: anchor, touched: anchor + 1},
		{key: string(make([]byte, 256)), plan: localPlan{"", 1, 1e9}, touched: 7},
		{key: "in debt", plan: localPlan{"p", 5, 1}, tokens: -5, at: anchor, touched: anchor},
	}
	b := encodeLocalShard(entries)
	got, ok := decodeLocalShard(b)
	if !ok || !slices.Equal(got, entries) {
		t.Fatalf("decoded %+v %v, want %+v", got, ok, entries)
	}
	for i := 0; i < len(b); i++ {
		if _, ok := decodeLocalShard(b[:i]); ok {
			t.Errorf("truncated to %d bytes: decoded", i)
		}
	}
	bad := slices.Clone(b)
	bad[0] = 9
	if _, ok := decodeLocalShard(bad); ok {
		t.Error("unknown format decoded")
	}
	tooMany := encodeLocalShard(append(slices.Repeat(entries[:1], localShardEntries), entries[0]))
	if _, ok := decodeLocalShard(tooMany); ok {
		t.Error("more entries than a shard holds decoded")
	}
	over := encodeLocalShard([]localEntry{{key: "a", plan: localPlan{"p", 5, 1}, tokens: 6}})
	if _, ok := decodeLocalShard(over); ok {
		t.Error("more tokens than the capacity decoded")
	}
	debt := encodeLocalShard([]localEntry{{key: "a", plan: localPlan{"p", 5, 1}, tokens: -5.5}})
	if _, ok := decodeLocalShard(debt); ok {
		t.Error("a debt of more than the capacity decoded")
	}
}

func FuzzDecodeLocalShard(f *testing.F) {
	f.Add(encodeLocalShard([]localEntry{{key: "a", plan: localPlan{"gold", 100, 2}, tokens: 12.5, at: anchor, touched: anchor}}))
	f.Add(encodeLocalShard([]localEntry{{key: "in debt", plan: localPlan{"gold", 100, 2}, tokens: -100, at: anchor, touched: anchor}}))
	f.Add([]byte{localFormat, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, ok := decodeLocalShard(b)
		if !ok {
			return
		}
		for _, e := range entries {
			if !e.plan.valid() || !(e.tokens >= -float64(e.plan.limit)) || e.tokens > float64(e.plan.limit) {
				t.Fatalf("decoded an unusable entry %+v", e)
			}
		}
		if re := encodeLocalShard(entries); !slices.Equal(re, b) {
			t.Fatalf("re-encoded %v from %v", re, b)
		}
	})
}

// BenchmarkAllowedPathLocal: BenchmarkAllowedPath with on_failure "local":
// learning a plan already recorded (from the answer's x-ratelimit-rate) must
// add no host call and no allocation to the healthy path.
func BenchmarkAllowedPathLocal(b *testing.B) {
	l, h := benchLimiter(b, `{"on_failure": "local"}`)
	allowedLoop(b, l, h, allowedAnswer)
	if h.shared.writes != 1 {
		b.Fatalf("%d shared-data writes, want 1: the plan is recorded once", h.shared.writes)
	}
}
