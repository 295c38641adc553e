package filtertest

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// The cases of warm_connections: each root context's first tick, which
// comes at once after configuration, and every tick after make that many
// calls to the sidecar's POST /v1/warm at once, so that the proxy opens its
// connections to the sidecar before the traffic needs them. The ticks come
// every 10 s once a round went well, every second until then. The answers
// are nobody's decision.

// warmCalls requires want warm-up calls pending on h, each to cluster with
// :authority authority.
func warmCalls(t *testing.T, h Host, want int, cluster, authority string) {
	t.Helper()
	calls := h.RootCallouts()
	if len(calls) != want {
		t.Fatalf("%d calls from the root context, want %d", len(calls), want)
	}
	wantHeaders := []Header{{":method", "POST"}, {":path", "/v1/warm"}, {":authority", authority}}
	var first string // the round's x-ratelimit-sent
	for i, c := range calls {
		// The proxy's clock at the send, as a check carries it: the
		// sidecar learns from each round how quick the way from this proxy
		// is. The host's clock stands still during the round.
		n := len(c.Headers)
		if c.Cluster != cluster || n != len(wantHeaders)+1 || !slices.Equal(c.Headers[:n-1], wantHeaders) ||
			c.Headers[n-1][0] != "x-ratelimit-sent" || len(c.Body) != 0 || c.TimeoutMs != 500 {
			t.Fatalf("warm-up call %+v, want POST /v1/warm to %s with :authority %s and x-ratelimit-sent, no body, timeout 500 ms", c, cluster, authority)
		}
		sent := c.Headers[n-1][1]
		if i == 0 {
			first = sent
		}
		if us, err := strconv.ParseInt(sent, 10, 64); err != nil || us < 1e15 || sent != first {
			t.Fatalf("warm-up call's x-ratelimit-sent %q, want the clock in microseconds since 1970, the same in every call of the round", sent)
		}
	}
}

// tickEvery requires the root context's tick period to be want.
func tickEvery(t *testing.T, h Host, want time.Duration, when string) {
	t.Helper()
	if got := h.TickPeriod(); got != want {
		t.Errorf("%s: tick period %v, want %v", when, got, want)
	}
}

// tick runs the root context's tick and requires the period it leaves.
func tick(t *testing.T, h Host, want time.Duration, when string) {
	t.Helper()
	h.Tick()
	tickEvery(t, h, want, when)
}

// warmOK is the sidecar's answer to a warm-up call.
var warmOK = WarmAnswer()

func (r runner) warmConnections(t *testing.T) {
	const n = limiter.DefaultWarmConnections
	h := r.host(t, "")
	warmDefault := func(want int) {
		t.Helper()
		warmCalls(t, h, want, "ratelimit_sidecar", "ratelimit-sidecar")
	}
	if got := len(h.RootCallouts()); got != 0 {
		t.Fatalf("%d calls before the first tick, want none", got)
	}
	tickEvery(t, h, time.Millisecond, "after configuration (the warm-up goes out at once)")
	tick(t, h, time.Second, "after the first round, its outcome unknown")
	warmDefault(n)

	// Answers that would each be a failure for a check (timeouts, then
	// resets): none fails a request open, counts, or opens the breaker
	// (20 failures by default); the rounds come every second.
	h.RespondRootCallouts(timeoutAnswer)
	tick(t, h, time.Second, "after a round of timeouts")
	warmDefault(n)
	h.RespondRootCallouts(nil)
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricAllowed: 1})
	if got := metric(t, h, limiter.MetricBreakerOpened); got != 0 {
		t.Errorf("breaker opened %d times, want 0", got)
	}
	if got := metric(t, h, limiter.MetricCalloutLatency); got != 1 {
		t.Errorf("callout latency samples %d, want 1: the check's alone", got)
	}
	tick(t, h, time.Second, "after a round of resets")

	// A round answered 200 throughout: every 10 s from then on.
	h.RespondRootCallouts(warmOK)
	tick(t, h, 10*time.Second, "after a round answered")
	h.RespondRootCallouts(warmOK)
	tick(t, h, 10*time.Second, "after another")

	// A round with calls still unanswered at the next tick went wrong: a
	// second until the round after it. Its late answers change nothing.
	tick(t, h, time.Second, "after a round left unanswered")
	if got := len(h.RootCallouts()); got != 2*n {
		t.Fatalf("%d calls pending, want two rounds' %d", got, 2*n)
	}
	h.RespondRootCallouts(warmOK)
	tick(t, h, 10*time.Second, "after the next round answered")
	h.RespondRootCallouts(warmOK)

	// A call the proxy refuses ends the round, and the next comes a
	// second later.
	h.FailNextDispatch()
	tick(t, h, time.Second, "after a refused call")
	warmCalls(t, h, 0, "", "")
	tick(t, h, time.Second, "after the round that followed it")
	warmDefault(n)
	h.RespondRootCallouts(warmOK)
	tick(t, h, 10*time.Second, "once answered")
	h.RespondRootCallouts(warmOK)

	// The configured number, to the configured cluster and authority.
	full := r.host(t, ValidConfig("full.json"))
	full.Tick()
	warmCalls(t, full, 4, "edge_ratelimit", "ratelimit.internal:8080")
	full.RespondRootCallouts(warmOK)
}

