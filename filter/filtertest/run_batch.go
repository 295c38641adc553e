package filtertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// oneByOne sends every request in a callout of its own (max_batch 1), for
// cases about several callouts of one client on their way from one VM.
const oneByOne = `{"max_batch": 1}`

// queued sends headers and requires the request to wait without a callout
// of its own: it is queued behind its client's callout on its way.
func queued(t *testing.T, h Host, headers []Header) Stream {
	t.Helper()
	s, cont := send(h, headers)
	if cont {
		t.Fatalf("request %q went on, want it queued behind its client's callout", headers)
	}
	if r, ok := s.LocalReply(); ok {
		t.Fatalf("request %q answered %d by the filter, want it queued", headers, r.Status)
	}
	if c, ok := s.Callout(); ok {
		t.Fatalf("request %q made a callout %q, want it queued behind its client's", headers, c.Headers)
	}
	return s
}

// batchCallout requires s to have sent the callout of a batch of n (a
// batch of one is a plain check, without x-ratelimit-count).
func batchCallout(t *testing.T, s Stream, n int) Callout {
	t.Helper()
	c, ok := s.Callout()
	if !ok {
		t.Fatalf("no callout for the batch of %d", n)
	}
	got, ok := Get(c.Headers, "x-ratelimit-count")
	switch {
	case n == 1 && ok:
		t.Errorf("callout of one request with x-ratelimit-count %q", got)
	case n > 1 && got != strconv.Itoa(n):
		t.Errorf("batch callout x-ratelimit-count %q, want %d; headers %q", got, n, c.Headers)
	}
	return c
}

// still requires the streams to be waiting: not gone on, not answered, no
// callout of their own.
func still(t *testing.T, ss ...Stream) {
	t.Helper()
	for i, s := range ss {
		if s.Continued() {
			t.Errorf("request %d went on, want it waiting", i)
		}
		if r, ok := s.LocalReply(); ok {
			t.Errorf("request %d answered %d, want it waiting", i, r.Status)
		}
		if _, ok := s.Callout(); ok {
			t.Errorf("request %d has a callout of its own, want it waiting in a batch", i)
		}
	}
}

// batchOneCallout: a client's requests that come while its callout is on
// its way wait for it, then go out together in one callout with
// x-ratelimit-count, sent by the oldest with what is left of its timeout.
// The first of them the bucket can pay (x-ratelimit-admitted) go on, in the
// order they came; the rest are denied. Another client's request is not
// held back.
func (r runner) batchOneCallout(t *testing.T) {
	h := r.host(t, "")
	first, c := waiting(t, h, get("key-1"))
	if v, ok := Get(c.Headers, "x-ratelimit-count"); ok {
		t.Errorf("a lone request's callout carries x-ratelimit-count %q", v)
	}
	var q []Stream
	for range 4 {
		q = append(q, queued(t, h, get("key-1")))
	}
	other, _ := waiting(t, h, get("key-2"))
	other.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
	wentOn(t, other)

	// 1.5 ms on, the bucket held 3 tokens (10-token plan, 1 token/s):
	// first takes one.
	h.Advance(1500 * time.Microsecond)
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 3, 1), nil)
	wentOn(t, first)
	c = batchCallout(t, q[0], 4)
	// The oldest waited 1.5 ms of its 5: 4 whole ms are left.
	if c.TimeoutMs != 4 {
		t.Errorf("batch callout timeout %d ms, want 4 (5 less the whole ms waited)", c.TimeoutMs)
	}
	for _, name := range []string{":method", ":path", "x-api-key", "x-ratelimit-cost"} {
		if header(t, c.Headers, name) == "" {
			t.Errorf("batch callout without %s", name)
		}
	}
	still(t, q[1:]...)

	// 2 tokens left: the two that came first go on, the other two are
	// denied and told to come back when the next token is.
	q[0].RespondCallout(SidecarBatchAnswer("basic", 10, 1, 2, 1, 4), nil)
	for _, s := range q[:2] {
		wentOn(t, s)
		resp := s.ResponseHeaders([]Header{{":status", "200"}})
		if got := header(t, resp, "ratelimit"); got != `"basic";r=0;t=1` {
			t.Errorf("admitted member: ratelimit %q, want the bucket after the batch", got)
		}
	}
	for _, s := range q[2:] {
		denial(t, s, `"basic";q=10;w=10;edgelimit-rate="1"`, `"basic";r=0;t=1`, "10", "1")
	}
	counters(t, h, map[string]int64{limiter.MetricAllowed: 4, limiter.MetricDenied: 2})
	if n := metric(t, h, limiter.MetricBatched); n != 3 {
		t.Errorf("%s = %d, want 3 (four requests in one callout)", limiter.MetricBatched, n)
	}
}

