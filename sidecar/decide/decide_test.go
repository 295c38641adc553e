package decide

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/redisconn"
)

// slow is a limit whose refill is negligible within a test: 1 token per
// 1000 s, so a bucket's count only moves by what the test spends.
var slow = lua.Limit{Capacity: 5, Rate: 0.001}

// spentOnce reports whether tokens is what a slow bucket holds after a
// spend that left want, from a balance the bucket's first write left
// after start: want, plus at most slow's refill since start (Redis's
// clock is this machine's), added to a balance below 8 in one sum that
// rounds up by at most half an ulp, 2^-51 (and never below the balance);
// taking the whole cost after it is exact.
func spentOnce(tokens, want float64, start time.Time) bool {
	return tokens >= want && tokens <= want+slow.Rate*time.Since(start).Seconds()+0x1p-51
}

func newDecider(t *testing.T, c redis.UniversalClient, opt Options) *Decider {
	t.Helper()
	d := New(c, opt)
	t.Cleanup(d.Close)
	return d
}

// paths runs f on both ways of sending decisions: go-redis pipelines, and
// the decider's own connection (Options.Direct).
func paths(t *testing.T, f func(t *testing.T, direct bool)) {
	for _, direct := range []bool{false, true} {
		name := "pipelines"
		if direct {
			name = "direct"
		}
		t.Run(name, func(t *testing.T) { f(t, direct) })
	}
}

func standalone(t *testing.T) (*redisproc.Server, *redis.Client) {
	t.Helper()
	srv := redisproc.StartT(t, redisproc.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 2})
	t.Cleanup(func() { c.Close() })
	return srv, c
}

func TestDecideBurst(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		_, c := standalone(t)
		d := newDecider(t, c, Options{Direct: direct})
		for i := range 5 {
			r, err := d.Decide(far(), "rl:{burst}", slow, 1)
			if err != nil || !r.Allowed {
				t.Fatalf("call %d: %+v, %v; want allowed", i, r, err)
			}
		}
		r, err := d.Decide(far(), "rl:{burst}", slow, 1)
		if err != nil || r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("call 6: %+v, %v; want denied with a retry time", r, err)
		}
		// Cost above capacity: never, not a retry.
		r, err = d.Decide(far(), "rl:{big}", slow, 6)
		if err != nil || r.Allowed || !r.Never || r.RetryAfter != 0 {
			t.Fatalf("cost 6 of 5: %+v, %v; want never", r, err)
		}
	})
}

// TestConcurrentExact spends one bucket from many goroutines through the
// batching loops: exactly capacity decisions may be allowed.
func TestConcurrentExact(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		_, c := standalone(t)
		var maxBatch atomic.Int64
		d := newDecider(t, c, Options{Direct: direct, Pipelines: 2, OnBatch: func(n int) {
			for {
				m := maxBatch.Load()
				if int64(n) <= m || maxBatch.CompareAndSwap(m, int64(n)) {
					return
				}
			}
		}})
		limit := lua.Limit{Capacity: 100, Rate: 0.001}
		var allowed, denied atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					r, err := d.Decide(far(), "rl:{shared}", limit, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						allowed.Add(1)
					} else {
						denied.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		// 320 requests for 100 tokens; refill over the test adds far less than
		// one token (0.001/s), so exactly 100 pass.
		if allowed.Load() != 100 || denied.Load() != 220 {
			t.Fatalf("allowed %d denied %d; want 100 and 220", allowed.Load(), denied.Load())
		}
		t.Logf("largest batch: %d", maxBatch.Load())
	})
}

