package app

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// startSentinel runs one redis-server in sentinel mode on a free loopback
// port, monitoring master as "mymaster" with quorum 1 and a short
// down-after, and returns its address once it sees the master and a replica.
func startSentinel(t *testing.T, master string) string {
	t.Helper()
	mhost, mport, _ := net.SplitHostPort(master)
	s := redisproc.StartT(t, redisproc.Options{Sentinel: []string{
		"sentinel monitor mymaster " + mhost + " " + mport + " 1",
		"sentinel down-after-milliseconds mymaster 500",
		"sentinel failover-timeout mymaster 5000",
	}})
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { sc.Close() })
	testkit.Poll(t, 30*time.Second, "the sentinel to see the master and its replica", func() bool {
		replicas, err := sc.Replicas(context.Background(), "mymaster").Result()
		return err == nil && len(replicas) > 0
	})
	return s.Addr
}

// TestSentinelFailover: the sidecar finds the master through Sentinel, and
// when the master dies and Sentinel promotes the replica, decisions resume on
// the new master without restarting the sidecar.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	master := redisproc.StartT(t, redisproc.Options{})
	mhost, mport, _ := net.SplitHostPort(master.Addr)
	replica := redisproc.StartT(t, redisproc.Options{Args: []string{"--replicaof", mhost, mport}})
	testkit.Poll(t, 30*time.Second, "the replica to sync", func() bool {
		info, err := replica.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	sentinel := startSentinel(t, master.Addr)

	s := startSidecar(t, "redis+sentinel://"+sentinel+"/mymaster", contractPlans, time.Second)
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
