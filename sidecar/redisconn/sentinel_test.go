package redisconn

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/decide"
)

// TestSentinelPipelinesOnWarmConnections: on a Sentinel client built as the
// sidecar builds it (the Tuning of sidecar/app: 4 pipelines), the
// decisions' first pipelines go out on the master connections dialed
// before them (MinIdleConns), as on a cluster
// (TestClusterPipelinesOnWarmConnections): go-redis's failover client too
// has a pipeline pool of its own that keeps none idle, and a fresh
// sidecar's first burst dialed its four pipelines' connections inside the
// checks' 4 ms. A burst that keeps the four busy must find an idle
// connection for every one: no pool counts a miss.
func TestSentinelPipelinesOnWarmConnections(t *testing.T) {
	_, _, sentinel := redisproc.StartSentinelPairT(t)
	s, err := Parse("redis+sentinel://" + sentinel + "/mymaster")
	if err != nil {
		t.Fatal(err)
	}
	const pipelines = 4
	c := s.NewClient(Tuning{PoolSize: 3*pipelines + 4, MinIdleConns: pipelines}).(*redis.Client)
	t.Cleanup(func() { c.Close() })
	d := decide.New(c, decide.Options{Pipelines: pipelines, WarmConns: pipelines})
	t.Cleanup(d.Close)
	if err := d.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	misses := func() uint32 {
		st := c.PoolStats()
		n := st.Misses
		if p := st.PipelineStats; p != nil {
			n += p.Misses
		}
		return n
	}
	// Ready's warm connections are back in the pool once it returns; the
	// idle ones go-redis dials ahead come in the background.
	testkit.Poll(t, 10*time.Second, "the pool to hold its idle connections", func() bool {
		return c.PoolStats().IdleConns >= pipelines
	})
	before := misses()
	// Eight checks per pipeline, all at once: the four pipelines all go
	// out together at least once.
	var wg sync.WaitGroup
	for i := range 8 * pipelines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("rl:{warm-%d}", i)
			if _, err := d.Decide(time.Now().Add(time.Minute), k, lua.Limit{Capacity: 10, Rate: 10}, 1); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := misses() - before; n != 0 {
		t.Errorf("%d pipelines found no idle connection and dialed one on their checks' way, want 0", n)
	}
}