// batchAllAdmitted: a batch the bucket pays in full is a 200; the next
// request of the client, with no callout on its way, goes out alone.
func (r runner) batchAllAdmitted(t *testing.T) {
	h := r.host(t, "")
	first, _ := waiting(t, h, get("key-1"))
	a, b := queued(t, h, get("key-1")), queued(t, h, get("key-1"))
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
	batchCallout(t, a, 2)
	still(t, b)
	a.RespondCallout(SidecarBatchAnswer("basic", 10, 1, 9, 1, 2), nil)
	wentOn(t, a)
	wentOn(t, b)
	_, c := waiting(t, h, get("key-1"))
	if v, ok := Get(c.Headers, "x-ratelimit-count"); ok {
		t.Errorf("a lone request's callout carries x-ratelimit-count %q", v)
	}
	counters(t, h, map[string]int64{limiter.MetricAllowed: 3})
}

// batchDenyCacheFirst: when the answer the requests waited for is a denial,
// the deny cache answers them at once: no batch goes out for a client
// known to be past its bucket.
func (r runner) batchDenyCacheFirst(t *testing.T) {
	h := r.host(t, "")
	first, _ := waiting(t, h, get("key-1"))
	q := []Stream{queued(t, h, get("key-1")), queued(t, h, get("key-1"))}
	// Half a token left at 1 token/s: half a second before another.
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 0.5, 1), nil)
	reply(t, first, 429)
	for _, s := range q {
		if _, ok := s.Callout(); ok {
			t.Fatal("a batch went out for a client the deny cache holds")
		}
		reply(t, s, 429)
	}
	counters(t, h, map[string]int64{limiter.MetricDenied: 1, limiter.MetricDeniedCached: 2})
}

// batchSharedFailure: when the callout the requests waited for fails, they
// share its failure, through the deny cache first, and none asks again;
// the breaker counts one failure.
func (r runner) batchSharedFailure(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer []Header
		reason string
	}{
		{"timeout", timeoutAnswer, "timeout"},
		{"unavailable", unavailableAnswer, "unavailable"},
		{"reset", resetAnswer, "reset"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := r.host(t, breakerConfig)
			first, _ := waiting(t, h, get("key-1"))
			q := []Stream{queued(t, h, get("key-1")), queued(t, h, get("key-1")), queued(t, h, get("key-1"))}
			h.Advance(4 * time.Millisecond) // within the 5 ms timeout
			first.RespondCallout(c.answer, nil)
			wentOn(t, first)
			for _, s := range q {
				if _, ok := s.Callout(); ok {
					t.Fatal("a batch went out after the callout it waited for failed")
				}
				wentOn(t, s)
			}
			counters(t, h, map[string]int64{limiter.MetricFailedOpenPrefix + c.reason: 4})
			// One failure of three: two more open the breaker.
			failing(t, h, "key-2", timeoutAnswer)
			transitions(t, h, 0, 0, 0)
			failing(t, h, "key-2", timeoutAnswer)
			transitions(t, h, 1, 0, 0)
		})
	}
	// With an entry that denies, the shared failure is a cached denial.
	h := r.host(t, "")
	s, _ := waiting(t, h, get("key-1"))
	s.RespondCallout(SidecarAnswer("basic", 10, 1, 1, 1), nil) // 1 token, now 0
	wentOn(t, s)
	first, _ := waiting(t, h, get("key-1"))
	a := queued(t, h, get("key-1"))
	// Another worker's answer says the bucket is empty.
	w := worker(t, h, "")
	o, _ := waiting(t, w, get("key-1"))
	o.RespondCallout(SidecarAnswer("basic", 10, 1, 0, 1), nil)
	reply(t, o, 429)
	first.RespondCallout(timeoutAnswer, nil)
	reply(t, first, 429)
	reply(t, a, 429)
	if n := metric(t, h, limiter.MetricFailedCached); n != 2 {
		t.Errorf("%s = %d, want 2", limiter.MetricFailedCached, n)
	}
}

// batchGone: requests that end while they wait are dropped from the batch
// (a queued one before it goes out, a member after) and the answer is
// applied to the rest; the first request's answer still sends those queued
// behind it when that request has gone.
func (r runner) batchGone(t *testing.T) {
	h := r.host(t, "")
	first, _ := waiting(t, h, get("key-1"))
	q := []Stream{queued(t, h, get("key-1")), queued(t, h, get("key-1")), queued(t, h, get("key-1")), queued(t, h, get("key-1"))}
	first.Done()
	q[1].Done()
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
	batchCallout(t, q[0], 3) // q[0], q[2], q[3]
	q[2].Done()
	q[0].RespondCallout(SidecarBatchAnswer("basic", 10, 1, 9, 1, 3), nil)
	wentOn(t, q[0])
	wentOn(t, q[3])
	// A batch whose oldest has gone: the answer still decides the rest.
	lead, _ := waiting(t, h, get("key-2"))
	b := queued(t, h, get("key-2"))
	lead.Done()
	lead.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
	c := queued(t, h, get("key-2")) // behind b's batch of one
	b.RespondCallout(SidecarAnswer("basic", 10, 1, 9, 1), nil)
	wentOn(t, b)
	batchCallout(t, c, 1)
}

