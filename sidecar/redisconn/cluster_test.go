package redisconn

import (
	"context"
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
	s, err := Parse("redis+cluster://" + strings.Join(cl.Addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	const pipelines = 4
	c := s.NewClient(Tuning{PoolSize: 3*pipelines + 4, MinIdleConns: pipelines}).(*redis.ClusterClient)
	t.Cleanup(func() { c.Close() })
	d := decide.New(c, decide.Options{Pipelines: pipelines, WarmConns: pipelines})
	t.Cleanup(d.Close)
	ctx := context.Background()
	if err := d.Ready(ctx); err != nil {
		t.Fatal(err)
	}
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