// TestBatching holds Redis with CLIENT PAUSE WRITE (scripts block, CLIENT
// commands do not) so that the order of events is fixed: one call goes out
// alone, the rest queue behind it and go out together as one pipeline.
func TestBatching(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		srv, c := standalone(t)
		ctl := srv.Client(t)
		batches := make(chan int, 100)
		d := newDecider(t, c, Options{Direct: direct, Pipelines: 1, MaxBatch: 64, OnBatch: func(n int) { batches <- n }})
		ctx := context.Background()
		if err := ctl.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		const queued = 50
		var wg sync.WaitGroup
		errs := make(chan error, queued+1)
		decide := func(key string) {
			defer wg.Done()
			r, err := d.Decide(far(), key, slow, 1)
			if err == nil && !r.Allowed {
				err = fmt.Errorf("%s denied", key)
			}
			errs <- err
		}
		wg.Add(1)
		go decide("rl:{first}")
		if n := <-batches; n != 1 {
			t.Fatalf("first batch %d, want 1 (an idle decider must not wait for more)", n)
		}
		for i := range queued {
			wg.Add(1)
			go decide(fmt.Sprintf("rl:{k%d}", i))
		}
		testkit.Poll(t, 30*time.Second, "all calls queued", func() bool { return len(d.queue) == queued })
		if err := ctl.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if n := <-batches; n != queued {
			t.Fatalf("second batch %d, want all %d queued calls in one pipeline", n, queued)
		}
	})
}

// TestDeadline: a caller gets ErrTimeout at its deadline while Redis is
// still stuck, and a call that expired in the queue is never sent,
// so its bucket is not charged.
func TestDeadline(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		srv, c := standalone(t)
		ctl := srv.Client(t)
		batches := make(chan int, 10)
		d := newDecider(t, c, Options{Direct: direct, Pipelines: 1, OnBatch: func(n int) { batches <- n }})
		bg := context.Background()
		if err := ctl.Do(bg, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		unpaused := false
		defer func() {
			if !unpaused {
				ctl.Do(bg, "CLIENT", "UNPAUSE")
			}
		}()

		// The first call occupies the only loop until Redis is unpaused.
		firstDone := make(chan error, 1)
		go func() {
			_, err := d.Decide(far(), "rl:{holder}", slow, 1)
			firstDone <- err
		}()
		<-batches

		_, err := d.Decide(time.Now().Add(20*time.Millisecond), "rl:{expired}", slow, 1)
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Decide = %v, want ErrTimeout wrapping context.DeadlineExceeded", err)
		}
		// Redis is still paused (unpaused only below): the answer did not wait.
		if err := ctl.Do(bg, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Fatal(err)
		}
		unpaused = true
		if err := <-firstDone; err != nil {
			t.Fatal(err)
		}
		// Flush the loop with one more call: the expired one sat before it in
		// the queue, so by the time this returns it has been dropped.
		if _, err := d.Decide(far(), "rl:{after}", slow, 1); err != nil {
			t.Fatal(err)
		}
		if n, err := ctl.Exists(bg, "rl:{expired}").Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS expired bucket = %d, %v; want 0 (an expired call must not spend tokens)", n, err)
		}
		if n, _ := ctl.Exists(bg, "rl:{holder}", "rl:{after}").Result(); n != 2 {
			t.Fatalf("EXISTS of the answered buckets = %d, want 2", n)
		}
	})
}

func TestNoScriptAfterFlush(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		srv, c := standalone(t)
		var reloads atomic.Int64
		d := newDecider(t, c, Options{Direct: direct, OnNoScript: func() { reloads.Add(1) }})
		ctx := context.Background()
		start := time.Now()
		// The first call finds Redis without the script, too.
		if _, err := d.Decide(far(), "rl:{a}", slow, 1); err != nil {
			t.Fatal(err)
		}
		if reloads.Load() != 1 {
			t.Fatalf("NOSCRIPT reloads on a fresh Redis = %d, want 1", reloads.Load())
		}
		if err := srv.Client(t).ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		r, err := d.Decide(far(), "rl:{a}", slow, 1)
		if err != nil || !r.Allowed || !spentOnce(r.Tokens, 3, start) {
			t.Fatalf("after SCRIPT FLUSH: %+v, %v; want allowed with 3 tokens left", r, err)
		}
		if reloads.Load() != 2 {
			t.Fatalf("NOSCRIPT reloads = %d, want 2 (one more after the flush)", reloads.Load())
		}
	})
}

