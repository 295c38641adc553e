package app

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// TestSentinelFailover: the sidecar finds the master through Sentinel, and
// when the master dies and Sentinel promotes the replica, decisions resume on
// the new master without restarting the sidecar.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	master, replica, sentinel := redisproc.StartSentinelPairT(t)

	s := startSidecar(t, "redis+sentinel://"+sentinel+"/mymaster", contractPlans, decidesAnyway)
	if r := s.check(t, "failover-client"); r.status != 200 {
		t.Fatalf("before failover: %d %q", r.status, r.body)
	}
	if n, _ := master.Client(t).Exists(ctx, s.bucket("failover-client")).Result(); n != 1 {
		t.Fatal("the bucket is not on the master Sentinel named")
	}

	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	// Sentinel needs down-after (500 ms) plus an election to promote the
	// replica; until then checks fail (503), after it they pass again.
	testkit.Poll(t, 30*time.Second, "decisions to resume on the promoted replica", func() bool {
		return s.check(t, "failover-client").status == 200
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
	if err != nil || net.JoinHostPort(addr[0], addr[1]) != replica.Addr {
		t.Fatalf("Sentinel's master is %v (%v), want the promoted replica %s", addr, err, replica.Addr)
	}
	if n, _ := replica.Client(t).Exists(ctx, s.bucket("failover-client")).Result(); n != 1 {
		t.Fatal("the bucket is not on the promoted replica")
	}
}

// TestSentinelDemotedMaster: Sentinel hands the master's role to the
// replica while the old master stays up, as its replica (SENTINEL
// FAILOVER, as in maintenance). The connections the sidecar holds to the
// old master are answered READONLY and no check is charged there; the
// sidecar follows the new master without a restart, and the client's
// bucket, replicated, keeps what it had spent.
func TestSentinelDemotedMaster(t *testing.T) {
	ctx := context.Background()
	master, replica, sentinel := redisproc.StartSentinelPairT(t)
	// decidesAnyway: a check that timed out could still be charged, which
	// would blur the count below.
	s := startSidecar(t, "redis+sentinel://"+sentinel+"/mymaster", `
default_plan: slow
plans:
  slow: {capacity: 5, rate: 0.001}
`, decidesAnyway)
	// Four of the five tokens spent: no denial yet, so no deny-cache entry
	// answers for Redis below.
	for i := range 4 {
		if r := s.check(t, "demoted-client"); r.status != 200 {
			t.Fatalf("check %d before the failover: %d %q", i+1, r.status, r.body)
		}
	}
	mc, rc := master.Client(t), replica.Client(t)
	testkit.Poll(t, 30*time.Second, "the bucket to reach the replica", func() bool {
		n, err := rc.Exists(ctx, s.bucket("demoted-client")).Result()
		return err == nil && n == 1
	})

	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer sc.Close()
	// Sentinel refuses (NOGOODSLAVE) until it has the replica's own INFO,
	// which it asks for every 10 s (every second during a failover).
	testkit.PollErr(t, 30*time.Second, "Sentinel to take a failover", func() error {
		return sc.Failover(ctx, "mymaster").Err()
	})
	testkit.Poll(t, 30*time.Second, "Sentinel to name the replica master", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
		return err == nil && net.JoinHostPort(addr[0], addr[1]) == replica.Addr
	})
	// Sentinel turns the old master into the new one's replica; the
	// sidecar's connections to it were made while it was the master.
	testkit.Poll(t, 30*time.Second, "the old master to be a replica", func() bool {
		role, err := mc.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "slave"
	})
	var r reply
	testkit.Poll(t, 30*time.Second, "a check decided on the new master", func() bool {
		r = s.check(t, "demoted-client")
		return r.status != 503
	})
	if r.status != 200 || r.h("ratelimit-remaining") != "0" {
		t.Fatalf("first check decided after the failover: %d, %s remaining; want 200 with the last token (the bucket kept its 4 spent)", r.status, r.h("ratelimit-remaining"))
	}
	// A 200 made no deny-cache entry: Redis denies this one.
	if r := s.check(t, "demoted-client"); r.status != 429 {
		t.Fatalf("the check after the last token: %d, want 429", r.status)
	}
}
