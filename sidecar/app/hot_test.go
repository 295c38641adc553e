package app

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/syncbuf"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/hot"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/redisconn"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// The hot client's plan and its demand: 600 checks/s, three times the plan,
// split 70/20/10 over three regions.
const (
	hotKey      = "huge-client"
	hotRate     = 200.0
	hotCapacity = 20.0
)

var hotPlans = fmt.Sprintf(`
plans:
  huge: {capacity: %v, rate: %v}
clients:
  %q: {plan: huge, regions: [eu, us, ap]}
`, hotCapacity, hotRate, hotKey)

// regionLoad is one region's offered load: workers each sending perWorker
// checks a second.
type regionLoad struct {
	region  string
	workers int
}

var skewed = []regionLoad{{"eu", 7}, {"us", 2}, {"ap", 1}} // 70/20/10

const perWorker = 60 // checks/s per worker; 10 workers = 600/s

// load drives the skewed demand at a set of sidecars, counts the checks it
// sends to each region, and counts answers while counting is on.
type load struct {
	*pacedLoad
	regionOf []int // each sender's region, an index into skewed
	counting atomic.Bool
	allowed  [3]atomic.Int64
	denied   atomic.Int64
	other    atomic.Int64
	lastErr  atomic.Value
}

func startLoad(t *testing.T, addrs []string) *load {
	t.Helper()
	l := &load{}
	var senders []pacedSender
	for ri, rl := range skewed {
		for range rl.workers {
			senders = append(senders, pacedSender{addrs[len(senders)%len(addrs)], hotKey, rl.region})
			l.regionOf = append(l.regionOf, ri)
		}
	}
	l.pacedLoad = startPaced(t, senders, perWorker, func(i int, _ time.Time, resp *fasthttp.Response, err error) {
		if !l.counting.Load() {
			return
		}
		switch {
		case err != nil:
			l.other.Add(1)
			l.lastErr.Store(err.Error())
		case resp.StatusCode() == 200:
			l.allowed[l.regionOf[i]].Add(1)
		case resp.StatusCode() == 429:
			l.denied.Add(1)
		default:
			l.other.Add(1)
			l.lastErr.Store(fmt.Sprintf("%d %s", resp.StatusCode(), resp.Body()))
		}
	})
	return l
}

// regionSent returns the checks sent so far to each region of skewed.
func (l *load) regionSent() []float64 {
	out := make([]float64, len(skewed))
	for i := range l.sent {
		out[l.regionOf[i]] += float64(l.sent[i].Load())
	}
	return out
}

func (l *load) admitted() int64 {
	return l.allowed[0].Load() + l.allowed[1].Load() + l.allowed[2].Load()
}

// evalshaCalls returns EVALSHA calls so far on each master.
func evalshaCalls(t *testing.T, masters []string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, m := range masters {
		n, err := redisproc.CommandCalls(context.Background(), m, "evalsha")
		if err != nil {
			t.Fatal(err)
		}
		out[m] = n
	}
	return out
}

func startHotSidecar(t *testing.T, url, plansPath string, noSharding bool) *App {
	t.Helper()
	spec, err := redisconn.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	a, err := Start(Config{
		Listen: "127.0.0.1:0", Redis: spec, PlansPath: plansPath,
		// decidesAnyway: a 503 after Redis charged the bucket would hide an
		// admission from the count.
		RedisTimeout:  decidesAnyway,
		NoHotSharding: noSharding,
	}, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
		if t.Failed() {
			t.Logf("sidecar %s log:\n%s", a.Addr(), logs)
		}
	})
	return a
}

