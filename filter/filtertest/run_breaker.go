package filtertest

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// The circuit breaker's cases. They never advance the clock past a pending
// callout's timeout: the headless host, like Envoy, would then answer it
// with a timeout.

// breakerConfig opens after 3 failures in a row, for 100 ms first, then
// 200 ms and 400 ms at most. The callout timeout is the default 5 ms, so a
// probe's lease is 105 ms.
const breakerConfig = `{"breaker": {"failures": 3, "min_open_ms": 100, "max_open_ms": 400}}`

var (
	timeoutAnswer     = []Header{{":status", "504"}, {"content-type", "text/plain"}}
	unavailableAnswer = []Header{{":status", "503"}, {"content-type", "text/plain"}}
	resetAnswer       []Header // a callback without headers
)

const circuitOpen = limiter.MetricFailedOpenPrefix + "circuit_open"

// failing sends a request whose callout gets answer, which must let it
// through.
func failing(t *testing.T, h Host, key string, answer []Header) {
	t.Helper()
	s, _ := waiting(t, h, get(key))
	s.RespondCallout(answer, nil)
	wentOn(t, s)
	s.Done()
}

// allowing sends a request the sidecar allows: key's first check
// (firstAllow).
func allowing(t *testing.T, h Host, key string) {
	t.Helper()
	s, _ := waiting(t, h, get(key))
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	s.Done()
}

// undispatched sends a request whose callout the proxy fails to send
// (proxy_http_call fails at once), which must go through at once.
func undispatched(t *testing.T, h Host, key string) Stream {
	t.Helper()
	h.FailNextDispatch()
	s, cont := send(h, get(key))
	if !cont {
		t.Fatal("request waits after a failed dispatch")
	}
	wentOn(t, s)
	return s
}

// bypassed requires a request to go through at once, with no callout: the
// breaker is open.
func bypassed(t *testing.T, h Host, key string) Stream {
	t.Helper()
	s, cont := send(h, get(key))
	if _, ok := s.Callout(); ok {
		t.Fatal("callout made while the breaker is open")
	}
	if !cont {
		t.Fatal("request waits while the breaker is open, want it through at once")
	}
	wentOn(t, s)
	return s
}

// breakerState requires the state gauge (0 closed, 1 open, 2 half-open).
func breakerState(t *testing.T, h Host, want int64) {
	t.Helper()
	if got := metric(t, h, limiter.MetricBreakerState); got != want {
		t.Errorf("%s = %d, want %d", limiter.MetricBreakerState, got, want)
	}
}

// transitions requires the breaker's transition counters.
func transitions(t *testing.T, h Host, opened, reopened, closed int64) {
	t.Helper()
	for _, c := range []struct {
		name string
		want int64
	}{{limiter.MetricBreakerOpened, opened}, {limiter.MetricBreakerReopened, reopened}, {limiter.MetricBreakerClosed, closed}} {
		if got := metric(t, h, c.name); got != c.want {
			t.Errorf("%s = %d, want %d", c.name, got, c.want)
		}
	}
}

// openBreaker makes three callouts in a row time out.
func openBreaker(t *testing.T, h Host) {
	t.Helper()
	for range 3 {
		failing(t, h, "key-1", timeoutAnswer)
	}
}