func TestRedisRestart(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		srv, c := standalone(t)
		d := newDecider(t, c, Options{Direct: direct})
		ctx := context.Background()
		if _, err := d.Decide(far(), "rl:{a}", slow, 1); err != nil {
			t.Fatal(err)
		}
		if err := d.Ready(ctx); err != nil {
			t.Fatalf("Ready = %v", err)
		}
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decide(far(), "rl:{a}", slow, 1); err == nil {
			t.Fatal("Decide succeeded with Redis killed")
		}
		d.ready.mu.Lock()
		d.ready.until = time.Time{} // skip the cache: the previous answer was "ready"
		d.ready.mu.Unlock()
		if err := d.Ready(ctx); err == nil {
			t.Fatal("Ready = nil with Redis killed")
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		// The restarted Redis is empty: no bucket, no script. Pooled connections
		// are dead; go-redis redials. Decisions resume on a full bucket.
		var r lua.Result
		var err error
		testkit.Poll(t, 30*time.Second, "decisions to resume", func() bool {
			r, err = d.Decide(far(), "rl:{a}", slow, 1)
			return err == nil
		})
		// A new bucket starts full and nothing refills before its first
		// write: 5 - 1, exactly.
		if !r.Allowed || r.Tokens != 4 {
			t.Fatalf("first decision after restart: %+v; want allowed from a fresh bucket (4 left)", r)
		}
	})
}

// TestReadyWarmsThePath: every Ready that is not answered from its cache
// makes one decision, a peek that leaves Redis as it was; the first is the
// path's first run.
func TestReadyWarmsThePath(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		srv, c := standalone(t)
		d := newDecider(t, c, Options{Direct: direct, WarmConns: 1})
		ctx := context.Background()
		for i := range 2 {
			if i == 1 {
				d.ready.mu.Lock()
				d.ready.until = time.Time{} // skip the cache
				d.ready.mu.Unlock()
			}
			if err := d.Ready(ctx); err != nil {
				t.Fatalf("Ready %d = %v", i+1, err)
			}
			// Ready returns once Redis has answered the peek.
			if n, err := redisproc.CommandCalls(ctx, srv.Addr, "evalsha", "eval"); err != nil || n != int64(i+1) {
				t.Fatalf("after Ready %d Redis ran the script %d times (%v), want %d", i+1, n, err, i+1)
			}
		}
		// A third Ready answered from the cache asks Redis nothing.
		d.ready.mu.Lock()
		d.ready.until = time.Now().Add(time.Hour)
		d.ready.mu.Unlock()
		if err := d.Ready(ctx); err != nil {
			t.Fatalf("Ready 3 = %v", err)
		}
		if n, err := redisproc.CommandCalls(ctx, srv.Addr, "evalsha", "eval"); err != nil || n != 2 {
			t.Fatalf("after a cached Ready Redis ran the script %d times (%v), want 2", n, err)
		}
		if n, err := srv.Client(t).DBSize(ctx).Result(); err != nil || n != 0 {
			t.Fatalf("DBSIZE after Ready = %d, %v; want 0: the peek writes nothing", n, err)
		}
	})
}

// TestReadyNeedsTheBucketKeys: an ACL user that may run every command but
// on no rl: key passes SCRIPT EXISTS and is refused every EVALSHA on a
// bucket (NOPERM): no check can be decided, and Ready says so with
// Redis's reason. The same user given the bucket keys is ready.
func TestReadyNeedsTheBucketKeys(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		const password = "pw-51e0a2"
		srv := redisproc.StartT(t, redisproc.Options{})
		ctx := context.Background()
		admin := srv.Client(t)
		if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">"+password, "~other:*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: password})
		t.Cleanup(func() { c.Close() })
		d := newDecider(t, c, Options{Direct: direct, WarmConns: 1})
		if err := d.Ready(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("Ready of a user without the bucket keys = %v, want NOPERM", err)
		}
		if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "resetkeys", "~rl:*").Err(); err != nil {
			t.Fatal(err)
		}
		d.ready.mu.Lock()
		d.ready.until = time.Time{} // skip the cache
		d.ready.mu.Unlock()
		if err := d.Ready(ctx); err != nil {
			t.Fatalf("Ready of a user with the bucket keys = %v", err)
		}
	})
}

