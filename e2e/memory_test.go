package e2e_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// Redis holds buckets of active clients only: every bucket key carries a
// TTL of the time its bucket takes to fill again (plus 1 s), so once a
// client is idle its key goes and the key count falls to the number of
// clients still sending. Here 1000 clients send once each and one keeps
// sending every 1.5 s (its bucket is full again each time). The plan
// (capacity 2, 1 token/s) gives a TTL of 3 s, after which only the active
// client's key is left, and none once it stops too.
func TestIdleBucketsExpire(t *testing.T) {
	const clients, ttlMs = 1000, 3000
	s := startStack(t, stackConfig{
		plans: "default_plan: small\nplans:\n  small: {capacity: 2, rate: 1}\n",
	})
	ctx := context.Background()
	rc := s.redis.Client(t)
	usedMemory := func() int64 {
		info, err := rc.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(infoValue(info, "used_memory"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	baseline := usedMemory()

	// The active client, until the test says stop.
	const active = "always-active"
	stopActive := make(chan struct{})
	activeDone := make(chan struct{})
	var activeBad atomic.Int64
	go func() {
		defer close(activeDone)
		tick := time.NewTicker(1500 * time.Millisecond)
		defer tick.Stop()
		for {
			if r, err := s.try(0, "GET", "/orders/1", "x-api-key", active); err != nil || r.status != http.StatusOK {
				activeBad.Add(1)
			}
			select {
			case <-stopActive:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stopActive:
		default:
			close(stopActive)
		}
		<-activeDone
	})

	var next atomic.Int64
	var wg sync.WaitGroup
	var bad atomic.Int64
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= clients {
					return
				}
				r, err := s.try(0, "GET", "/orders/1", "x-api-key", "idle-client-"+strconv.FormatInt(i, 10))
				if err != nil || r.status != http.StatusOK {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d of %d clients were not admitted", n, clients)
	}
	// 16 senders as fast as answers come is more than this machine
	// answers within the 5 ms callout; a request that failed open left no
	// bucket, and the rest of the test is about the buckets that were made.
	t.Logf("the filter's decisions: %v", s.decisions())

	// Every bucket has a TTL no longer than the plan's: none is kept
	// forever.
	var seen int
	iter := rc.Scan(ctx, 0, "rl:*", 1000).Iterator()
	for iter.Next(ctx) {
		seen++
		ttl, err := rc.PTTL(ctx, iter.Val()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > ttlMs*time.Millisecond {
			t.Fatalf("bucket %s has TTL %v, want 0 < TTL <= %d ms", iter.Val(), ttl, ttlMs)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	activeMemory := usedMemory()
	t.Logf("%d buckets right after %d clients: used_memory %d KiB (%d KiB before any)", seen, clients, activeMemory>>10, baseline>>10)
	if seen < 2 {
		t.Fatalf("only %d buckets right after %d clients were checked", seen, clients)
	}

	// Idle clients' buckets expire; the active one's stays.
	activeKey := keys.New(nil).BucketKey([]byte(active))
	testkit.Poll(t, ttlMs*time.Millisecond+20*time.Second, "only the active client's bucket is left", func() bool {
		n, err := rc.DBSize(ctx).Result()
		return err == nil && n == 1
	})
	if n, err := rc.Exists(ctx, activeKey).Result(); err != nil || n != 1 {
		t.Fatalf("the one bucket left is not the active client's (%d, %v)", n, err)
	}
	idleMemory := usedMemory()
	t.Logf("1 bucket once the others expired: used_memory %d KiB", idleMemory>>10)
	if idleMemory >= activeMemory {
		t.Errorf("used_memory did not fall when %d buckets expired: %d KiB, %d KiB with them", seen-1, idleMemory>>10, activeMemory>>10)
	}

	close(stopActive)
	<-activeDone
	if n := activeBad.Load(); n != 0 {
		t.Errorf("the active client was refused %d times", n)
	}
	testkit.Poll(t, ttlMs*time.Millisecond+20*time.Second, "no bucket left once every client is idle", func() bool {
		n, err := rc.DBSize(ctx).Result()
		return err == nil && n == 0
	})
}