func (r runner) breakerOpens(t *testing.T) {
	h := r.host(t, breakerConfig)
	breakerState(t, h, 0)
	failing(t, h, "key-1", timeoutAnswer)
	failing(t, h, "key-2", unavailableAnswer)
	transitions(t, h, 0, 0, 0)
	failing(t, h, "key-3", resetAnswer)
	transitions(t, h, 1, 0, 0)
	breakerState(t, h, 1)
	want := "edgelimit: circuit breaker open: 3 callout failures in a row, the last reset; no callouts for 100 ms"
	if !slices.Contains(h.Logs(), want) {
		t.Errorf("logs %q\nwant the line %q", h.Logs(), want)
	}
	// Open for 100 ms: every request goes through at once, uncounted by
	// the sidecar, counted by the filter.
	for range 5 {
		s := bypassed(t, h, "key-1")
		absent(t, s.UpstreamHeaders(), limiter.ShadowHeader)
		absent(t, s.ResponseHeaders([]Header{{":status", "200"}}), rateLimitHeaderNames...)
		s.Done()
		h.Advance(19 * time.Millisecond)
	}
	bypassed(t, h, "key-1") // at 95 ms
	counters(t, h, map[string]int64{
		limiter.MetricFailedOpenPrefix + "timeout":     1,
		limiter.MetricFailedOpenPrefix + "unavailable": 1,
		limiter.MetricFailedOpenPrefix + "reset":       1,
		circuitOpen:                                    6,
	})
	if got := logged(h, "edgelimit: failing open (circuit_open): "); !slices.Equal(got, []string{"edgelimit: failing open (circuit_open): circuit breaker open"}) {
		t.Errorf("circuit_open lines %q, want one (throttled)", got)
	}
	transitions(t, h, 1, 0, 0)
}

func (r runner) breakerDispatchFailures(t *testing.T) {
	h := r.host(t, breakerConfig)
	for range 3 {
		undispatched(t, h, "key-1")
	}
	transitions(t, h, 1, 0, 0)
	// The host would dispatch now; the breaker does not ask it.
	bypassed(t, h, "key-1")
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "dispatch": 3, circuitOpen: 1})
}

func (r runner) breakerProbeCloses(t *testing.T) {
	h := r.host(t, breakerConfig)
	openBreaker(t, h)
	h.Advance(99 * time.Millisecond)
	bypassed(t, h, "key-1")
	h.Advance(time.Millisecond)

	// The first request after the interval is the probe; while it is out,
	// every other request goes through at once.
	probe, _ := waiting(t, h, get("key-2"))
	breakerState(t, h, 2)
	for range 3 {
		bypassed(t, h, "key-3")
	}
	probe.RespondCallout(firstAllow, nil)
	wentOn(t, probe)
	if got := header(t, probe.ResponseHeaders([]Header{{":status", "200"}}), "ratelimit-remaining"); got != "9" {
		t.Errorf("probe's response: ratelimit-remaining %q, want 9", got)
	}
	transitions(t, h, 1, 0, 1)
	breakerState(t, h, 0)
	want := "edgelimit: circuit breaker closed: the sidecar answered after 100 ms"
	if !slices.Contains(h.Logs(), want) {
		t.Errorf("logs %q\nwant the line %q", h.Logs(), want)
	}
	// Closed: callouts again.
	allowing(t, h, "key-3")
	counters(t, h, map[string]int64{
		limiter.MetricFailedOpenPrefix + "timeout": 3,
		circuitOpen:           4,
		limiter.MetricAllowed: 2,
	})
}