func TestReadyLoadsScript(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		srv, c := standalone(t)
		d := newDecider(t, c, Options{Direct: direct})
		ctx := context.Background()
		if err := d.Ready(ctx); err != nil {
			t.Fatalf("Ready = %v", err)
		}
		got, err := srv.Client(t).ScriptExists(ctx, lua.Script.Hash()).Result()
		if err != nil || len(got) != 1 || !got[0] {
			t.Fatalf("SCRIPT EXISTS after Ready = %v, %v; want loaded", got, err)
		}
	})
}

func TestClose(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		_, c := standalone(t)
		d := New(c, Options{Direct: direct})
		if _, err := d.Decide(far(), "rl:{a}", slow, 1); err != nil {
			t.Fatal(err)
		}
		d.Close()
		d.Close() // idempotent
		if _, err := d.Decide(far(), "rl:{a}", slow, 1); !errors.Is(err, ErrClosed) {
			t.Fatalf("Decide after Close = %v, want ErrClosed", err)
		}
	})
}

// TestClusterScriptHealed: a cluster master that lost the script gets it
// back from a peek of its own as well as from the checks' EVAL, so that it
// is loaded even where the checks' deadline passes first (healScript): one
// NOSCRIPT makes two EVALs there, and the peek spends no token.
func TestClusterScriptHealed(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	t.Cleanup(func() { c.Close() })
	d := newDecider(t, c, Options{})
	ctx := context.Background()
	// The script on every master first, so that the first decision meets
	// no NOSCRIPT and starts no peek of its own.
	if err := d.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	const key = "rl:{healed}"
	if r, err := d.Decide(far(), key, slow, 1); err != nil || !r.Allowed {
		t.Fatalf("first decision: %+v, %v", r, err)
	}
	owner, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	addr := owner.Options().Addr
	if err := owner.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	evals := func() int64 {
		n, err := redisproc.CommandCalls(ctx, addr, "eval")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := evals()
	if r, err := d.Decide(far(), key, slow, 1); err != nil || !r.Allowed {
		t.Fatalf("decision after SCRIPT FLUSH: %+v, %v", r, err)
	}
	testkit.Poll(t, 5*time.Second, "the peek's EVAL", func() bool { return evals()-before >= 2 })
	d.Close() // waits for the peek
	if n := evals() - before; n != 2 {
		t.Fatalf("%d EVALs on %s after one NOSCRIPT, want 2: the checks' and the peek's", n, addr)
	}
	// Two decisions of cost 1 on a bucket of 5 that refills 1 in 1,000 s:
	// the peek took nothing.
	if tokens, err := owner.HGet(ctx, key, "tokens").Float64(); err != nil || tokens < 3 || tokens >= 3.1 {
		t.Fatalf("tokens %v, %v; want 3 and the refill of a few seconds", tokens, err)
	}
}

// TestCluster runs decisions on a 3-master Redis Cluster: pipelines are split
// by slot, and buckets of different clients land on different masters.
func TestCluster(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	t.Cleanup(func() { c.Close() })
	// Direct is ignored for a cluster client: its pipelines go by slot.
	d := newDecider(t, c, Options{Direct: true})
	ctx := context.Background()
	const clients = 60
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("rl:{client-%d}", i)
			for j := range 6 {
				r, err := d.Decide(far(), key, slow, 1)
				if err != nil {
					t.Errorf("%s call %d: %v", key, j, err)
					return
				}
				if want := j < 5; r.Allowed != want {
					t.Errorf("%s call %d: allowed=%v, want %v", key, j, r.Allowed, want)
				}
			}
		}()
	}
	wg.Wait()
	masters := 0
	for _, addr := range cl.Addrs {
		n, err := cl.Node(addr).Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			masters++
		}
	}
	// 60 random-looking hash tags over 3 masters: the chance that one master
	// gets none is 3*(2/3)^60, about 1e-10.
	if masters != 3 {
		t.Fatalf("buckets on %d masters, want 3", masters)
	}
	if err := d.Ready(ctx); err != nil {
		t.Fatalf("Ready on cluster = %v", err)
	}
}

