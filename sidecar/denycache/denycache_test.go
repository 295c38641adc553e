package denycache

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/bucketbound"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/decide"
)

// gate wraps the real decider: it counts the calls that reach Redis and can
// hold them (checks on their way) or fail them without Redis.
type gate struct {
	next  Decider
	mu    sync.Mutex
	calls int
	hold  chan struct{} // when set, each call first waits for a value: nil lets it through, closed too
	fail  chan struct{} // when set, a call released by fail gets errFailed
}

var errFailed = errors.New("failed on purpose")

func (g *gate) Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error) {
	g.mu.Lock()
	g.calls++
	hold, fail := g.hold, g.fail
	g.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-fail:
			return lua.Result{}, errFailed
		}
	}
	return g.next.Decide(deadline, key, l, cost)
}

func (g *gate) Ready(ctx context.Context) error { return g.next.Ready(ctx) }

func (g *gate) Refused() error { return g.next.Refused() }

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

// stack is a real Redis, the real decider on its own connection, the gate
// and the cache over them.
func stack(t *testing.T) (*Cache, *gate, *redis.Client) {
	t.Helper()
	srv := redisproc.StartT(t, redisproc.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	d := decide.New(c, decide.Options{Direct: true})
	t.Cleanup(d.Close)
	g := &gate{next: d}
	return New(g), g, c
}

// far is the deadline these tests give a check: not the sidecar's 4 ms
// (-redis-timeout), which they are not about and which a check on this
// shared machine under the race detector can miss; what is under test is
// what the cache decides, and a missed deadline would only send it an
// error.
func far() time.Time { return time.Now().Add(time.Minute) }

func decide1(t *testing.T, c Decider, key string, l lua.Limit, cost int64) lua.Result {
	t.Helper()
	r, err := c.Decide(far(), key, l, cost)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// slow refills one token in 1000 s: nothing refills during a test.
var slow = lua.Limit{Capacity: 5, Rate: 0.001}

// TestDeniesWithoutRedis: after Redis denies, the next checks that the
// bucket cannot pay are denied without it, and answered as the script
// answers; a check of another limit, or above the capacity, goes to Redis.
func TestDeniesWithoutRedis(t *testing.T) {
	c, g, _ := stack(t)
	denied := 0
	c.OnDenied = func() { denied++ }
	const key = "rl:{a}"
	if r := decide1(t, c, key, slow, 5); !r.Allowed {
		t.Fatalf("first check denied: %+v", r)
	}
	asked := time.Now()
	redisDenial := decide1(t, c, key, slow, 2)
	if redisDenial.Allowed || g.count() != 2 {
		t.Fatalf("cost 2 on an empty bucket: %+v after %d calls to Redis", redisDenial, g.count())
	}
	for _, cost := range []int64{1, 2, 5} {
		r := decide1(t, c, key, slow, cost)
		if r.Allowed || r.Never || g.count() != 2 {
			t.Fatalf("cost %d: %+v, %d calls to Redis, want a denial without Redis", cost, r, g.count())
		}
		// The bucket held about 1 token at Redis's decision. The cached
		// answer's tokens are the bound: no fewer than Redis's, no more
		// than those and the refill since the check that made the entry
		// was sent; its waits are the script's from them.
		refill := slow.Rate * time.Since(asked).Seconds()
		if r.Tokens < redisDenial.Tokens || r.Tokens > redisDenial.Tokens+refill ||
			r.RetryMs != (float64(cost)-r.Tokens)/slow.Rate*1000 || r.ResetMs != (slow.Capacity-r.Tokens)/slow.Rate*1000 ||
			r.RetryAfter != time.Duration(math.Ceil(r.RetryMs*1e6)) || r.ResetAfter != time.Duration(math.Ceil(r.ResetMs*1e6)) {
			t.Errorf("cost %d: cached %+v against Redis's %+v, %.9f tokens refilled since", cost, r, redisDenial, refill)
		}
	}
	if denied != 3 {
		t.Errorf("OnDenied called %d times, want 3", denied)
	}
	// Above the capacity: Redis's own "never", and the entry counts
	// nothing for it.
	if r := decide1(t, c, key, slow, 6); !r.Never || g.count() != 3 {
		t.Errorf("cost above capacity: %+v, %d calls", r, g.count())
	}
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.entries[key]; e == nil || e.pending != 0 {
		t.Errorf("entry after a cost above capacity: %+v", e)
	}
	sh.mu.Unlock()
	// Another limit for the same key (the plan changed): Redis decides.
	other := lua.Limit{Capacity: 5, Rate: 0.002}
	if r := decide1(t, c, key, other, 2); r.Allowed || g.count() != 4 {
		t.Errorf("changed plan: %+v, %d calls", r, g.count())
	}
}

// TestAsksRedisWhenOthersMaySpend: two sidecars on one Redis, each with its
// own cache (a sidecar beside each proxy). Sidecar A's entry says the bucket
// held 3 tokens when Redis denied a cost of 5; the client then spends those 3
// through sidecar B. A's next check of 5 must be told the wait from an
// empty bucket, 5 tokens at 0.001/s: 5,000 s, not the 2,000 s A's entry
// alone would say; while the bound lets a whole token have been spent
// elsewhere, A cannot know it, and asks Redis.
func TestAsksRedisWhenOthersMaySpend(t *testing.T) {
	a, g, c := stack(t)
	db := decide.New(c, decide.Options{Direct: true})
	t.Cleanup(db.Close)
	b := New(db)
	const key = "rl:{spread}"
	if r := decide1(t, a, key, slow, 2); !r.Allowed {
		t.Fatalf("cost 2 on a full bucket: %+v", r)
	}
	if r := decide1(t, a, key, slow, 5); r.Allowed || g.count() != 2 {
		t.Fatalf("cost 5 on 3 tokens: %+v after %d calls to Redis", r, g.count())
	}
	for i := 0; i < 3; i++ {
		if r := decide1(t, b, key, slow, 1); !r.Allowed {
			t.Fatalf("cost 1 through B, %d: %+v", i, r)
		}
	}
	r := decide1(t, a, key, slow, 5)
	// The bucket holds the refill since B's last admission, well under a
	// token in this test's time: the wait for 5 is over 4,999 s.
	if r.Allowed || r.RetryMs < 4_999_000 || g.count() != 3 {
		t.Errorf("cost 5 through A after B spent the 3 tokens: %+v (wait %.0f s) after %d calls to Redis; want a denial from Redis with a wait over 4,999 s",
			r, r.RetryMs/1000, g.count())
	}
	// That denial is A's entry now: 0 tokens at its decision, so no whole
	// token can have been spent since, and A answers alone again.
	if r := decide1(t, a, key, slow, 5); r.Allowed || r.RetryMs < 4_999_000 || g.count() != 3 {
		t.Errorf("cost 5 through A again: %+v after %d calls to Redis; want a denial without Redis", r, g.count())
	}
}

// TestChecksOnTheirWay: checks passed on after the entry's answer count as
// spent; one that does not fit beside them is denied here; an answer
// replaces the entry and its count; a check that fails takes its cost off.
func TestChecksOnTheirWay(t *testing.T) {
	c, g, _ := stack(t)
	const key = "rl:{b}"
	start := time.Now()
	decide1(t, c, key, slow, 3)
	asked := time.Now()
	den := decide1(t, c, key, slow, 3)
	if den.Allowed {
		t.Fatalf("cost 3 on 2 tokens: %+v", den)
	}
	// The entry: 2 tokens. Two checks of cost 1 go out and wait.
	g.mu.Lock()
	g.hold, g.fail = make(chan struct{}), make(chan struct{})
	g.mu.Unlock()
	type out struct {
		r   lua.Result
		err error
	}
	results := make(chan out, 2)
	for range 2 {
		go func() {
			r, err := c.Decide(far(), key, slow, 1)
			results <- out{r, err}
		}()
	}
	waitCalls(t, g, 4)
	r := decide1(t, c, key, slow, 1)
	if r.Allowed || g.count() != 4 {
		t.Fatalf("a third check with two on their way: %+v, %d calls, want denied here", r, g.count())
	}
	// What it tells counts those on their way as spent: the entry's
	// tokens less 2, and the refill since the entry's check was sent at
	// most; the script's wait from there.
	if left := den.Tokens - 2; r.Tokens < left || r.Tokens > left+slow.Rate*time.Since(asked).Seconds() ||
		r.RetryMs != (1-r.Tokens)/slow.Rate*1000 {
		t.Errorf("denial beside checks on their way: %+v", r)
	}

	// One of them fails: its cost is no longer counted, and a cost-1 check
	// fits again (and goes to Redis, held like the other).
	g.fail <- struct{}{}
	if o := <-results; !errors.Is(o.err, errFailed) {
		t.Fatalf("failed call: %+v", o)
	}
	go func() {
		r, err := c.Decide(far(), key, slow, 1)
		results <- out{r, err}
	}()
	waitCalls(t, g, 5)
	if r := decide1(t, c, key, slow, 1); r.Allowed || g.count() != 5 {
		t.Fatalf("two on their way again: %+v, %d calls, want denied here", r, g.count())
	}

	// Both are admitted by Redis; each answer replaces the entry, with
	// nothing pending. Whichever answer is applied last (1 token or none
	// left), the next check is denied, here or by Redis, and the one after
	// it here.
	close(g.hold)
	for range 2 {
		if o := <-results; o.err != nil || !o.r.Allowed {
			t.Fatalf("released check: %+v", o)
		}
	}
	g.mu.Lock()
	g.hold, g.fail = nil, nil
	g.mu.Unlock()
	if r := decide1(t, c, key, slow, 1); r.Allowed {
		t.Errorf("empty bucket: %+v", r)
	}
	calls := g.count()
	if r := decide1(t, c, key, slow, 1); r.Allowed || g.count() != calls {
		t.Errorf("empty bucket: %+v, %d calls, want denied here", r, g.count()-calls)
	}
	sh := c.shard(key)
	sh.mu.Lock()
	e := *sh.entries[key]
	sh.mu.Unlock()
	// The entry's tokens are Redis's last answer's: the bucket emptied by
	// its three spends, plus at most slow's refill since the first (Redis's
	// clock is this machine's). Three answers added a refill to a balance
	// below 4 (the two released spends and a denial), each sum rounding up
	// by at most half an ulp, 2^-52, and never below the balance.
	if most := slow.Rate*time.Since(start).Seconds() + 3*0x1p-52; e.pending != 0 || e.tokens < 0 || e.tokens > most {
		t.Errorf("entry after the answers: %+v, want none pending and 0 to %g tokens", e, most)
	}
}

func waitCalls(t *testing.T, g *gate, n int) {
	t.Helper()
	testkit.Poll(t, 10*time.Second, strconv.Itoa(n)+" calls at the gate", func() bool { return g.count() >= n })
}

// TestWindowEnds: a fast plan's entry denies only until the bucket may hold
// the cost; then the check goes to Redis, which admits it.
func TestWindowEnds(t *testing.T) {
	c, g, _ := stack(t)
	l := lua.Limit{Capacity: 1, Rate: 100}
	const key = "rl:{c}"
	decide1(t, c, key, l, 1)
	if r := decide1(t, c, key, l, 1); r.Allowed {
		t.Fatalf("empty bucket admitted: %+v", r)
	}
	calls := g.count()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := decide1(t, c, key, l, 1)
		if g.count() > calls && r.Allowed {
			break
		}
		calls = g.count()
		if time.Now().After(deadline) {
			t.Fatal("the bucket refilled 1 token/10 ms and was still denied after 10 s")
		}
	}
}

// TestCachedDenialsAgainstRedis: random timelines through the cache against
// the real script. Each seeds its bucket a few ms short of admitting a
// cost, and another spender takes tokens behind the cache's back now and
// then. Every denial the cache makes is checked against the bucket at the
// cache's clock reading: the stored state refilled with the script's
// formula and integer µs (the cache runs on the wall clock here, which is
// Redis's: one host, no tolerance). Each step waits until just short of
// the entry's boundary for its cost, when that is near.
func TestCachedDenialsAgainstRedis(t *testing.T) {
	c, g, rc := stack(t)
	var reading int64
	c.clock = func() int64 { reading = time.Now().UnixNano(); return reading }
	direct := g.next
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	rates := []float64{1, 100, 1000, 20000}
	start := time.Now()
	var cached, near, timelines int
	for timelines = 0; time.Since(start) < 3*time.Second || cached < 100; timelines++ {
		if time.Since(start) > time.Minute {
			break
		}
		key := "rl:{t" + strconv.Itoa(timelines) + "}"
		l := lua.Limit{Capacity: float64(1 + rng.IntN(20)), Rate: rates[rng.IntN(len(rates))]}
		level := func(at int64) float64 {
			v, err := rc.HMGet(ctx, key, "tokens", "ts").Result()
			if err != nil {
				t.Fatal(err)
			}
			stored, _ := strconv.ParseFloat(v[0].(string), 64)
			ts, _ := strconv.ParseInt(v[1].(string), 10, 64)
			elapsed := max(at/1000-ts, 0)
			return math.Min(l.Capacity, stored+float64(elapsed)*l.Rate/1e6)
		}
		// Cost k is admitted δ (< 5 ms) from now.
		k := 1 + rng.Int64N(int64(l.Capacity))
		now, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		tokens := math.Max(0, float64(k)-l.Rate*5e-3*rng.Float64())
		if err := rc.HSet(ctx, key, "tokens", strconv.FormatFloat(tokens, 'g', 17, 64),
			"ts", strconv.FormatInt(now.UnixMicro(), 10)).Err(); err != nil {
			t.Fatal(err)
		}
		for step := 0; step < 40; step++ {
			// The cost: half the time the one closest to admission (the
			// next whole token above the entry's), else any.
			cost := 1 + rng.Int64N(int64(l.Capacity))
			sh := c.shard(key)
			sh.mu.Lock()
			e, has := sh.entries[key]
			if has && rng.IntN(2) == 0 {
				cost = min(int64(l.Capacity), int64(math.Floor(e.tokens))+1+rng.Int64N(2))
			}
			sh.mu.Unlock()
			if step == 0 {
				cost = k
			}
			if rng.IntN(8) == 0 {
				// Another gateway's sidecar spends.
				if _, err := direct.Decide(far(), key, l, 1); err != nil {
					t.Fatal(err)
				}
			}
			// Close to the entry's boundary for this cost, when it is near,
			// so that denials near it occur at every rate.
			sh.mu.Lock()
			e, has = sh.entries[key]
			var boundary int64
			if has {
				w := bucketbound.Wait(float64(cost), e.tokens, l.Rate)
				boundary = e.sent + w - bucketbound.Margin(w)
			}
			sh.mu.Unlock()
			if until := boundary - time.Now().UnixNano(); has && until < 20e6 {
				// A sleep overshoots by up to about a millisecond here:
				// aim 0.2–0.8 ms short of the boundary.
				if d := until - 200_000 - rng.Int64N(600_000); d > 0 {
					time.Sleep(time.Duration(d))
				}
			} else {
				time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
			}
			before := g.count()
			r, err := c.Decide(far(), key, l, cost)
			if err != nil {
				t.Fatal(err)
			}
			if g.count() == before {
				cached++
				if lv := level(reading); lv >= float64(cost) {
					t.Fatalf("timeline %d (%+v): cost %d denied without Redis while the bucket held %v", timelines, l, cost, lv)
				}
				if r.Allowed || r.Tokens >= float64(cost) {
					t.Fatalf("timeline %d: cached answer %+v for cost %d", timelines, r, cost)
				}
				if (float64(cost)-level(reading))/l.Rate < 1e-3 {
					near++
				}
			}
		}
	}
	t.Logf("%d timelines, %d denials without Redis, %d of them within 1 ms of the bucket admitting", timelines, cached, near)
	if cached < 100 || near < 10 {
		t.Errorf("too few denials to mean anything: %d, %d near the boundary", cached, near)
	}
}

// TestFullShardReported: a shard holds shardEntries denials; the next one
// denied on a bucket of the same shard, with none of the shard's entries
// past its window (a rate of one token in 1,000 s), is kept in place of
// the entry checked longest ago, and reported to OnFull, once.
func TestFullShardReported(t *testing.T) {
	c, _, _ := stack(t)
	var full int
	c.OnFull = func() { full++ } // Decide runs on this goroutine only
	l := lua.Limit{Capacity: 1, Rate: 0.001}
	n := 0
	for i := 0; n <= shardEntries; i++ {
		key := "rl:{full-" + strconv.Itoa(i) + "}"
		if c.shard(key) != &c.shards[0] {
			continue
		}
		n++
		decide1(t, c, key, l, 1) // admitted: the bucket's one token
		if r := decide1(t, c, key, l, 1); r.Allowed {
			t.Fatalf("%s: the second check admitted", key)
		}
		if want := max(0, n-shardEntries); full != want {
			t.Fatalf("after %d denials on shard 0 (of %d entries): reported full %d times, want %d", n, shardEntries, full, want)
		}
	}
	if got := len(c.shards[0].entries); got != shardEntries {
		t.Errorf("shard 0 holds %d entries, want %d", got, shardEntries)
	}
}

// TestFullShardKeepsTheBusyBucket: a shard full of buckets denied once and
// never checked again (a scanner's keys on a plan of 1 an hour) makes room
// for a busy client's denial by evicting the one checked longest ago, and
// keeps the busy client's entry while more scanner keys come: its checks
// are denied without Redis. The shard used to refuse the busy client's
// entry, and every one of its checks went to Redis.
func TestFullShardKeepsTheBusyBucket(t *testing.T) {
	c, g, _ := stack(t)
	hourly := lua.Limit{Capacity: 1, Rate: 1.0 / 3600}
	var scan []string
	for i := 0; len(scan) < 2*shardEntries; i++ {
		if key := "rl:{scan-" + strconv.Itoa(i) + "}"; c.shard(key) == &c.shards[0] {
			scan = append(scan, key)
		}
	}
	spend := func(key string) {
		decide1(t, c, key, hourly, 1)
		if r := decide1(t, c, key, hourly, 1); r.Allowed {
			t.Fatalf("%s: the second check admitted", key)
		}
	}
	for _, key := range scan[:shardEntries] {
		spend(key)
	}
	// The busy client: 5 + 1/s, spent, then checked again and again while
	// the scan goes on. Its bucket refills a token a second, so over E
	// seconds Redis can be asked about at most 2(⌈E⌉ + 1) of its checks:
	// the ⌈E⌉ + 1 admissions, and the denial that renews its entry after
	// each.
	busy, steady := "rl:{busy}", lua.Limit{Capacity: 5, Rate: 1}
	for c.shard(busy) != &c.shards[0] {
		busy += "+"
	}
	for range 5 {
		decide1(t, c, busy, steady, 1)
	}
	start := time.Now()
	before := g.count()
	const checks = 100
	for i := range checks {
		decide1(t, c, busy, steady, 1)
		if i%2 == 0 {
			spend(scan[shardEntries+i/2])
		}
	}
	asked := g.count() - before - 2*(checks/2) // the scan's checks go to Redis
	most := 2 * (int(time.Since(start).Seconds()) + 2)
	if asked > most {
		t.Errorf("the busy bucket's %d checks beside the scan: %d went to Redis in %v, want at most %d", checks, asked, time.Since(start), most)
	}
	if _, ok := c.shards[0].entries[busy]; !ok {
		t.Error("the busy bucket's entry was evicted")
	}
	if _, ok := c.shards[0].entries[scan[0]]; ok {
		t.Error("the entry checked longest ago was kept")
	}
}