func (r runner) breakerProbeReopens(t *testing.T) {
	h := r.host(t, breakerConfig)
	openBreaker(t, h)
	// Each failed probe doubles the interval: 100, 200, 400, then 400
	// (max_open_ms).
	step := func(interval time.Duration, fail func()) {
		t.Helper()
		h.Advance(interval - time.Millisecond)
		bypassed(t, h, "key-1")
		h.Advance(time.Millisecond)
		fail()
	}
	step(100*time.Millisecond, func() { failing(t, h, "key-1", timeoutAnswer) })
	transitions(t, h, 1, 1, 0)
	breakerState(t, h, 1)
	step(200*time.Millisecond, func() { failing(t, h, "key-1", resetAnswer) })
	step(400*time.Millisecond, func() {
		h.FailNextDispatch() // a probe that cannot even be sent
		s, cont := send(h, get("key-1"))
		if !cont {
			t.Fatal("probe whose dispatch failed waits")
		}
		wentOn(t, s)
	})
	transitions(t, h, 1, 3, 0)
	// A 429 is an answer: the sidecar is back. key-2's bucket is empty
	// (other gateways spent it): the token is 1 s away at 1 token/s.
	step(400*time.Millisecond, func() {
		s, _ := waiting(t, h, get("key-2"))
		s.RespondCallout(SidecarAnswer("basic", 10, 1, 0, 1), nil)
		reply(t, s, 429)
	})
	transitions(t, h, 1, 3, 1)
	breakerState(t, h, 0)
	if n := len(logged(h, "edgelimit: circuit breaker open: ")); n != 1 {
		t.Errorf("%d lines for the breaker opening, want 1: reopening is counted, not logged", n)
	}
	if got := logged(h, "edgelimit: circuit breaker closed: "); !slices.Equal(got, []string{
		"edgelimit: circuit breaker closed: the sidecar answered after 1100 ms"}) {
		t.Errorf("closing lines %q, want one after 100+200+400+400 ms", got)
	}
	// Closing starts over from min_open_ms.
	openBreaker(t, h)
	transitions(t, h, 2, 3, 1)
	step(100*time.Millisecond, func() { allowing(t, h, "key-1") })
	transitions(t, h, 2, 3, 2)
	counters(t, h, map[string]int64{
		limiter.MetricFailedOpenPrefix + "timeout":  7,
		limiter.MetricFailedOpenPrefix + "reset":    1,
		limiter.MetricFailedOpenPrefix + "dispatch": 1,
		circuitOpen:           5,
		limiter.MetricDenied:  1,
		limiter.MetricAllowed: 1,
	})
}

// breakerClockSteppedBack: a step back of the proxy's wall clock in the
// middle of a run of failures (an NTP step as an outage begins) neither
// keeps the breaker from opening nor holds it open. The failures after the
// step were sent at times before the run's last counted failure came
// back, on the stepped clock, and used to be taken for its wave: none
// counted until the clock was back there, an hour here, and every request
// waited for its callout's timeout throughout the outage.
func (r runner) breakerClockSteppedBack(t *testing.T) {
	h := r.host(t, breakerConfig)
	failing(t, h, "key-1", timeoutAnswer)
	failing(t, h, "key-2", unavailableAnswer)
	h.StepWall(-time.Hour)
	failing(t, h, "key-3", resetAnswer)
	transitions(t, h, 1, 0, 0)
	breakerState(t, h, 1)
	bypassed(t, h, "key-1")
	// Another step back, while open: the probe still goes out after the
	// interval (100 ms).
	h.StepWall(-time.Hour)
	h.Advance(100 * time.Millisecond)
	allowing(t, h, "key-1")
	transitions(t, h, 1, 0, 1)
	breakerState(t, h, 0)
}

// breakerAnswersAreSuccess: only a timeout, a 503, a reset or a failed
// dispatch counts against the sidecar. Any other answer came back promptly
// and breaks the run of failures.
func (r runner) breakerAnswersAreSuccess(t *testing.T) {
	h := r.host(t, breakerConfig)
	// Each answer is to another client's check, so that the sidecar's 429
	// (an empty bucket, which the deny cache then holds) keeps no later
	// check from being made; the 200 is a client's first check.
	for i, a := range [][]Header{
		SidecarAnswer("basic", 10, 1, 0, 1),
		firstAllow,
		{{":status", "500"}},
		{{":status", "200"}}, // malformed: no rate-limit headers
	} {
		failing(t, h, "key-1", timeoutAnswer)
		failing(t, h, "key-1", unavailableAnswer)
		s, _ := waiting(t, h, get("client-"+strconv.Itoa(i)))
		s.RespondCallout(a, nil)
		s.Done()
	}
	transitions(t, h, 0, 0, 0)
	failing(t, h, "key-1", timeoutAnswer)
	failing(t, h, "key-1", timeoutAnswer)
	failing(t, h, "key-1", resetAnswer)
	transitions(t, h, 1, 0, 0)
	bypassed(t, h, "key-1")
}

