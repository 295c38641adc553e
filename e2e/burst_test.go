package e2e_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// The burst scenarios: one client at five times its plan and more, through
// the shipped envoy.yaml (5 ms callout) and the sidecar's defaults (4 ms
// Redis deadline), through one gateway, through three that share one
// sidecar and Redis, through three each with its own sidecar on one Redis
// (as the chart deploys them), and through three whose sidecar is on a
// Redis Cluster, with requests of one cost and, through one gateway and
// through three with their own sidecars, of two (the shipped rules').
// Each run must hold the three promises of the design at once:
//
//   - admissions within 5% of capacity + rate × window, in tokens;
//   - at most 1% of the requests failed open, plus those that waited
//     while the hypervisor stopped a vCPU for long enough to break their
//     budget (stallBudget: none when no vCPU stood still);
//   - the services received exactly the admitted requests.
//
// And the client's view and the filter's counters agree: the 200s that
// came without the limiter's RateLimit header are the requests it counted
// failed open.
//
// Two ways of sending: senders that fire together (a burst of concurrent
// requests every tick), and an open loop (requests evenly spaced, each on
// its own goroutine, whatever the answers). Twenty senders fire together
// through one gateway, ten through three (each with its default two
// workers; a gateway counts only its own callouts on their way, so the
// same burst costs three gateways more callouts: filter/RATIONALE.md,
// "Callouts on their way"; the sidecar, which sees them all, answers most
// of the excess without Redis: sidecar/RATIONALE.md, "Why does the
// sidecar deny some checks without Redis?"). On this shared 2-core
// machine, running Redis, the sidecar, the gateways, the services and the
// load generator at once, failures come in clumps: a stall of a few
// milliseconds somewhere (a collection, the hypervisor running another
// tenant) makes whole bursts miss the 5 ms timeout, which is what the
// allowance for the vCPUs' stalls is for (RATIONALE.md, "Where the
// hypervisor reports no steal": on such a host, 14 of 16 failed-open
// requests came in the 1.6% of bursts during which a vCPU stood still
// for 2.5 ms or more). With steal at 0–1.5%, six runs of twenty senders
// through one gateway failed 0–0.40% open; twenty through three failed
// 0.35%, 1.0% and 1.5% in three runs at 0.06–0.58% steal, and 1.05%, 1.10%
// and 1.75% in three more at 1.1–1.3% steal once the gateway ran at
// niceness 10 (TestGatewayRunsNiced), which is why three gateways get ten.
// `make bench` sweeps the rate and bursts of 10 to 40 up to where the
// promises stop holding, and BENCHMARKS.md reports that limit, with the
// steal of each step (e2e/bench/burst.go).
func TestBurstHoldsTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 90 s")
	}
	// 25 burst + 50/s, offered 250/s (five times the rate) for 10 s: the
	// bucket admits about 25 + 50 × 10 = 525 of 2500. Ten seconds, so
	// that 1% is 25 requests, more than one burst of twenty senders: a
	// single stall of the shared machine that makes a whole burst miss
	// its 5 ms (a fresh stack's first burst, when every process runs its
	// path for the first time; a collection; a scheduling hiccup of a few
	// ms) does not decide a run. At eight seconds one burst was the whole
	// 1%: of 22 runs of one gateway's twenty senders on 2026-12-05, two
	// failed 17 and 21 requests open (the second past the 1%), the rest
	// 0–6, and the same run driven from outside on 20 fresh stacks lost
	// 15 of its first burst's 20 once.
	const capacity, rate = 25, 50
	const window = 10 * time.Second
	plans := fmt.Sprintf("plans:\n  burst: {capacity: %d, rate: %d}\nclients:\n  %q: burst\n", capacity, rate, burstClient)
	// The open loop through three gateways sends each request on a new
	// connection (connection: close), as SDKs that open a connection per
	// request do: the limit is the client's, not its connection's, and a
	// gateway spreads new connections over its workers, whose VMs share
	// the deny cache.
	for _, gateways := range []int{1, 3} {
		for _, senders := range []int{burstSenders[gateways], 0} {
			name := fmt.Sprintf("%d gateways/%d senders together", gateways, senders)
			churn := senders == 0 && gateways == 3
			switch {
			case churn:
				name = fmt.Sprintf("%d gateways/open loop, a connection per request", gateways)
			case senders == 0:
				name = fmt.Sprintf("%d gateways/open loop", gateways)
			}
			t.Run(name, func(t *testing.T) {
				s := startStack(t, stackConfig{plans: plans, gateways: gateways})
				burstHolds(s, load.Burst{Senders: senders, Rate: 5 * rate, Window: window, NewConnections: churn}, capacity, rate)
			})
		}
	}
	// Requests of two costs, from the shipped envoy.yaml's rules: every
	// other one a POST to /orders. A denial the deny cache keeps for a
	// costly request must not hold back a cheap one the bucket can take
	// (filter/RATIONALE.md, "Why the deny cache is correct"), and a check
	// spends its cost in Redis, so the tokens admitted, not the requests,
	// are what the plan bounds.
	t.Run(fmt.Sprintf("1 gateways/%d senders together, two costs", burstSenders[1]), func(t *testing.T) {
		s := startStack(t, stackConfig{plans: plans, gateways: 1})
		burstHolds(s, load.Burst{Senders: burstSenders[1], Rate: 5 * rate, Window: window,
			Methods: []string{"GET", "POST"}}, capacity, rate)
	})
	// The chart deploys a sidecar beside each Envoy (deploy/helm), all on
	// one Redis. Each sidecar's deny cache then sees only its own
	// gateway's checks and none of what the others spent, which matters
	// most for a costly request (sidecar/RATIONALE.md, "Why the deny cache
	// asks Redis when another sidecar may have spent"): three gateways,
	// each with its own sidecar, the shipped rules' two costs, an open
	// loop. Senders together in this topology wake three sidecars per
	// burst, each passing on its own checks to Redis, which on this 2-CPU
	// machine fails more open than the design's 1% in some runs
	// (sidecar/RATIONALE.md, "What a sidecar beside each proxy costs a
	// burst").
	t.Run("3 gateways, a sidecar each/open loop, two costs", func(t *testing.T) {
		s := startStack(t, stackConfig{plans: plans, gateways: 3, sidecars: 3})
		burstHolds(s, load.Burst{Rate: 5 * rate, Window: window, Methods: []string{"GET", "POST"}}, capacity, rate)
	})
	// On a Redis Cluster the sidecar decides through go-redis's cluster
	// pipelines, not its own connection to one server
	// (sidecar/RATIONALE.md), each batch under the same 4 ms deadline: the
	// same promises, through three gateways with their senders together.
	t.Run("Redis Cluster/3 gateways together", func(t *testing.T) {
		s := startStack(t, stackConfig{plans: plans, gateways: 3, redisCluster: true})
		burstHolds(s, load.Burst{Senders: burstSenders[3], Rate: 5 * rate, Window: window}, capacity, rate)
	})
}