// far is a deadline no test reaches: these calls wait for Redis.
func far() time.Time { return time.Now().Add(time.Minute) }

func TestArgsCache(t *testing.T) {
	d := &Decider{}
	tests := []struct {
		l    lua.Limit
		cost int64
	}{{slow, 1}, {slow, 2}, {lua.Limit{Capacity: 10, Rate: 0.5}, 1}, {slow, 1}}
	for _, tt := range tests {
		got, want := d.args(tt.l, tt.cost).vals, lua.Args(tt.l, tt.cost)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("args(%v, %d) = %v, want %v", tt.l, tt.cost, got, want)
		}
	}
	if n := d.argsCount.Load(); n != 3 {
		t.Errorf("cache grew %d times for 3 distinct calls", n)
	}
	// Past the bound the cache starts over: it never holds more than the
	// bound, and answers stay right.
	for i := range maxCachedArgs + 10 {
		if got := d.args(slow, int64(i+100)).vals; fmt.Sprint(got) != fmt.Sprint(lua.Args(slow, int64(i+100))) {
			t.Fatalf("args(slow, %d) = %v", i+100, got)
		}
	}
	n := 0
	d.argsCache.Range(func(any, any) bool { n++; return true })
	if n > maxCachedArgs || n == 0 {
		t.Errorf("cache holds %d entries, bound %d", n, maxCachedArgs)
	}
}

// TestReadySeesChecksRefused: Redis answers the readiness peek, which
// writes nothing, but refuses every write a check makes: a server demoted
// to a replica (READONLY), and one at maxmemory under noeviction (OOM).
// Ready says so, with Redis's reply, once a check was refused, and is ready
// again after a check is admitted. A denial writes nothing and leaves it
// not ready.
func TestReadySeesChecksRefused(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name        string
		want        string
		refuse, fix func(c *redis.Client, other string) error
	}{
		{"replica", "READONLY",
			func(c *redis.Client, other string) error {
				host, port, _ := net.SplitHostPort(other)
				return c.ReplicaOf(ctx, host, port).Err()
			},
			func(c *redis.Client, _ string) error { return c.ReplicaOf(ctx, "NO", "ONE").Err() }},
		{"maxmemory", "OOM",
			func(c *redis.Client, _ string) error { return c.ConfigSet(ctx, "maxmemory", "1").Err() },
			func(c *redis.Client, _ string) error { return c.ConfigSet(ctx, "maxmemory", "0").Err() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			paths(t, func(t *testing.T, direct bool) {
				srv, c := standalone(t)
				other := redisproc.StartT(t, redisproc.Options{})
				admin := srv.Client(t)
				d := newDecider(t, c, Options{Direct: direct, WarmConns: 1})
				fresh := func() error {
					d.ready.mu.Lock()
					d.ready.until = time.Time{} // skip the cache
					d.ready.mu.Unlock()
					return d.Ready(ctx)
				}
				if err := fresh(); err != nil {
					t.Fatalf("Ready = %v", err)
				}
				if err := tc.refuse(admin, other.Addr); err != nil {
					t.Fatal(err)
				}
				if err := fresh(); err != nil {
					t.Fatalf("Ready before any check was refused = %v; the peek writes nothing", err)
				}
				if _, err := d.Decide(far(), "rl:{refused}", slow, 1); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("a check = %v, want %s", err, tc.want)
				}
				if err := fresh(); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Ready after a refused check = %v, want %s", err, tc.want)
				}
				// A cost above the capacity is denied without a write,
				// whatever the bucket holds (the replica's data is its new
				// master's once it has synced).
				if r, err := d.Decide(far(), "rl:{denied}", slow, 10); err != nil || r.Allowed {
					t.Fatalf("a check costing more than the capacity: %+v, %v; want denied", r, err)
				}
				if err := fresh(); err == nil {
					t.Fatal("Ready after a denial = nil, want the refusal still")
				}
				if err := tc.fix(admin, other.Addr); err != nil {
					t.Fatal(err)
				}
				if r, err := d.Decide(far(), "rl:{refused}", slow, 1); err != nil || !r.Allowed {
					t.Fatalf("a check after the fix: %+v, %v", r, err)
				}
				if err := fresh(); err != nil {
					t.Fatalf("Ready after a check was admitted = %v", err)
				}
			})
		})
	}
}