// breakerLateAnswers: answers to callouts sent before the breaker opened
// change nothing once it is open.
func (r runner) breakerLateAnswers(t *testing.T) {
	h := r.host(t, breakerConfig)
	var out []Stream
	for range 5 {
		s, _ := waiting(t, h, get("key-1"))
		out = append(out, s)
	}
	for _, s := range out[:4] {
		s.RespondCallout(timeoutAnswer, nil)
	}
	out[4].RespondCallout(firstAllow, nil)
	wentOn(t, out[4])
	transitions(t, h, 1, 0, 0)
	bypassed(t, h, "key-1")
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "timeout": 4, limiter.MetricAllowed: 1, circuitOpen: 1})
}

// breakerBurstStaysClosed: a burst whose callouts time out while the
// sidecar is answering others sent with them (the proxy or the sidecar was
// busy, not gone) leaves the breaker closed, so the burst stays limited;
// callouts that fail after the sidecar's last answer still open it.
func (r runner) breakerBurstStaysClosed(t *testing.T) {
	answers := slices.Repeat([][]Header{timeoutAnswer}, 10)
	answers[0] = firstAllow
	r.sentTogether(t, 2*time.Millisecond, answers, map[string]int64{
		limiter.MetricFailedOpenPrefix + "timeout": 12, limiter.MetricAllowed: 2, circuitOpen: 1,
	})
}

// breakerWaveCountsOnce: callouts sent together that all fail before any
// answer (a sidecar starved by the burst, answering 503 past its Redis
// deadline) are one failure; failures of callouts sent after it add to it.
func (r runner) breakerWaveCountsOnce(t *testing.T) {
	r.sentTogether(t, 3*time.Millisecond, slices.Repeat([][]Header{unavailableAnswer}, 10), map[string]int64{
		limiter.MetricFailedOpenPrefix + "unavailable": 10,
		limiter.MetricFailedOpenPrefix + "timeout":     3, limiter.MetricAllowed: 1, circuitOpen: 1,
	})
}

// sentTogether sends one request of key-1 per answer, all waiting for their
// callouts at once; after elapsed (under the 5 ms timeout) it answers them in
// order. Every request must go on and the breaker stay closed: the next
// request is checked, not bypassed, and its answer ends any run of failures,
// so that it takes three failures in a row after it to open the breaker.
// want is every requests.* counter at the end.
func (r runner) sentTogether(t *testing.T, elapsed time.Duration, answers [][]Header, want map[string]int64) {
	t.Helper()
	h := r.host(t, breakerConfig)
	var together []Stream
	for range answers {
		s, _ := waiting(t, h, get("key-1"))
		together = append(together, s)
	}
	h.Advance(elapsed)
	for i, s := range together {
		s.RespondCallout(answers[i], nil)
		wentOn(t, s)
	}
	transitions(t, h, 0, 0, 0)
	breakerState(t, h, 0)
	allowing(t, h, "key-2")
	failing(t, h, "key-1", timeoutAnswer)
	failing(t, h, "key-1", timeoutAnswer)
	transitions(t, h, 0, 0, 0)
	failing(t, h, "key-1", timeoutAnswer)
	transitions(t, h, 1, 0, 0)
	bypassed(t, h, "key-1")
	counters(t, h, want)
}

// breakerDenyCacheFirst: a client the deny cache holds is still denied
// while the breaker is open; the cache needs no sidecar.
func (r runner) breakerDenyCacheFirst(t *testing.T) {
	h := r.host(t, breakerConfig)
	s, _ := waiting(t, h, get("greedy"))
	s.RespondCallout(SidecarAnswer("basic", 10, 0.2, 0, 1), nil)
	reply(t, s, 429)
	openBreaker(t, h)
	s, _ = send(h, get("greedy"))
	if _, ok := s.Callout(); ok {
		t.Fatal("callout while open")
	}
	reply(t, s, 429)
	bypassed(t, h, "other")
	counters(t, h, map[string]int64{
		limiter.MetricDenied: 1, limiter.MetricDeniedCached: 1,
		limiter.MetricFailedOpenPrefix + "timeout": 3, circuitOpen: 1,
	})
}