// A bucket admits whole tokens. Over a window W a client sending past a
// small plan is admitted capacity + ⌊rate × W⌋ requests of cost 1, not
// capacity + rate × W: for a plan of 1 + 1/s over 5.5 s that is 6, not
// 6.5, and a 5% tolerance around capacity + rate × W, which covers a plan
// of tens of tokens, no longer covers the half token. The exact count is
// what this test asks for. Its windows put rate × W about half-way
// between two whole numbers (5.5 and 2.5 as set, a request's spacing less
// as sent), so that what separates the client's clock from Redis's (the
// first and the last request's trip to Redis, milliseconds; slack below
// lets the window Redis sees be 100 ms shorter or longer) cannot change
// the count: that would take nearly half a token's refill time, 480 ms at
// 1/s.
func TestSmallPlansAdmitWholeTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 15 s")
	}
	const slack = 100 * time.Millisecond
	for _, c := range []struct {
		capacity, rate float64
		window         time.Duration
		gateways       int
	}{
		{1, 1, 5500 * time.Millisecond, 1}, // 1 + ⌊5.5⌋ = 6
		{5, 0.5, 5 * time.Second, 3},       // 5 + ⌊2.5⌋ = 7, through three gateways in turn
	} {
		name := fmt.Sprintf("%g+%g per s over %v, %d gateway(s)", c.capacity, c.rate, c.window, c.gateways)
		t.Run(name, func(t *testing.T) {
			plans := fmt.Sprintf("default_plan: small\nplans:\n  small: {capacity: %g, rate: %g}\n", c.capacity, c.rate)
			s := startStack(t, stackConfig{plans: plans, gateways: c.gateways})
			var targets []string
			for _, g := range s.gateways {
				targets = append(targets, g.Addr)
			}
			// Another client goes first: a stack's first check is each
			// process's first pass over the path (e2e_test.go,
			// TestBurstRetryAfterRefill).
			s.doDecided(0, "GET", "/orders/1", "x-api-key", "warm-up")
			s.decidedRun(t, name, func(run int) error {
				client := fmt.Sprintf("small-plan-%d", run)
				// An open loop of 50 requests a second: a token that
				// comes back is taken within 20 ms, far inside the slack.
				r, err := load.RunBurst(context.Background(), load.Burst{Targets: targets, Client: client,
					Path: "/orders/small", Rate: 50, Window: c.window})
				if err != nil {
					return err
				}
				lo := c.capacity + math.Floor(c.rate*(r.Window-slack).Seconds())
				hi := c.capacity + math.Floor(c.rate*(r.Window+slack).Seconds())
				t.Logf("sent %d over %.3fs: admitted %d, denied %d, other %d; whole tokens allow %.0f..%.0f", r.Sent, r.Window.Seconds(), r.OK, r.Denied, r.Other, lo, hi)
				if r.Other != 0 {
					return fmt.Errorf("%d requests got neither 200 nor 429", r.Other)
				}
				if got := float64(r.OK); got < lo || got > hi {
					return fmt.Errorf("admitted %d over %.3fs, want %.0f..%.0f (capacity + whole tokens refilled)", r.OK, r.Window.Seconds(), lo, hi)
				}
				if got := s.received(client); got != r.OK {
					return fmt.Errorf("services received %d requests, %d were admitted", got, r.OK)
				}
				return nil
			})
		})
	}
}

