package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/sidecar/hot"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// TestClusterMasterDownOthersKeepTheirLimit: one master of a Redis Cluster
// of three, without a replica, is killed, and two clients send through the
// gateway at 10x and 5x their plan, with envoy.yaml and the sidecar as
// shipped and the cluster as sidecar/README.md asks
// (cluster-require-full-coverage no). The first client's bucket lived on
// the lost master: its checks fail at once and its requests go on
// undecided, 200 a second of them. The second's lives on a master that is
// up, and it keeps its limit throughout: the lost master's failures come
// between its answers, so the filter's circuit breaker, which would let
// every client through unlimited, stays closed.
//
// The load runs past the cluster's node timeout (redisproc: 5 s), after
// which the cluster marks the master failed and the sidecar finds no master
// for its slots. With Redis's default (cluster-require-full-coverage yes)
// every master refuses every command from then on: the breaker opens, and
// this test fails with a third of the second client's requests undecided.
func TestClusterMasterDownOthersKeepTheirLimit(t *testing.T) {
	const capacity, rate = 20, 20.0
	s := startStack(t, stackConfig{
		plans:        fmt.Sprintf("default_plan: p\nplans:\n  p: {capacity: %d, rate: %g}\n", capacity, rate),
		redisCluster: true,
	})
	ctx := context.Background()
	masters, err := s.cluster.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters %v (%v), want 3", masters, err)
	}
	owner, err := s.cluster.SlotOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// clientOn is a client whose bucket lives on master m.
	clientOn := func(m, prefix string) string {
		for i := 0; i < 10000; i++ {
			k := fmt.Sprintf("%s-%d", prefix, i)
			if owner[hot.Slot(keys.New(nil).BucketKey([]byte(k)))] == m {
				return k
			}
		}
		t.Fatalf("no client on %s", m)
		return ""
	}
	lost, kept := clientOn(masters[0], "lost"), clientOn(masters[1], "kept")
	if err := s.cluster.Node(masters[0]).Kill(); err != nil {
		t.Fatal(err)
	}
	unavailable := s.stat(counter("failed_open.unavailable"))

	host := watchHost()
	vcpus := watchVCPUs(t)
	var undecided undecidedLog
	var keptOK, keptDenied, other atomic.Int64
	var wg sync.WaitGroup
	// send sends client's requests at perSecond for d, counting the kept
	// client's answers, and returns when its first and last were sent.
	send := func(client string, perSecond int, d time.Duration) (first, last time.Time) {
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		first = time.Now()
		for last = first; time.Since(first) < d; {
			<-tick.C
			last = time.Now()
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent := time.Now()
				r := s.do(0, "GET", "/orders/cluster", "x-api-key", client)
				switch {
				case client != kept:
				case r.status == http.StatusOK:
					keptOK.Add(1)
					if r.header.Get("ratelimit") == "" {
						undecided.add(sent)
					}
				case r.status == http.StatusTooManyRequests:
					keptDenied.Add(1)
				default:
					other.Add(1)
				}
			}()
		}
		return first, last
	}
	const d = 10 * time.Second
	lostSent := make(chan struct{})
	go func() { send(lost, 10*int(rate), d); close(lostSent) }()
	first, last := send(kept, 5*int(rate), d)
	<-lostSent
	wg.Wait()
	vcpus.Close()
	if n := other.Load(); n != 0 {
		t.Fatalf("%d of the kept client's requests got neither 200 nor 429", n)
	}
	if n := s.stat(counter("failed_open.unavailable")) - unavailable; n == 0 {
		t.Fatal("no request failed open unavailable: the kill did not reach the sidecar")
	}
	// The kept client's promise, as in TestOneLimitAcrossGateways: at most
	// 1% of its requests undecided, plus those the host's stalls account
	// for, which are not held against its admissions; and its admissions
	// within 5% of capacity + rate × window, its bucket new at the start.
	sent := keptOK.Load() + keptDenied.Load()
	failedOpen := int64(len(undecided.all()))
	budget := stallBudget(vcpus, host, sent, undecided.all())
	want := capacity + rate*last.Sub(first).Seconds()
	got := float64(keptOK.Load())
	t.Logf("kept client: sent %d, admitted %.0f, want %.1f (±5%%), %d undecided (may %d: %s); the breaker let %d requests through",
		sent, got, want, failedOpen, budget.total(), budget.why, s.stat(counter("failed_open.circuit_open")))
	if failedOpen > budget.total() {
		t.Fatalf("%d of the kept client's %d requests went on undecided, more than %d (%s)", failedOpen, sent, budget.total(), budget.why)
	}
	if excused := budget.excused(failedOpen); got < 0.95*want || got-float64(excused) > 1.05*want {
		t.Fatalf("the kept client was admitted %.0f (%d of them undecided past the design's 1%%, in the host's stalls), want %.1f within 5%%", got, excused, want)
	}
}
