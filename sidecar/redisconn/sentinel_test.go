package redisconn

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
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
	uc, d := readyDecider(t, "redis+sentinel://"+sentinel+"/mymaster")
	c := uc.(*redis.Client)
	// Ready's warm connections are back in the pool once it returns; the
	// idle ones go-redis dials ahead come in the background.
	testkit.Poll(t, 10*time.Second, "the pool to hold its idle connections", func() bool {
		return c.PoolStats().IdleConns >= pipelines
	})
	before := poolMisses(c)
	// Eight checks per pipeline, all at once: the four pipelines all go
	// out together at least once.
	keys := make([]string, 8*pipelines)
	for i := range keys {
		keys[i] = fmt.Sprintf("rl:{warm-%d}", i)
	}
	decideAtOnce(t, d, keys)
	if n := poolMisses(c) - before; n != 0 {
		t.Errorf("%d pipelines found no idle connection and dialed one on their checks' way, want 0", n)
	}
}
