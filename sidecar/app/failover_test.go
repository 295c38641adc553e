package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/sidecar/hot"
)

// failoverPlans admits everything: the test is about whether a decision can
// be made, not about the limit.
const failoverPlans = `
default_plan: wide
plans:
  wide: {capacity: 1000000, rate: 1000000}
`

// slotOwners maps every slot to the address of the master serving it.
func slotOwners(t *testing.T, c *redis.ClusterClient) map[int]string {
	t.Helper()
	slots, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	owners := make(map[int]string, hot.SlotCount)
	for _, s := range slots {
		for slot := s.Start; slot <= s.End; slot++ {
			owners[slot] = s.Nodes[0].Addr
		}
	}
	return owners
}

// clientsPerMaster returns one API key per master whose bucket lives there,
// keyed by the master's address.
func clientsPerMaster(t *testing.T, s *sidecar, owners map[int]string, masters []string) map[string]string {
	t.Helper()
	want := map[string]bool{}
	for _, m := range masters {
		want[m] = true
	}
	out := map[string]string{}
	for i := 0; len(out) < len(masters) && i < 10000; i++ {
		key := fmt.Sprintf("failover-client-%d", i)
		m := owners[hot.Slot(s.bucket(key))]
		if _, done := out[m]; !done && want[m] {
			out[m] = key
		}
	}
	if len(out) != len(masters) {
		t.Fatalf("found clients for %d of %d masters", len(out), len(masters))
	}
	return out
}

// TestClusterFailover kills a master of a 3-master cluster with one replica
// each while one sidecar keeps deciding. Checks whose bucket lives on the
// killed master answer 503 (the gateway fails open) until its replica is
// promoted, then 200 again, with the same sidecar; checks on the other
// masters never fail.
func TestClusterFailover(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 1)
	ctl := cl.Client(t)
	ctx := context.Background()
	// A generous deadline: this is about failover, not latency on a busy
	// machine.
	s := startSidecar(t, "redis+cluster://"+strings.Join(cl.Addrs, ","), failoverPlans, 250*time.Millisecond)
	masters, err := cl.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("masters %v, want 3", masters)
	}
	// With the default (yes), every master refuses every command with
	// CLUSTERDOWN from the moment a master is marked failed until its replica
	// is promoted. A limiter wants the other masters to keep deciding.
	for _, addr := range cl.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		err := node.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
		node.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	owners := slotOwners(t, ctl)
	clients := clientsPerMaster(t, s, owners, masters)

	for m, key := range clients {
		for i := range 20 {
			if r := s.check(t, key); r.status != 200 {
				t.Fatalf("before the failover, %s (on %s) check %d: %d %q", key, m, i, r.status, r.body)
			}
		}
		node := redis.NewClient(&redis.Options{Addr: m})
		n, err := node.Exists(ctx, s.bucket(key)).Result()
		node.Close()
		if err != nil || n != 1 {
			t.Fatalf("bucket of %s not on master %s: exists=%d err=%v", key, m, n, err)
		}
	}

	victim := masters[0]
	victimKey := clients[victim]
	if err := cl.Node(victim).Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed master %s", victim)

	// Sequence of the victim's answers after the kill: 503s while no master
	// serves its slot, then 200s from the promoted replica. The other
	// masters' clients must get 200 throughout.
	var failedOpen, afterResume int
	resumed := false
	promoted := ""
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for afterResume < 200 || promoted == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no failover within 30 s: %d checks failed open, resumed=%v, promoted=%q", failedOpen, resumed, promoted)
		}
		<-tick.C
		for m, key := range clients {
			if m == victim {
				continue
			}
			if r := s.check(t, key); r.status != 200 {
				t.Fatalf("during the failover, %s on the healthy master %s: %d %q", key, m, r.status, r.body)
			}
		}
		r := s.check(t, victimKey)
		switch {
		case r.status == 503 && !resumed:
			failedOpen++
		case r.status == 200:
			resumed = true
			afterResume++
		default:
			t.Fatalf("victim's check after %d failed-open and %d resumed checks: %d %q, want 503 until the failover, then 200",
				failedOpen, afterResume, r.status, r.body)
		}
		if promoted == "" && resumed {
			now, err := cl.Masters(ctx)
			if err == nil && len(now) == 3 && !contains(now, victim) {
				promoted = strings.Join(now, ",")
			}
		}
	}
	if failedOpen == 0 {
		t.Fatal("no check failed open while the master was down: the kill did not reach the sidecar")
	}
	// The promoted replica serves the victim's bucket now.
	owner := slotOwners(t, ctl)[hot.Slot(s.bucket(victimKey))]
	if owner == victim || !contains(strings.Split(promoted, ","), owner) {
		t.Fatalf("slot of %s is served by %s, want a promoted replica among %s", victimKey, owner, promoted)
	}
	if got := s.Stats().RedisErrors.Get() + s.Stats().RedisTimeouts.Get(); got != uint64(failedOpen) {
		t.Errorf("redis errors+timeouts = %d, want the %d checks that failed open", got, failedOpen)
	}
	t.Logf("%d checks failed open during the failover; masters now %s", failedOpen, promoted)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