// A bucket holds at most its capacity, so capacity + ⌊rate × W⌋ is the
// most a window admits, reached only by a client that comes back before
// its bucket is full again. One that waits longer between bursts than the
// bucket takes to fill (capacity / rate after it was emptied) finds it
// full each time, and the refill past the capacity is lost: every burst
// gets the capacity, no more, and no less either, which also shows that
// neither deny cache (the filter's, the sidecar's) holds a client denied
// in one burst past the refill. Here a plan of 3 + 3/s fills in 1 s, and
// twelve senders fire together every 1.5 s through three gateways: 4
// bursts, the last 4.5 s after the first, admit 4 × 3 = 12, where
// capacity + ⌊rate × W⌋ is 16 (an uncapped bucket's count). The
// count is exact as long as no burst takes a third of a second to reach
// Redis (a token's refill) and no tick is half a second late (its gap
// would then be shorter than the fill); a run in which a callout failed
// runs again (decidedRun: Redis may have spent a token on a check the
// sidecar answered 503 at its deadline, which the client then saw as a
// 429 from the deny cache, or as a 200 failed open).
func TestBurstsAfterTheBucketFilledGetItsCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 8 s")
	}
	const capacity, rate, senders, gap = 3.0, 3.0, 12, 1500 * time.Millisecond
	const window = 4 * gap
	if gap.Seconds() <= capacity/rate {
		t.Fatalf("a gap of %v does not let a bucket of %g + %g/s fill", gap, capacity, rate)
	}
	s := startStack(t, stackConfig{plans: fmt.Sprintf("default_plan: p\nplans:\n  p: {capacity: %g, rate: %g}\n", capacity, rate), gateways: 3})
	var targets []string
	for _, g := range s.gateways {
		targets = append(targets, g.Addr)
	}
	// A stack's first check is each process's first pass over the path
	// (TestBurstRetryAfterRefill).
	s.doDecided(0, "GET", "/orders/1", "x-api-key", "warm-up")
	s.decidedRun(t, "bursts after the bucket filled", func(run int) error {
		client := fmt.Sprintf("refilled-%d", run)
		r, err := load.RunBurst(context.Background(), load.Burst{Targets: targets, Client: client,
			Path: "/orders/refilled", Senders: senders, Rate: senders / gap.Seconds(), Window: window})
		if err != nil {
			return err
		}
		bursts := r.Sent / senders
		t.Logf("sent %d in %d bursts over %.2fs: admitted %d, denied %d, other %d, dropped %d", r.Sent, bursts, r.Window.Seconds(), r.OK, r.Denied, r.Other, r.Dropped)
		if r.Other != 0 || r.Dropped != 0 || r.Sent%senders != 0 {
			return fmt.Errorf("%d requests got neither 200 nor 429, %d were not sent; %d sent is not whole bursts of %d", r.Other, r.Dropped, r.Sent, senders)
		}
		if want := bursts * capacity; r.OK != want {
			return fmt.Errorf("admitted %d in %d bursts %v apart, want %d: the capacity at each (capacity + ⌊rate × W⌋ would be %.0f)",
				r.OK, bursts, gap, want, capacity+math.Floor(rate*r.Window.Seconds()))
		}
		if got := s.received(client); got != r.OK {
			return fmt.Errorf("services received %d requests, %d were admitted", got, r.OK)
		}
		return nil
	})
}