func (r runner) breakerShadow(t *testing.T) {
	h := r.host(t, `{"mode": "shadow", "breaker": {"failures": 3, "min_open_ms": 100, "max_open_ms": 400}}`)
	openBreaker(t, h)
	s := bypassed(t, h, "key-1")
	if got := header(t, s.UpstreamHeaders(), limiter.ShadowHeader); got != "unknown" {
		t.Errorf("shadow, breaker open: %s %q, want unknown", limiter.ShadowHeader, got)
	}
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "timeout": 3, circuitOpen: 1})
}

// breakerWorkers: the breaker is shared by every worker VM of the process,
// per sidecar cluster: failures add up across workers, all of them open
// together, and one probe goes out for all.
func (r runner) breakerWorkers(t *testing.T) {
	h := r.host(t, breakerConfig)
	w := worker(t, h, breakerConfig)
	o := worker(t, h, `{"sidecar_cluster": "other", "breaker": {"failures": 3, "min_open_ms": 100, "max_open_ms": 400}}`)
	failing(t, h, "key-1", timeoutAnswer)
	failing(t, w, "key-1", timeoutAnswer)
	failing(t, h, "key-1", timeoutAnswer)
	transitions(t, h, 1, 0, 0)
	bypassed(t, w, "key-1")
	bypassed(t, h, "key-1")
	// Another cluster, another breaker.
	allowing(t, o, "key-1")

	h.Advance(100 * time.Millisecond)
	probe, _ := waiting(t, w, get("key-2"))
	bypassed(t, h, "key-1")
	bypassed(t, w, "key-1")
	probe.RespondCallout(firstAllow, nil)
	wentOn(t, probe)
	allowing(t, h, "key-1")
	transitions(t, h, 1, 0, 1)
	if n := len(logged(h, "edgelimit: circuit breaker closed: ")) + len(logged(w, "edgelimit: circuit breaker closed: ")); n != 1 {
		t.Errorf("%d lines for closing, want 1 from the worker that did", n)
	}
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "timeout": 3, circuitOpen: 4, limiter.MetricAllowed: 3})
}

// breakerLostProbe: a probe whose VM goes away never gets an answer; once
// its lease (timeout + min_open_ms) has run out, another request probes.
func (r runner) breakerLostProbe(t *testing.T) {
	h := r.host(t, breakerConfig)
	w := worker(t, h, breakerConfig)
	openBreaker(t, h)
	h.Advance(100 * time.Millisecond)
	waiting(t, w, get("key-1"))
	w.Close()
	h.Advance(104 * time.Millisecond)
	bypassed(t, h, "key-1")
	h.Advance(time.Millisecond)
	allowing(t, h, "key-1")
	transitions(t, h, 1, 0, 1)
	breakerState(t, h, 0)
}

func (r runner) breakerDisabled(t *testing.T) {
	h := r.host(t, `{"breaker": {"failures": 0}}`)
	for range 20 {
		failing(t, h, "key-1", timeoutAnswer)
	}
	transitions(t, h, 0, 0, 0)
	breakerState(t, h, 0)
	counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + "timeout": 20})
}

// breakerDefault: without a breaker field, 20 failures in a row open it
// for 100 ms.
func (r runner) breakerDefault(t *testing.T) {
	h := r.host(t, "")
	for range limiter.DefaultBreakerFailures - 1 {
		failing(t, h, "key-1", timeoutAnswer)
	}
	transitions(t, h, 0, 0, 0)
	failing(t, h, "key-1", timeoutAnswer)
	transitions(t, h, 1, 0, 0)
	h.Advance(99 * time.Millisecond)
	bypassed(t, h, "key-1")
	h.Advance(time.Millisecond)
	allowing(t, h, "key-1")
	transitions(t, h, 1, 0, 1)
}