// TestRefusalForgotten: a refusal older than refusalMemory no longer
// makes Ready say no: the checks stopped, and the peek is all there is.
func TestRefusalForgotten(t *testing.T) {
	d := &Decider{}
	now := time.Now()
	d.refused.Store(&refusal{at: now, err: errors.New("OOM command not allowed")})
	if err := d.refusedLately(now.Add(refusalMemory - time.Millisecond)); err == nil {
		t.Error("a refusal within refusalMemory is not reported")
	}
	if err := d.refusedLately(now.Add(refusalMemory)); err != nil {
		t.Errorf("a refusal refusalMemory old = %v, want forgotten", err)
	}
}

// TestClusterStoppedMasterHoldsOnlyItsOwn: while a master is stopped
// (SIGSTOP: connections open, nothing answered) and its pipelines wait for
// it, a check on a healthy master is answered as soon as its master has,
// even with one loop and one pipeline per master (Pipelines: 1).
func TestClusterStoppedMasterHoldsOnlyItsOwn(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	// The sidecar's client: a call ends at its context's deadline, not at
	// go-redis's 3 s read timeout.
	c := sidecarClusterClient(t, cl, DefaultPipelines)
	// One loop, and one pipeline in flight per master.
	batches := make(chan int, 16)
	d := newDecider(t, c, Options{Pipelines: 1, OnBatch: func(n int) { batches <- n }})
	ctx := context.Background()
	if err := d.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// A key on each of two different masters.
	master := func(key string) *redis.Client {
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	stoppedKey, healthyKey := "rl:{stopped}", ""
	stopped := master(stoppedKey)
	for i := 0; healthyKey == ""; i++ {
		if k := fmt.Sprintf("rl:{healthy-%d}", i); master(k) != stopped {
			healthyKey = k
		}
	}
	for _, k := range []string{stoppedKey, healthyKey} {
		if r, err := d.Decide(far(), k, slow, 1); err != nil || !r.Allowed {
			t.Fatalf("%s before the stop: %+v, %v", k, r, err)
		}
	}
	// The batches so far (the peek's, these two) were sent before their
	// answers came back.
	for len(batches) > 0 {
		<-batches
	}
	node := cl.Node(stopped.Options().Addr)
	if err := node.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Resume() })

	// The first check on the stopped master takes the one pipeline it may
	// have in flight (Pipelines: 1) until its deadline (1 s) at least. A
	// check on the healthy master sent meanwhile is answered at once, a
	// millisecond's work, while the stopped master's first check still
	// waits: the rest of that check's second leaves a busy machine's
	// delays. A check on the stopped master sent with it waits for that
	// pipeline and fails.
	blocker := make(chan error, 1)
	go func() {
		_, err := d.Decide(time.Now().Add(time.Second), stoppedKey, slow, 1)
		blocker <- err
	}()
	if n := <-batches; n != 1 {
		t.Fatalf("first pipeline after the stop has %d checks, want 1", n)
	}
	deadline := time.Now().Add(3 * time.Second)
	type answer struct {
		err  error
		took time.Duration
	}
	stoppedAns := make(chan answer, 1)
	go func() {
		start := time.Now()
		_, err := d.Decide(deadline, stoppedKey, slow, 1)
		stoppedAns <- answer{err, time.Since(start)}
	}()
	start := time.Now()
	_, err := d.Decide(deadline, healthyKey, slow, 1)
	h := answer{err, time.Since(start)}
	if h.err != nil {
		t.Fatalf("check on the healthy master sent while the stopped master's pipeline waited: %v after %v, want an answer", h.err, h.took)
	}
	select {
	case err := <-blocker:
		t.Fatalf("check on the healthy master answered in %v, only after the stopped master's check had ended (%v)", h.took, err)
	default:
	}
	// The stopped master's checks fail at their deadline, by their timer
	// or by the pipeline's read timing out at the same moment.
	if err := <-blocker; err == nil {
		t.Fatal("first check on the stopped master answered, want an error")
	}
	// Its second check still waits, for its deadline 2 s from now at
	// least: a check on the healthy master sent meanwhile is answered
	// within its own second.
	if r, err := d.Decide(time.Now().Add(time.Second), healthyKey, slow, 1); err != nil || !r.Allowed {
		t.Fatalf("check on the healthy master while the stopped master's checks wait: %+v, %v", r, err)
	}
	if s := <-stoppedAns; s.err == nil {
		t.Fatal("second check on the stopped master answered, want an error")
	}
	t.Logf("healthy master's check answered in %v", h.took)
}