// warmConnectionsNone: no warm-up with warm_connections 0, nor in mode off,
// which makes no callout at all; the ticks come every 10 s.
func (r runner) warmConnectionsNone(t *testing.T) {
	for _, config := range []string{"warm-connections-off.json", "off.json"} {
		h := r.host(t, ValidConfig(config))
		h.Tick()
		h.Tick()
		if n := len(h.RootCallouts()); n != 0 {
			t.Errorf("%s: %d warm-up calls, want none", config, n)
		}
		tickEvery(t, h, 10*time.Second, config)
	}
}

// warmAfterOutage: a sidecar that restarts closes every connection the
// proxy had open to it, and the next 10 s round could be up to 10 s after
// its return. A failure the breaker counts brings the rounds back to every
// second, until one goes well, and the breaker closing (the sidecar
// answers again) sends one at once; so does, on another worker, the first
// answer after it let requests through on the open breaker. A failure that
// does not count (the sidecar answered since the callout left) changes
// nothing.
func (r runner) warmAfterOutage(t *testing.T) {
	const n = limiter.DefaultWarmConnections
	h := r.host(t, breakerConfig)
	w := worker(t, h, breakerConfig)
	for _, vm := range []Host{h, w} {
		tick(t, vm, time.Second, "after the first round, its outcome unknown")
		vm.RespondRootCallouts(warmOK)
		tick(t, vm, 10*time.Second, "after a round answered")
		vm.RespondRootCallouts(warmOK)
	}

	// A callout that failed after the sidecar had answered a later one:
	// late in a burst, not gone.
	late, _ := waiting(t, h, get("key-1"))
	h.Advance(time.Millisecond)
	allowing(t, h, "key-2")
	late.RespondCallout(timeoutAnswer, nil)
	wentOn(t, late)
	late.Done()
	tickEvery(t, h, 10*time.Second, "after a failure the breaker does not count")

	// The sidecar gone: the first failure that counts brings the next
	// round within a second, and rounds that fail keep coming every
	// second.
	failing(t, h, "key-1", unavailableAnswer)
	tickEvery(t, h, time.Second, "after a failure the breaker counts")
	failing(t, h, "key-1", unavailableAnswer)
	failing(t, h, "key-1", unavailableAnswer)
	transitions(t, h, 1, 0, 0)
	tick(t, h, time.Second, "after the round the failures brought forward")
	warmCalls(t, h, n, "ratelimit_sidecar", "ratelimit-sidecar")
	h.RespondRootCallouts(unavailableAnswer)
	tick(t, h, time.Second, "after a round refused by the sidecar still gone")
	warmCalls(t, h, n, "ratelimit_sidecar", "ratelimit-sidecar")

	// The other worker only let requests through on the open breaker: no
	// answer, no failure of its own, and its rounds stay 10 s apart.
	bypassed(t, w, "key-1").Done()
	tickEvery(t, w, 10*time.Second, "worker: while the breaker is open")

	// Back: the probe's answer closes the breaker and a round goes out at
	// once, then every 10 s again once answered.
	h.Advance(100 * time.Millisecond)
	allowing(t, h, "key-3")
	transitions(t, h, 1, 0, 1)
	tickEvery(t, h, time.Millisecond, "after the breaker closed")
	// The other worker's first answer after the outage sends its round.
	allowing(t, w, "key-4")
	tickEvery(t, w, time.Millisecond, "worker: after its first answer since the outage")
	tick(t, w, time.Second, "worker: after the round its first answer sent")
	warmCalls(t, w, n, "ratelimit_sidecar", "ratelimit-sidecar")
	w.RespondRootCallouts(warmOK)
	tick(t, w, 10*time.Second, "worker: once that round was answered")
	w.RespondRootCallouts(warmOK)
	allowing(t, w, "key-5")
	tickEvery(t, w, 10*time.Second, "worker: answers after the first change nothing")
	tick(t, h, time.Second, "after the round sent as the breaker closed")
	if got := len(h.RootCallouts()); got != 2*n {
		t.Fatalf("%d calls pending, want the unanswered round's and the new one's, %d", got, 2*n)
	}
	h.RespondRootCallouts(warmOK)
	tick(t, h, 10*time.Second, "once the round after the outage was answered")
	h.RespondRootCallouts(warmOK)

	// A check the proxy cannot even send counts as well, and its failure
	// is met in the stream's own callback: the proxy sets the root
	// context's tick period from there too, as Envoy does.
	undispatched(t, h, "key-6").Done()
	tickEvery(t, h, time.Second, "after a check that could not be sent")
}