func redisNow(t *testing.T, c *redis.ClusterClient) time.Time {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// TestHotClientSharding: a client three times over its plan with demand
// split 70/20/10 over three regions, served by two sidecars on a 3-master
// cluster. Its three region buckets live on three different masters; once
// the shares have settled, the client's global admitted rate is within 5% of
// its plan; and the checks spread over all three masters, where without
// sharding they all go to one.
func TestHotClientSharding(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	ctl := cl.Client(t)
	ctx := context.Background()
	url := "redis+cluster://" + strings.Join(cl.Addrs, ",")
	plansPath := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(plansPath, []byte(hotPlans), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startHotSidecar(t, url, plansPath, false)
	b := startHotSidecar(t, url, plansPath, false)
	masters, err := cl.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}

	base := (&sidecar{}).bucket(hotKey)
	regionKeys := hot.Keys(base, []string{"eu", "us", "ap"})
	owners := map[string]string{}
	for i, k := range regionKeys {
		node, err := ctl.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		addr := node.Options().Addr
		if prev, dup := owners[addr]; dup {
			t.Fatalf("region buckets %s and %s are both on master %s", prev, k, addr)
		}
		owners[addr] = []string{"eu", "us", "ap"}[i]
	}

	l := startLoad(t, []string{a.Addr(), b.Addr()})
	// The shares move toward target_i = f + (1 - 3f) * demand_i / total,
	// f = hot.FloorOf(3) = 0.04/3, for the split of the checks the load has
	// sent: 0.685, 0.205, 0.109 if it sends 70/20/10 as offered (a loaded machine
	// sends some regions' checks late, and so fewer). Each sidecar counts
	// the demand of the workers startLoad deals it (in turn: eu 4 to a and
	// 3 to b, us 1 and 1, ap 0 and 1) and flushes it once an interval at
	// its own phase, so a reconcile may count one sidecar's interval and
	// not the other's, and aim at that sidecar's split alone: up to 0.094
	// from the target (eu, ap), which moves a share by Step of that,
	// 0.047. A share is near its target within that much. Shares moving
	// toward one sidecar's split alone, 0.094 away, pass through that
	// band in at most two reconciles (each halves the distance left, and
	// a band from 0.047 to 0.141 away from where they go spans a factor of
	// 3), so the shares have settled when both sidecars' are near their
	// targets on three reconciles in a row.
	targetOf := func(w []float64) []float64 {
		out := make([]float64, len(w))
		for i := range w {
			out[i] = hot.FloorOf(3) + (1-3*hot.FloorOf(3))*w[i]/(w[0]+w[1]+w[2])
		}
		return out
	}
	var all []float64
	var dealt [2][]float64
	dealt[0], dealt[1] = make([]float64, 3), make([]float64, 3)
	n := 0
	for i, rl := range skewed {
		all = append(all, float64(rl.workers))
		for range rl.workers {
			dealt[n%2][i]++
			n++
		}
	}
	tol := 0.0
	for _, w := range dealt {
		for i, one := range targetOf(w) {
			tol = max(tol, hot.Step*math.Abs(one-targetOf(all)[i]))
		}
	}
	var last, target []float64
	inRow := 0
	settled := func() bool {
		sa, sb := a.hot.Shares(base), b.hot.Shares(base)
		if sa == nil || sb == nil || slices.Equal(sa, last) {
			return false // no new reconcile seen
		}
		last = sa
		target = targetOf(l.regionSent())
		for _, sh := range [][]float64{sa, sb} {
			for i := range sh {
				if math.Abs(sh[i]-target[i]) > tol {
					inRow = 0
					return false
				}
			}
		}
		inRow++
		return inRow == 3
	}
	testkit.Poll(t, 30*time.Second, fmt.Sprintf("the shares to settle within %.3f of the load's split", tol), settled)
	t.Logf("shares settled near %.3f", target)
	t.Logf("settled shares: %v and %v", a.hot.Shares(base), b.hot.Shares(base))

	for i, k := range regionKeys {
		node, _ := ctl.MasterForKey(ctx, k)
		if n, err := node.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("region %d bucket %s not on its master %s: %d %v", i, k, node.Options().Addr, n, err)
		}
	}

	// Window: counted from one Redis TIME reading to the next, the clock the
	// buckets refill by.
	before := evalshaCalls(t, masters)
	t0 := redisNow(t, ctl)
	l.counting.Store(true)
	time.Sleep(5 * time.Second)
	l.counting.Store(false)
	t1 := redisNow(t, ctl)
	after := evalshaCalls(t, masters)
	w := t1.Sub(t0).Seconds()
	admitted := float64(l.admitted())
	// A 503 (the sidecar's 1 s deadline passed, which only a stalled,
	// heavily loaded machine does) may or may not have taken a token: it
	// widens the bound below by one each; more than 1% of checks is a fault.
	unknown := float64(l.other.Load())
	if checks := admitted + float64(l.denied.Load()) + unknown; unknown > 0.01*checks {
		t.Fatalf("%v of %v checks neither allowed nor denied; last: %v", unknown, checks, l.lastErr.Load())
	}
	// Every region asks for about three times its share, so each bucket is
	// never idle and admits at its refill rate: admitted = rate * w, give or
	// take what the buckets held when the window opened (at most the plan's
	// capacity, 20) and the checks in flight at either edge (a few ms of
	// rate, a handful). 5% of rate*w (50 in 5 s) covers both.
	want := hotRate * w
	if admitted > 1.05*want || admitted+unknown < 0.95*want {
		t.Errorf("admitted %v in %.2f s = %.1f/s, want %v/s within 5%%", admitted, w, admitted/w, hotRate)
	}
	t.Logf("admitted %v in %.2f s = %.1f/s (plan %v/s); per region eu/us/ap %d/%d/%d; denied %d; undecided %v",
		admitted, w, admitted/w, hotRate, l.allowed[0].Load(), l.allowed[1].Load(), l.allowed[2].Load(), l.denied.Load(), unknown)

	var total int64
	for _, m := range masters {
		total += after[m] - before[m]
	}
	for _, m := range masters {
		share := float64(after[m]-before[m]) / float64(total)
		// Checks per master follow the demand (70/20/10): the least loaded
		// master takes about 10%; 5% is far from "nothing".
		if share < 0.05 {
			t.Errorf("sharded: master %s (region %s) took %.1f%% of %d EVALSHA calls, want >= 5%%", m, owners[m], 100*share, total)
		}
		t.Logf("sharded: master %s (region %s): %.1f%% of EVALSHA", m, owners[m], 100*share)
	}

	// The same load through a sidecar that does not shard: one bucket, one
	// master.
	l.close()
	c := startHotSidecar(t, url, plansPath, true)
	before = evalshaCalls(t, masters)
	l2 := startLoad(t, []string{c.Addr()})
	l2.counting.Store(true)
	time.Sleep(2 * time.Second)
	l2.close()
	after = evalshaCalls(t, masters)
	total = 0
	busiest := int64(0)
	for _, m := range masters {
		d := after[m] - before[m]
		total += d
		busiest = max(busiest, d)
	}
	// The lease renewals of the two sharding sidecars (a few a second) go
	// to the plain bucket's master too; nothing else runs.
	if float64(busiest) < 0.99*float64(total) {
		t.Errorf("unsharded: busiest master took %d of %d EVALSHA calls, want >= 99%%", busiest, total)
	}
	t.Logf("unsharded: busiest master took %d of %d EVALSHA calls", busiest, total)
}