// TestClusterLateReplyKeepsConnection: a cluster master that answers only
// after its checks' deadline (stopped for longer than it) keeps the
// connection the pipeline went out on: the late replies are read when they
// come, and the next check goes out on it rather than on a new dial.
// go-redis gives up a connection whose pipeline ends at a deadline, and on
// a loaded machine each late reply so cost a dial on a later check's way.
func TestClusterLateReplyKeepsConnection(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	// The sidecar's client, with no idle minimum, so that every connection
	// the master is sent is one a pipeline asked for.
	c := sidecarClusterClient(t, cl, 0)
	d := newDecider(t, c, Options{Pipelines: 1})
	ctx := context.Background()
	const key = "rl:{late}"
	master, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// The script is there before the first check: a NOSCRIPT would send
	// healScript's EVAL, which may dial the master in the background while
	// the dials are counted.
	if err := master.ScriptLoad(ctx, lua.Source).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := d.Decide(far(), key, slow, 1); err != nil || !r.Allowed {
		t.Fatalf("first check: %+v, %v", r, err)
	}
	node := cl.Node(master.Options().Addr)
	ctl := node.Client(t) // the test's own connection, made before counting
	before := redisproc.InfoStat(t, ctl, "total_connections_received")

	if err := node.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Resume() })
	// Stopped, the master answers nothing: the check fails at its deadline.
	if r, err := d.Decide(time.Now().Add(50*time.Millisecond), key, slow, 1); err == nil {
		t.Fatalf("check on the stopped master: %+v, want an error", r)
	}
	if err := node.Resume(); err != nil {
		t.Fatal(err)
	}
	// Running again, the master answers the late check; its connection,
	// if kept, is back in the pool once none is in use (go-redis may keep
	// the pipelines' connections in a pool of their own).
	testkit.Poll(t, 10*time.Second, "no connection to the master in use", func() bool {
		s := master.PoolStats()
		if p := s.PipelineStats; p != nil && p.IdleConns != p.TotalConns {
			return false
		}
		return s.IdleConns == s.TotalConns
	})
	if _, err := d.Decide(far(), key, slow, 1); err != nil {
		t.Fatalf("check after the master resumed: %v", err)
	}
	if n := redisproc.InfoStat(t, ctl, "total_connections_received") - before; n != 0 {
		t.Errorf("the master was dialed %d times after a late reply, want 0: the connection was given up", n)
	}
}