// breakerWarmEndsOpen: while the breaker is open, a warm-up call answered
// 200 says the sidecar answers through Redis again, so the open interval
// ends and the next request is the probe, which closes the breaker: not
// the end of an interval that may be max_open_ms long. A call sent before
// the breaker last opened, or answered otherwise, changes nothing; and the
// 200 only brings the probe forward: a sidecar that answers its warm-up
// calls (Redis answers their peek, which writes nothing) but fails its
// checks (Redis refusing their writes: READONLY, OOM, NOPERM) fails the
// probe, and the breaker opens again for twice as long, never closed by a
// warm-up call.
func (r runner) breakerWarmEndsOpen(t *testing.T) {
	h := r.host(t, breakerConfig)
	tick(t, h, time.Second, "after the first round")
	h.RespondRootCallouts(warmOK)
	tick(t, h, 10*time.Second, "after a round answered")
	// This round goes out before the breaker opens, and is answered after.
	h.Advance(time.Millisecond)
	openBreaker(t, h)
	transitions(t, h, 1, 0, 0)
	h.RespondRootCallouts(warmOK)
	bypassed(t, h, "key-1").Done()

	// A round that fails (the sidecar up, Redis not) changes nothing.
	h.Advance(10 * time.Millisecond)
	tick(t, h, time.Second, "after a round answered while the breaker opened")
	h.RespondRootCallouts(unavailableAnswer)
	bypassed(t, h, "key-1").Done()

	// The sidecar answers through Redis again: 21 ms into the 100 ms
	// interval, the next request probes, and its answer closes the
	// breaker.
	h.Advance(10 * time.Millisecond)
	tick(t, h, time.Second, "after a round refused")
	h.RespondRootCallouts(warmOK)
	probe, _ := waiting(t, h, get("key-2"))
	breakerState(t, h, 2)
	// Another request while the probe is out goes through as before.
	bypassed(t, h, "key-3").Done()
	probe.RespondCallout(firstAllow, nil)
	wentOn(t, probe)
	probe.Done()
	transitions(t, h, 1, 0, 1)
	breakerState(t, h, 0)
	if got := logged(h, "edgelimit: circuit breaker closed: "); !slices.Equal(got, []string{
		"edgelimit: circuit breaker closed: the sidecar answered after 20 ms"}) {
		t.Errorf("closing lines %q, want one 20 ms after the breaker opened", got)
	}

	// Redis answers the warm-ups' peeks but refuses every check (503):
	// each 200 brings a probe forward, each probe fails and opens the
	// breaker again, for 200 ms, then 400; it stays open.
	h.RespondRootCallouts(warmOK)
	h.Advance(time.Millisecond)
	for range 3 {
		failing(t, h, "key-1", unavailableAnswer)
	}
	transitions(t, h, 2, 0, 1)
	for i, interval := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond} {
		h.Advance(time.Millisecond)
		h.Tick() // a round, whatever its period
		h.RespondRootCallouts(warmOK)
		failing(t, h, "key-1", unavailableAnswer)
		transitions(t, h, 2, int64(i+1), 1)
		breakerState(t, h, 1)
		bypassed(t, h, "key-1").Done()
		h.Advance(interval - time.Millisecond)
		bypassed(t, h, "key-1").Done()
	}
	// A round sent before the last probe failed changes nothing.
	h.Tick()
	h.Advance(time.Millisecond)
	failing(t, h, "key-1", unavailableAnswer) // the probe at the interval's end
	transitions(t, h, 2, 3, 1)
	h.RespondRootCallouts(warmOK)
	bypassed(t, h, "key-1").Done()
}
