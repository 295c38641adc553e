package e2e_test

import (
	"fmt"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// Key churn: a scanner that tries many keys, each denied on its second
// request, fills the filter's deny cache with entries of a plan that
// refills over an hour. A busy client denied beside them must keep its own
// cached denial: its entry is the one its requests renew every second,
// where the scanner's are never used again. The deny cache used to evict
// the entry that would go stale first, which is the busy client's whenever
// its plan refills faster than the scanner's: its 429s were never kept,
// and every request it sent went to the sidecar (filter/RATIONALE.md, "Why
// the deny cache is correct", storage).
func TestDenyCacheKeepsBusyClientUnderKeyChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 15 s")
	}
	const scanKeys = 2000
	plans := "default_plan: trial\nplans:\n  trial: {capacity: 1, rate: \"1/h\"}\n  steady: {capacity: 5, rate: 1}\n" +
		"clients:\n  busy-client: steady\n"
	s := startStack(t, stackConfig{plans: plans})
	g := s.gateways[0].Addr

	// The scan: each key until it is denied (its second request, or a
	// later one when a check failed open), by the sidecar, and cached
	// until its bucket could hold a token again, an hour later. 2000 keys
	// over the cache's 64 shards of 8 are 31 a shard on average; that the
	// busy client's holds fewer than 8 has a chance under 1e-7.
	c := load.NewClient(10 * time.Second)
	defer c.CloseIdleConnections()
	var mu sync.Mutex
	scanned := map[int]int{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < scanKeys; i += 8 {
				key := fmt.Sprintf("scanner-%04d", i)
				for range 4 {
					st := load.Get(c, g, "/orders/scan", key)
					mu.Lock()
					scanned[st]++
					mu.Unlock()
					if st == http.StatusTooManyRequests {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	d := s.decisions()
	evicted := s.stat("wasmcustom." + limiter.MetricDenyEvicted)
	t.Logf("scan of %d keys, each until denied: %v; %v; %d evicted from the deny cache", scanKeys, scanned, d, evicted)
	if scanned[http.StatusTooManyRequests] < scanKeys*3/4 {
		t.Fatalf("the scan: %v, want most of its %d keys denied", scanned, scanKeys)
	}
	// Each of the sidecar's 429s stored an entry good for an hour, into a
	// cache of 512: each store into a full key evicted one, counted when
	// it was under a second old (how many were depends on the scan's
	// pace), never more than the denials.
	if evicted > d["denied"] {
		t.Errorf("%s = %d after %d denials by the sidecar, want at most that", limiter.MetricDenyEvicted, evicted, d["denied"])
	}

	// The busy client spends its 5 tokens, then sends 100 requests back to
	// back. Its bucket refills 1 token a second and the deny cache asks
	// again about a denied client once a second (limiter.DenyTrust), so
	// over E seconds the sidecar can be asked about at most ⌈E⌉ + 1
	// admissions and ⌈E / trust⌉ + 1 re-asks; every other request is
	// answered from the cache.
	const key = "busy-client"
	for i := 0; ; i++ {
		if r := s.doDecided(0, "GET", "/orders/busy", "x-api-key", key); r.status == http.StatusTooManyRequests {
			break
		}
		if i > 20 {
			t.Fatal("the busy client was not denied after 20 requests on a plan of 5 + 1/s")
		}
	}
	before := s.decisions()
	start := time.Now()
	const sent = 100
	for range sent {
		s.do(0, "GET", "/orders/busy", "x-api-key", key)
	}
	elapsed := time.Since(start)
	d = s.decisions().minus(before)
	asked := d["allowed"] + d["denied"] + d.failedOpen()
	secs := math.Ceil(elapsed.Seconds())
	most := int64(secs+1) + int64(math.Ceil(elapsed.Seconds()/denyTrust.Seconds())+1)
	t.Logf("%d requests in %v: %d asked of the sidecar (at most %d), %d answered from the deny cache; %v", sent, elapsed, asked, most, d["denied_cached"], d)
	if asked > most {
		t.Errorf("the busy client's %d requests in %v: %d went to the sidecar, want at most %d (admissions and re-asks); the rest from its cached denial (%d were)",
			sent, elapsed, asked, most, d["denied_cached"])
	}
}