// TestClusterStoppedMasterHoldsNoLoop: while one master is stopped
// (SIGSTOP: connections open, nothing answered), batches that mix its
// checks with the other masters' keep the other masters' checks answered:
// no loop waits for the stopped master, however many of its checks come.
// Each round sends one check on the stopped master, deadline 2 s, and one
// on each healthy master, deadline 500 ms, together, every 10 ms for 30
// rounds. A healthy master answers in well under a millisecond here; 500
// ms leaves a busy machine's (and the race detector's) delays. A loop
// that waited for a stopped master's check would wait 2 s, past the
// healthy checks' 500 ms: with Options.Pipelines loops, once that many
// were so held every healthy check behind them would fail. So none may.
func TestClusterStoppedMasterHoldsNoLoop(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	c := sidecarClusterClient(t, cl, DefaultPipelines)
	d := newDecider(t, c, Options{})
	ctx := context.Background()
	if err := d.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// A key on each master, the stopped one's first.
	var keys []string
	var masters []*redis.Client
	for i := 0; len(keys) < 3; i++ {
		k := fmt.Sprintf("rl:{mixed-%d}", i)
		m, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		seen := false
		for _, o := range masters {
			seen = seen || o == m
		}
		if !seen {
			keys, masters = append(keys, k), append(masters, m)
		}
	}
	for _, k := range keys {
		if r, err := d.Decide(far(), k, slow, 1); err != nil || !r.Allowed {
			t.Fatalf("%s before the stop: %+v, %v", k, r, err)
		}
	}
	node := cl.Node(masters[0].Options().Addr)
	if err := node.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Resume() })

	const rounds = 30
	var wg sync.WaitGroup
	var healthyFailed, stoppedAnswered atomic.Int64
	var firstErr atomic.Value
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range rounds {
		<-tick.C
		for i, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				within := 500 * time.Millisecond
				if i == 0 {
					within = 2 * time.Second
				}
				_, err := d.Decide(time.Now().Add(within), k, lua.Limit{Capacity: 1000, Rate: 1000}, 1)
				switch {
				case i == 0 && err == nil:
					stoppedAnswered.Add(1)
				case i > 0 && err != nil:
					healthyFailed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}()
		}
	}
	wg.Wait()
	if n := healthyFailed.Load(); n > 0 {
		t.Errorf("%d of %d checks on the healthy masters failed while another master was stopped (first: %v), want 0", n, 2*rounds, firstErr.Load())
	}
	if n := stoppedAnswered.Load(); n > 0 {
		t.Errorf("%d checks on the stopped master answered, want none", n)
	}
}

// sidecarClusterClient is a client of cl built as the sidecar builds its
// own (redisconn.ForPipelines with the default pipelines, as sidecar/app: a
// call ends at its context's deadline, a redirection is followed at once,
// the pipelines run on the main pool, a node is dialed once), with minIdle
// connections per node dialed ahead.
func sidecarClusterClient(t *testing.T, cl *redisproc.Cluster, minIdle int) *redis.ClusterClient {
	t.Helper()
	spec, err := redisconn.Parse("redis+cluster://" + strings.Join(cl.Addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	tuning := redisconn.ForPipelines(DefaultPipelines)
	tuning.MinIdleConns = minIdle
	c := spec.NewClient(tuning).(*redis.ClusterClient)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestReadySaysWhyRedisRefuses: readiness on a single server that refuses
// connections, with the client the sidecar builds (redisconn), answers
// within its DefaultReadyTimeout with the dial's error, which /readyz and
// the start-up line then give. go-redis's own 5 dials, 100 ms apart,
// outlasted the timeout, and the answer was "context deadline exceeded".
func TestReadySaysWhyRedisRefuses(t *testing.T) {
	paths(t, func(t *testing.T, direct bool) {
		spec, err := redisconn.Parse("redis://" + testkit.RefusedAddr(t) + "/0")
		if err != nil {
			t.Fatal(err)
		}
		// As the sidecar makes them (app.Start), at the default pipelines.
		c := spec.NewClient(redisconn.ForPipelines(DefaultPipelines))
		t.Cleanup(func() { c.Close() })
		d := newDecider(t, c, Options{Direct: direct, Pipelines: DefaultPipelines, WarmConns: min(DefaultPipelines, redisconn.MinIdleConns(c))})
		err = d.Ready(context.Background())
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("Ready on a refused address = %v, want the refused dial", err)
		}
	})
}
