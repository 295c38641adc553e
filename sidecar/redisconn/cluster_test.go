package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/decide"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// TestClusterPipelinesOnWarmConnections: on a cluster client built as the
// sidecar builds it (the Tuning of sidecar/app: 4 pipelines), the
// decisions' first pipelines to each master go out on connections dialed
// before them (MinIdleConns), not on ones dialed on their way: go-redis's
// own pipeline pool keeps none idle, and a fresh sidecar's first burst
// spent its checks' 4 ms on the dials and handshakes. Every pipeline of a
// burst that keeps each master's four busy must find an idle connection:
// no pool counts a miss.
func TestClusterPipelinesOnWarmConnections(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	uc, d := readyDecider(t, "redis+cluster://"+strings.Join(cl.Addrs, ","))
	c := uc.(*redis.ClusterClient)
	ctx := context.Background()
	// The idle connections go-redis dials ahead, in the background, once
	// a node's client exists.
	before := map[*redis.Client]uint32{}
	testkit.Poll(t, 10*time.Second, "every master's pool to hold its idle connections", func() bool {
		// ForEachMaster calls each master's function on its own goroutine.
		var short atomic.Bool
		_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			if m.PoolStats().IdleConns < pipelines {
				short.Store(true)
			}
			return nil
		})
		return !short.Load()
	})
	masters := map[*redis.Client]int{}
	var keys []string
	for i := 0; len(keys) < 3*8*pipelines; i++ {
		k := fmt.Sprintf("rl:{warm-%d}", i)
		m, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if masters[m] < 8*pipelines {
			masters[m]++
			keys = append(keys, k)
			before[m] = poolMisses(m)
		}
	}
	// Eight checks per pipeline a master may have in flight, all at once:
	// each master's pipelines all go out together at least once.
	decideAtOnce(t, d, keys)
	for m := range masters {
		if n := poolMisses(m) - before[m]; n != 0 {
			t.Errorf("master %s: %d pipelines found no idle connection and dialed one on their checks' way, want 0", m.Options().Addr, n)
		}
	}
}

// poolMisses is how many times a node's client found no idle connection,
// in its main pool or its pipeline pool, and dialed one.
func poolMisses(c *redis.Client) uint32 {
	st := c.PoolStats()
	n := st.Misses
	if p := st.PipelineStats; p != nil {
		n += p.Misses
	}
	return n
}

// decideAtOnce sends a check of cost 1 for each key, all at once, and
// waits for every answer; a check that fails is an error of t.
func decideAtOnce(t *testing.T, d *decide.Decider, keys []string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := d.Decide(time.Now().Add(time.Minute), k, lua.Limit{Capacity: 10, Rate: 10}, 1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// TestClusterKilledMasterFailsAtOnce: on a cluster client built as the
// sidecar builds it, the checks on a master that was killed (its port
// refusing connections) fail at once rather than at their deadline, and
// the master is used again once it is back.
//
// Fifty checks on the killed master, one every 10 ms, each with the
// sidecar's deadline (server.DefaultTimeout, 4 ms). go-redis dialed a node
// up to 5 times, 100 ms apart (0.4 s), before a pipeline saw the error,
// and retried the pipeline on a fresh dial until its second (ExecTimeout)
// was up; the node's pool stopped dialing only after 16 dials (its pool
// size) had failed, at most 8 at once (4 pipelines, 4 idle connections
// dialed ahead): 0.8 s at least, past these checks' 0.5 s, so every one
// of them waited out its deadline. A refused dial on loopback fails in
// well under a millisecond, and a pipeline with its retries in about one:
// a check that still reaches its deadline is one a busy machine did not
// run for 4 ms. A quarter of them may.
//
// Restarted, a cluster master answers CLUSTERDOWN for 2 s after its start
// (Redis's CLUSTER_WRITABLE_DELAY), and the pool that stopped dialing it
// dials again once a second: its first check decided comes 2 s after it
// is back, a redial later at most (3 s), and a busy machine's second
// more: 4 s.
func TestClusterKilledMasterFailsAtOnce(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	uc, d := readyDecider(t, "redis+cluster://"+strings.Join(cl.Addrs, ","))
	c := uc.(*redis.ClusterClient)
	ctx := context.Background()
	const key = "rl:{killed}"
	limit := lua.Limit{Capacity: 1000, Rate: 1000}
	if r, err := d.Decide(time.Now().Add(time.Minute), key, limit, 1); err != nil || !r.Allowed {
		t.Fatalf("check before the kill: %+v, %v", r, err)
	}
	master, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	node := cl.Node(master.Options().Addr)
	if err := node.Kill(); err != nil {
		t.Fatal(err)
	}

	const checks = 50
	if waited := checksOnKilled(t, d, key, limit, checks, "master"); waited > checks/4 {
		t.Errorf("%d of %d checks on the killed master waited out their %v deadline, want at most %d: the refused dials were retried on their way", waited, checks, server.DefaultTimeout, checks/4)
	}

	if err := node.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var last error
	if !testkit.Until(4*time.Second, func() bool {
		_, last = d.Decide(time.Now().Add(server.DefaultTimeout), key, limit, 1)
		return last == nil
	}) {
		t.Fatalf("restarted master: no check decided within 4 s: %v", last)
	}
	t.Logf("restarted master: first check decided %v after it was back", time.Since(up))
}

// checksOnKilled sends n checks to the killed what, one every 10 ms, each
// with the sidecar's deadline (server.DefaultTimeout), and returns how
// many waited it out; a check decided fails the test.
func checksOnKilled(t *testing.T, d *decide.Decider, key string, limit lua.Limit, n int, what string) (waited int) {
	t.Helper()
	var firstErr error
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range n {
		<-tick.C
		r, err := d.Decide(time.Now().Add(server.DefaultTimeout), key, limit, 1)
		switch {
		case err == nil:
			t.Fatalf("check on the killed %s answered: %+v", what, r)
		case errors.Is(err, context.DeadlineExceeded):
			waited++
		case firstErr == nil:
			firstErr = err
		}
	}
	t.Logf("%d of %d checks on the killed %s waited out their deadline; the others failed with: %v", waited, n, what, firstErr)
	return waited
}

// pipelines is the sidecar's default -redis-pipelines
// (decide.DefaultPipelines), which the tests' clients are built for.
const pipelines = decide.DefaultPipelines

// readyDecider builds a client for url as sidecar/app builds it
// (ForPipelines) and a Decider on it as sidecar/app makes one (on a single
// server, deciding over its own connection), and returns them once the
// Decider is ready.
func readyDecider(t *testing.T, url string) (redis.UniversalClient, *decide.Decider) {
	t.Helper()
	s, err := Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	c := s.NewClient(ForPipelines(pipelines))
	t.Cleanup(func() { c.Close() })
	d := decide.New(c, decide.Options{Pipelines: pipelines, WarmConns: pipelines, Direct: s.Kind == Standalone})
	t.Cleanup(d.Close)
	if err := d.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c, d
}
