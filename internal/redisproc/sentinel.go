package redisproc

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// StartSentinelT runs one redis-server in sentinel mode on a free loopback
// port, monitoring master as "mymaster" with quorum 1 and a short
// down-after, and returns its address once it sees the master and a
// replica. It is stopped at cleanup.
func StartSentinelT(t testing.TB, master string) string {
	t.Helper()
	mhost, mport, _ := net.SplitHostPort(master)
	s := StartT(t, Options{Sentinel: []string{
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

// StartSentinelPairT runs a master, its replica (synced) and a sentinel
// watching them (StartSentinelT), and returns the three.
func StartSentinelPairT(t testing.TB) (master, replica *Server, sentinel string) {
	t.Helper()
	// Each sends its first sync at once, not after Redis's default 5 s
	// wait for more replicas; the replica syncs from the master, and from
	// the replica once that is promoted.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	master = StartT(t, Options{Args: noDelay})
	mhost, mport, _ := net.SplitHostPort(master.Addr)
	replica = StartT(t, Options{Args: append(noDelay, "--replicaof", mhost, mport)})
	testkit.Poll(t, 30*time.Second, "the replica to sync", func() bool {
		info, err := replica.Client(t).Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	return master, replica, StartSentinelT(t, master.Addr)
}