// TestNeverCostBurstAnsweredAtTheEdge: a client on a plan of 2 burst +
// 0.5/s sends nothing but envoy.yaml's POST /orders, which costs 5, more
// than its bucket can ever hold: every request is a 429 that can never
// succeed. The filter's deny cache answers them for the second it trusts
// each answer, and asks again once a second per gateway (the plan may have
// been raised since), so that a client sending only what it can never have
// costs the sidecar and Redis about one check a second, as a client past
// its bucket does, instead of one per request (each a callout that could
// fail open and let a request the plan can never admit through to the
// service).
//
// 300 POSTs, an open loop of 100/s for 3 s, through one gateway as shipped.
// The checks the sidecar sees: those sent before the first answer came (a
// request every 10 ms, an answer within the 5 ms timeout: one, or two if
// that one failed), then at most one per second of trust after each
// answer, 1 + 3 in 3 s, and one per callout that failed and left the entry
// as it was (those fail open, and are allowed here the design's 1%):
// under 10 in all. The bound is 30, a tenth of the requests; a filter that
// asks about every such request sends 300.
func TestNeverCostBurstAnsweredAtTheEdge(t *testing.T) {
	const client = "never-client"
	s := startStack(t, stackConfig{plans: "default_plan: tiny\nplans:\n  tiny: {capacity: 2, rate: 0.5}\n"})
	if cost := shippedFilter(t).Cost("POST", "/orders/never"); cost <= 2 {
		t.Fatalf("envoy.yaml's POST /orders costs %d; the test needs a cost above the plan's capacity, 2", cost)
	}
	// Another client goes first: a stack's first check is each process's
	// first pass over the path (e2e_test.go, TestBurstRetryAfterRefill).
	s.doDecided(0, "GET", "/orders/1", "x-api-key", "warm-up")
	before, checksBefore := s.decisions(), s.sidecarAllowed()+s.sidecarDenied()+s.sidecarErrors()
	r, err := load.RunBurst(context.Background(), load.Burst{Targets: []string{s.gateways[0].Addr}, Client: client,
		Path: "/orders/never", Methods: []string{"POST"}, Rate: 100, Window: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d := s.decisions().minus(before)
	checks := s.sidecarAllowed() + s.sidecarDenied() + s.sidecarErrors() - checksBefore
	t.Logf("sent %d: denied %d, admitted %d, other %d; the sidecar checked %d; the filter's counters %v", r.Sent, r.Denied, r.OK, r.Other, checks, d)
	if r.Other != 0 {
		t.Errorf("%d requests got neither 200 nor 429", r.Other)
	}
	// Nothing the plan can never admit is admitted by a decision; a
	// request let through is one that failed open.
	if failedOpen := d.failedOpen(); r.OK != failedOpen || float64(failedOpen) > 0.01*float64(r.Sent) {
		t.Errorf("%d requests admitted, %d of them failed open, want none but those and at most 1%% of %d", r.OK, failedOpen, r.Sent)
	}
	if got := s.received(client); got != r.OK {
		t.Errorf("services received %d requests, %d were admitted", got, r.OK)
	}
	if checks > 30 {
		t.Errorf("the sidecar checked %d of %d requests that can never succeed, want at most 30: the deny cache answers them", checks, r.Sent)
	}
}

// burstSenders is how many senders fire together, by gateway count (see
// the test's comment).
var burstSenders = map[int]int{1: 20, 3: 10}

const burstClient = "burst-client"

// burstHolds sends b through every gateway of s and checks the three
// promises for a plan of capacity and rate.
func burstHolds(s *stack, b load.Burst, capacity, rate float64) {
	t := s.t
	t.Helper()
	before := s.decisions()
	for _, g := range s.gateways {
		b.Targets = append(b.Targets, g.Addr)
	}
	b.Client, b.Path = burstClient, "/orders/burst"
	vcpus, host := watchVCPUs(t), watchHost()
	r, err := load.RunBurst(context.Background(), b)
	vcpus.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := s.decisions().minus(before)
	failedOpen := d.failedOpen()
	budget := stallBudget(vcpus, host, r.Sent, r.Undecided)
	// The tokens the admitted requests cost, by the shipped cost rules;
	// of them, those of requests let through undecided (failed open), the
	// 200s without the filter's RateLimit header. With one cost these are
	// requests.
	filter := shippedFilter(t)
	var tokens, decidedTokens, undecided int64
	for i, m := range r.Methods {
		cost := filter.Cost(m, b.Path)
		tokens += cost * r.OKBy[i]
		decidedTokens += cost * r.Limited[i]
		undecided += r.OKBy[i] - r.Limited[i]
	}
	// Redis sees the first and the last request within the client's
	// window plus one request's latency, a few ms: under one token (20 ms
	// at 50/s) of the 5% (over 26 tokens) allowed. A request that failed
	// open was admitted unlimited. The design's budget for those is in
	// requests (1%), so each is held against the 5% as one token, whatever
	// its cost (with one cost, the admitted requests as they are); past
	// the 1%, those the host's stalls account for (see stallBudget) are
	// not the limiter's.
	want := capacity + rate*r.Window.Seconds()
	excused := budget.excused(failedOpen)
	held := decidedTokens + undecided - excused
	t.Logf("sent %d over %.2fs through %d gateways (methods %v): admitted %d (%v by method; %d tokens, want %.0f ±5%%), denied %d, other %d, failed open %d (%.2f%%; may %d: %s); the filter's counters %v",
		r.Sent, r.Window.Seconds(), len(s.gateways), r.Methods, r.OK, r.OKBy, tokens, want, r.Denied, r.Other, failedOpen, 100*float64(failedOpen)/float64(r.Sent), budget.total(), budget.why, d)
	if r.Other != 0 {
		t.Errorf("%d requests got neither 200 nor 429", r.Other)
	}
	if undecided != failedOpen {
		t.Errorf("%d requests came back 200 without the limiter's RateLimit header; the filter counted %d failed open", undecided, failedOpen)
	}
	if float64(tokens) < 0.95*want || float64(held) > 1.05*want {
		t.Errorf("admitted %d tokens, %d of them by the limiter's decisions, and %d requests undecided (%d of them failed open past the design's 1%%, in the host's stalls), want %.1f within 5%%",
			tokens, decidedTokens, undecided, excused, want)
	}
	if failedOpen > budget.total() {
		t.Errorf("%d of %d requests failed open, more than %d (%s)", failedOpen, r.Sent, budget.total(), budget.why)
	}
	if got := s.received(burstClient); got != r.OK {
		t.Errorf("services received %d requests, %d were admitted", got, r.OK)
	}
}

// build/gateway lowers its threads' priority to niceness 10 by default
// (-nice; RATIONALE.md, "Why does the stand-in gateway run at a lower
// priority?"), so that this stand-in, which spends several times Envoy's
// CPU on a request, does not keep the sidecar and Redis beside it waiting
// for a CPU in bursts such as those above. Every thread counts: Linux
// keeps a niceness per thread, and one left as it started would be a
// worker that still competes.
func TestGatewayRunsNiced(t *testing.T) {
	standInOnly(t, "-nice is the stand-in's own flag")
	s := startStack(t, stackConfig{plans: "default_plan: free\nplans:\n  free: {capacity: 100, rate: 100}\n"})
	// Requests in parallel, so that the runtime has started the threads
	// it serves with, not only those it starts with.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				s.do(0, "GET", "/orders/1", "x-api-key", "niced-client")
			}
		})
	}
	wg.Wait()
	// The gateway starts at this process's niceness; the default lowers
	// it to 10 and never raises it.
	self, err := harness.ThreadNiceness(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	own := self[os.Getpid()]
	want := max(10, own)
	nice, err := harness.ThreadNiceness(s.gateways[0].Pid())
	if err != nil {
		t.Fatal(err)
	}
	if len(nice) < 2 {
		t.Fatalf("the gateway has %d threads: %v", len(nice), nice)
	}
	for tid, n := range nice {
		if n != want {
			t.Errorf("thread %d of the gateway runs at niceness %d, want %d (all: %v)", tid, n, want, nice)
		}
	}
	// The sidecar is not the stand-in: it keeps the priority it was given.
	sc, err := harness.ThreadNiceness(s.sidecars[0].Pid())
	if err != nil {
		t.Fatal(err)
	}
	for tid, n := range sc {
		if n != own {
			t.Errorf("thread %d of the sidecar runs at niceness %d, want this process's %d", tid, n, own)
		}
	}
}

// shippedFilter is envoy/envoy.yaml's filter configuration.
func shippedFilter(t *testing.T) *limiter.Config {
	t.Helper()
	cfg, err := envoyconfig.Load(repoFile(t, "envoy/envoy.yaml"))
	if err != nil {
		t.Fatalf("envoy/envoy.yaml: %v", err)
	}
	filter, err := limiter.Parse([]byte(cfg.Wasm.Configuration))
	if err != nil {
		t.Fatalf("envoy/envoy.yaml's filter configuration: %v", err)
	}
	return filter
}