// TestHotClientFirstCheckWithinDeadline: the first check of a hot client
// of 16 regions, through a sidecar of the shipped deadline (4 ms) that has
// not seen the client, is decided by the shares in force in Redis. Finding
// its 16 bucket keys, N tried one by one for each, took 10 to 25 ms on
// this machine: the check was answered 503, and the ones after it were
// decided at equal shares, a sixteenth of the plan, their region's bucket
// cut to 62.5 tokens where its share held 850.
//
// Each attempt is a client the sidecar has not seen; one whose check is
// answered 503 (this shared machine stalled past the deadline) tells
// nothing, and the next is tried, at most five.
func TestHotClientFirstCheckWithinDeadline(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	regions := make([]string, 16)
	for i := range regions {
		regions[i] = "r" + strconv.Itoa(i)
	}
	const attempts, capacity = 5, 1000.0
	plansYAML := fmt.Sprintf("plans:\n  p: {capacity: %v, rate: 100}\nclients:\n", capacity)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	// r3 has taken the traffic: 0.85 of the plan, the others 0.01 each.
	fields := []any{"_regions", strings.Join(regions, ",")}
	for i, r := range regions {
		fields = append(fields, r, map[bool]string{true: "0.85", false: "0.01"}[i == 3])
	}
	for i := 0; i < attempts; i++ {
		client := fmt.Sprintf("first-check-%d", i)
		plansYAML += fmt.Sprintf("  %s: {plan: p, regions: [%s]}\n", client, strings.Join(regions, ", "))
		if err := rc.HSet(context.Background(), keys.New(nil).BucketKey([]byte(client))+":hot:shares", fields...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := startSidecar(t, srv.URL(), plansYAML, server.DefaultTimeout)
	for i := 0; i < attempts; i++ {
		r := s.check(t, fmt.Sprintf("first-check-%d", i), "x-ratelimit-region", "r3")
		if r.status == 503 {
			t.Logf("attempt %d: 503 %s", i, r.body)
			continue
		}
		if r.status != 200 {
			t.Fatalf("attempt %d: %d %s", i, r.status, r.body)
		}
		// 0.85 of 1000, less the check's token; at equal shares 61.5.
		if tokens := num(t, r, "x-ratelimit-tokens"); math.Abs(tokens-(0.85*capacity-1)) > 1e-6 {
			t.Fatalf("attempt %d: first check left %v tokens, want %v (r3's share in Redis, 0.85)", i, tokens, 0.85*capacity-1)
		}
		return
	}
	t.Fatalf("the first check of each of %d hot clients of 16 regions was answered 503 (deadline %v)", attempts, server.DefaultTimeout)
}
