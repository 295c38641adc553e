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
func slotOwners(t *testing.T, cl *redisproc.Cluster) map[int]string {
	t.Helper()
	owners, err := cl.SlotOwners(context.Background())
	if err != nil {
		t.Fatal(err)
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
// each while one sidecar keeps deciding, with the shipped deadline
// (-redis-timeout): a failover must not make the other masters' clients
// miss it. Checks whose bucket lives on the killed master answer 503 (the
// gateway fails open) until its replica is promoted, then 200 again, with
// the same sidecar; checks on the other masters are decided throughout.
//
// Any check may still miss the 4 ms when a shared 2-core VM stands still
// (RATIONALE.md, "Where the hypervisor reports no steal"): it is answered
// 503 "redis timeout" and the gateway fails open, which the design allows
// for 1% of the requests. So outside the victim's outage a check must be
// decided or answered that, and those answers stay within 1% of the
// checks; any other answer fails the test at once.
func TestClusterFailover(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 1)
	ctx := context.Background()
	s := startSidecar(t, "redis+cluster://"+strings.Join(cl.Addrs, ","), failoverPlans, 0)
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
	if err := cl.RequireFullCoverage(ctx, false); err != nil {
		t.Fatal(err)
	}
	owners := slotOwners(t, cl)
	clients := clientsPerMaster(t, s, owners, masters)

	// decided sends a check that must be decided, and counts the ones that
	// missed the deadline instead.
	var checks, late int
	decided := func(when, key, master string) {
		t.Helper()
		r := s.check(t, key)
		checks++
		switch {
		case r.status == 200:
		case r.status == 503 && r.body == "redis timeout\n":
			late++
		default:
			t.Fatalf("%s, %s (on %s): %d %q, want 200, or 503 \"redis timeout\" if the machine stood still", when, key, master, r.status, r.body)
		}
	}
	for m, key := range clients {
		for range 20 {
			decided("before the failover", key, m)
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
	// masters' clients must be decided throughout.
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
			if m != victim {
				decided("during the failover, on a healthy master", key, m)
			}
		}
		if resumed {
			decided("after the failover", victimKey, victim)
			afterResume++
		} else if r := s.check(t, victimKey); r.status == 200 {
			resumed = true
			afterResume++
		} else if r.status == 503 {
			failedOpen++
		} else {
			t.Fatalf("victim's check after %d failed-open checks: %d %q, want 503 until the failover, then 200", failedOpen, r.status, r.body)
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
	// The design's budget for requests failed open: 1%.
	if late*100 > checks {
		t.Errorf("%d of %d checks outside the victim's outage missed the deadline, over 1%%", late, checks)
	}
	// The promoted replica serves the victim's bucket now.
	owner := slotOwners(t, cl)[hot.Slot(s.bucket(victimKey))]
	if owner == victim || !contains(strings.Split(promoted, ","), owner) {
		t.Fatalf("slot of %s is served by %s, want a promoted replica among %s", victimKey, owner, promoted)
	}
	if got := s.Stats().RedisErrors.Get() + s.Stats().RedisTimeouts.Get(); got != uint64(failedOpen+late) {
		t.Errorf("redis errors+timeouts = %d, want the %d checks that failed open and the %d that missed the deadline", got, failedOpen, late)
	}
	t.Logf("%d checks failed open during the failover; %d of %d others missed the deadline; masters now %s", failedOpen, late, checks, promoted)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