// batchMalformed: an answer to a batch must say how many it admitted, at
// most the batch, all of it exactly when the status is 200; otherwise every
// request of the batch fails open as malformed.
func (r runner) batchMalformed(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer []Header
	}{
		{"no admitted", SidecarAnswer("basic", 10, 1, 10, 1)},
		{"more than the batch", withHeader(SidecarBatchAnswer("basic", 10, 1, 10, 1, 2), "x-ratelimit-admitted", "3")},
		{"200 with fewer", withHeader(SidecarBatchAnswer("basic", 10, 1, 10, 1, 2), "x-ratelimit-admitted", "1")},
		{"429 with all", withHeader(SidecarBatchAnswer("basic", 10, 1, 1, 1, 2), "x-ratelimit-admitted", "2")},
		{"not a count", withHeader(SidecarBatchAnswer("basic", 10, 1, 10, 1, 2), "x-ratelimit-admitted", "-1")},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := r.host(t, "")
			first, _ := waiting(t, h, get("key-1"))
			a, b := queued(t, h, get("key-1")), queued(t, h, get("key-1"))
			first.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
			batchCallout(t, a, 2)
			a.RespondCallout(c.answer, nil)
			wentOn(t, a)
			wentOn(t, b)
			counters(t, h, map[string]int64{limiter.MetricAllowed: 1, limiter.MetricFailedOpenPrefix + "malformed": 2})
		})
	}
}

// withHeader returns headers with name's value replaced.
func withHeader(headers []Header, name, value string) []Header {
	out := make([]Header, 0, len(headers))
	for _, h := range headers {
		if h[0] != name {
			out = append(out, h)
		}
	}
	return append(out, Header{name, value})
}

// batchLimits: a batch holds at most max_batch requests, and only requests
// of the same cost; the rest send callouts of their own. max_batch 1
// sends every request alone.
func (r runner) batchLimits(t *testing.T) {
	h := r.host(t, `{"max_batch": 2, "costs": [{"path_prefix": "/c2", "cost": 2}]}`)
	first, _ := waiting(t, h, get("key-1"))
	a, b := queued(t, h, get("key-1")), queued(t, h, get("key-1"))
	third, _ := waiting(t, h, get("key-1")) // the queue is full
	twice, c := waiting(t, h, request("GET", "/c2", "key-1"))
	if got := header(t, c.Headers, "x-ratelimit-cost"); got != "2" {
		t.Errorf("cost %q", got)
	}
	d := queued(t, h, get("key-1")) // behind third
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
	batchCallout(t, a, 2)
	still(t, b)
	third.RespondCallout(SidecarAnswer("basic", 10, 1, 9, 1), nil)
	batchCallout(t, d, 1)
	twice.RespondCallout(SidecarAnswer("basic", 10, 1, 8, 2), nil)
	wentOn(t, twice)

	h = r.host(t, oneByOne)
	for range 3 {
		waiting(t, h, get("key-1"))
	}
}

// batchShadow: in shadow, a batch's requests go on marked as the sidecar
// would have decided each.
func (r runner) batchShadow(t *testing.T) {
	h := r.host(t, `{"mode": "shadow"}`)
	first, _ := waiting(t, h, get("key-1"))
	a, b := queued(t, h, get("key-1")), queued(t, h, get("key-1"))
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 2, 1), nil)
	a.RespondCallout(SidecarBatchAnswer("basic", 10, 1, 1, 1, 2), nil)
	for i, want := range map[Stream]string{first: "allow", a: "allow", b: "deny"} {
		wentOn(t, i)
		if got := header(t, i.UpstreamHeaders(), limiter.ShadowHeader); got != want {
			t.Errorf("%s %q, want %q", limiter.ShadowHeader, got, want)
		}
	}
	counters(t, h, map[string]int64{limiter.MetricShadowAllowed: 2, limiter.MetricShadowWouldDeny: 1})
}

// batchBreakerOpen: requests queued behind a callout fail open without a
// callout when the breaker opened meanwhile.
func (r runner) batchBreakerOpen(t *testing.T) {
	h := r.host(t, breakerConfig)
	first, _ := waiting(t, h, get("key-1"))
	a, b := queued(t, h, get("key-1")), queued(t, h, get("key-1"))
	for range 3 {
		failing(t, h, "key-2", unavailableAnswer)
	}
	transitions(t, h, 1, 0, 0)
	first.RespondCallout(SidecarAnswer("basic", 10, 1, 10, 1), nil)
	wentOn(t, first)
	for _, s := range []Stream{a, b} {
		if _, ok := s.Callout(); ok {
			t.Fatal("a batch went out while the breaker is open")
		}
		wentOn(t, s)
	}
	counters(t, h, map[string]int64{limiter.MetricAllowed: 1, circuitOpen: 2, limiter.MetricFailedOpenPrefix + "unavailable": 3})
}
