package e2e_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// With "on_failure": "local", Redis killed: a client the gateways saw
// before the outage is held to its plan by each gateway on its own, from
// the tokens the sidecar's last answer left; a client never seen passes;
// Redis back: limiting resumes through the sidecar.
func TestLocalFailureWhenRedisStops(t *testing.T) {
	const (
		gateways = 2
		capacity = 5
		rate     = 0.01 // tokens per second: one token per 100 s
	)
	s := startStack(t, stackConfig{
		plans:    "default_plan: tiny\nplans:\n  tiny: {capacity: 5, rate: 0.01}\n",
		filter:   filterConfig{OnFailure: "local"},
		gateways: gateways,
	})
	fromSidecar := func(r reply) bool { return r.header.Get("ratelimit-limit") == "5" }

	// Each gateway learns the plan from one answer of the sidecar, and
	// the tokens that answer left: its bucket starts there in the outage
	// (whole tokens: the rate adds under 0.01 a second).
	const seen = "seen-before"
	left := 0
	for g := 0; g < gateways; g++ {
		testkit.Poll(t, 30*time.Second, "gateway answered by the sidecar", func() bool {
			r := s.do(g, "GET", "/orders/1", "x-api-key", seen)
			if !fromSidecar(r) {
				return false
			}
			n, err := strconv.Atoi(r.header.Get("ratelimit-remaining"))
			if err != nil {
				t.Fatalf("ratelimit-remaining %q: %v", r.header.Get("ratelimit-remaining"), err)
			}
			left += n
			return true
		})
	}
	if got := s.stat(counter("local_allowed")) + s.stat(counter("local_denied")); got != 0 {
		t.Fatalf("local counters = %d before the outage, want 0", got)
	}

	if err := s.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	failedBefore := s.failedOpen()
	const perGateway = 20
	admitted, denied := 0, 0
	for g := 0; g < gateways; g++ {
		for i := 0; i < perGateway; i++ {
			r := s.do(g, "GET", "/orders/1", "x-api-key", seen)
			switch r.status {
			case http.StatusOK:
				admitted++
			case http.StatusTooManyRequests:
				denied++
				// Empty since some instant t0 of this phase: the next token
				// is 1/rate = 100 s after t0, so Retry-After is between
				// 100 s minus the phase so far (rounded up) and 100 s.
				low := 100 - int(math.Ceil(time.Since(start).Seconds()))
				if r.retryAfter < max(low, 1) || r.retryAfter > 100 {
					t.Errorf("Retry-After %d, want %d to 100", r.retryAfter, max(low, 1))
				}
				mustContain(t, "429 body", r.body, `"rate_limited"`)
			default:
				t.Fatalf("Redis down: status %d, want 200 or 429", r.status)
			}
		}
	}
	// Each gateway's bucket starts at the tokens its answer left and gains
	// rate × elapsed: under one token while the phase lasts less than
	// 1/rate = 100 s, so each gateway admits exactly what its answer
	// left. The bound is gateways × plan, not every request.
	elapsed := time.Since(start)
	if elapsed >= 100*time.Second {
		t.Fatalf("the outage phase took %v; the exact bound below needs < 100 s", elapsed)
	}
	if left > gateways*capacity || left < gateways*(capacity-gateways) {
		t.Fatalf("the answers left %d tokens in all, want %d to %d", left, gateways*(capacity-gateways), gateways*capacity)
	}
	if admitted != left || denied != gateways*perGateway-left {
		t.Errorf("Redis down: %d admitted, %d denied; want %d admitted (the tokens each gateway's answer left) and %d denied",
			admitted, denied, left, gateways*perGateway-left)
	}
	if got := s.stat(counter("local_allowed")); got != int64(left) {
		t.Errorf("local_allowed = %d, want %d", got, left)
	}
	if got := s.stat(counter("local_denied")); got != int64(denied) {
		t.Errorf("local_denied = %d, want %d", got, denied)
	}

	// Never seen: nothing to hold it to, so it passes as with "open".
	const stranger = "never-seen"
	for i := 0; i < perGateway; i++ {
		if r := s.do(0, "GET", "/orders/1", "x-api-key", stranger); r.status != http.StatusOK {
			t.Fatalf("Redis down, a client never seen: status %d, want 200", r.status)
		}
	}
	// Every request of the outage failed open first (counted by reason).
	if got, want := s.failedOpen()-failedBefore, int64(gateways*perGateway+perGateway); got != want {
		t.Errorf("fail-open counters rose by %d, want %d", got, want)
	}

	if err := s.redis.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Back: the sidecar decides again (once the breaker's probe got an
	// answer). The restarted Redis is empty, so a new client has a full
	// bucket of 5, spends it, and the sidecar denies the sixth. A request
	// that failed open on the way may still have been charged in Redis (a
	// check the sidecar gave up on at its deadline can still run), so such
	// a run counts nothing and runs again with a fresh client (decidedRun).
	testkit.Poll(t, 30*time.Second, "the sidecar answering again", func() bool {
		return fromSidecar(s.do(0, "GET", "/orders/1", "x-api-key", "after-outage-probe"))
	})
	s.decidedRun(t, "a new client after the outage", func(run int) error {
		after := "after-outage-" + strconv.Itoa(run)
		deniedBefore, localDeniedBefore := s.stat(counter("denied")), s.stat(counter("local_denied"))
		for i := 0; i < capacity; i++ {
			if r := s.do(0, "GET", "/orders/1", "x-api-key", after); r.status != http.StatusOK || !fromSidecar(r) {
				return fmt.Errorf("Redis back, request %d: status %d, limit %q; want 200 from the sidecar", i+1, r.status, r.header.Get("ratelimit-limit"))
			}
		}
		if r := s.do(0, "GET", "/orders/1", "x-api-key", after); r.status != http.StatusTooManyRequests {
			return fmt.Errorf("Redis back, request %d: status %d, want 429", capacity+1, r.status)
		}
		if got := s.stat(counter("denied")) - deniedBefore; got != 1 {
			return fmt.Errorf("denied rose by %d, want 1: the sidecar decides again", got)
		}
		if got := s.stat(counter("local_denied")) - localDeniedBefore; got != 0 {
			return fmt.Errorf("local_denied rose by %d after Redis came back, want 0", got)
		}
		return nil
	})
}

// With "on_failure": "local", an outage that comes and goes: the requests
// the sidecar admits between its failures are charged to the client's
// local bucket too, so that the proxy admits one plan in all rather than
// the sidecar's plan and the bucket's again. A plan of 5 tokens that
// refills one token in 100 s: the gateway admits the client at most 5
// times, whoever decides. Lowered only to the sidecar's tokens and not
// charged, the bucket lets one more through (6): the sidecar's bucket
// never paid for the request the bucket admitted while it was stopped.
// Starting full and not settled at all, 9.
func TestLocalFailureChargesWhatTheSidecarAdmits(t *testing.T) {
	const capacity = 5
	s := startStack(t, stackConfig{
		plans: "default_plan: tiny\nplans:\n  tiny: {capacity: 5, rate: 0.01}\n",
		// The value this test is about; envoy.yaml leaves the default, open.
		filter: filterConfig{OnFailure: "local"},
	})
	fromSidecar := func(r reply) bool { return r.status == http.StatusOK && r.header.Get("ratelimit-limit") == "5" }
	var client string
	s.decidedRun(t, "the plan learned from the sidecar", func(run int) error {
		client = "comes-and-goes-" + strconv.Itoa(run)
		if r := s.do(0, "GET", "/orders/1", "x-api-key", client); !fromSidecar(r) {
			return fmt.Errorf("status %d without the sidecar's headers", r.status)
		}
		return nil
	})
	stopped := func(what string, n int) (admitted int) {
		t.Helper()
		if err := s.sidecars[0].Pause(); err != nil {
			t.Fatal(err)
		}
		failed := s.failedOpen()
		for i := 0; i < n; i++ {
			switch r := s.do(0, "GET", "/orders/1", "x-api-key", client); r.status {
			case http.StatusOK:
				admitted++
			case http.StatusTooManyRequests:
				mustContain(t, what+" 429 body", r.body, `"rate_limited"`)
			default:
				t.Fatalf("%s, request %d: status %d, want 200 or 429", what, i+1, r.status)
			}
		}
		if got := s.failedOpen() - failed; got != int64(n) {
			t.Fatalf("%s: %d requests failed open of %d, want all: the sidecar is stopped", what, got, n)
		}
		if err := s.sidecars[0].Resume(); err != nil {
			t.Fatal(err)
		}
		return admitted
	}
	localBefore := s.stat(counter("local_allowed")) + s.stat(counter("local_denied"))

	// The sidecar stops: the bucket starts at the 4 tokens the answer
	// left, and admits one.
	first := stopped("sidecar stopped", 1)
	if first != 1 {
		t.Fatalf("sidecar stopped: %d admitted, want 1 of the 4 tokens left", first)
	}
	// Back: three admitted by the sidecar (its bucket held 4). A request
	// that fails open on the way is decided by the bucket, and counts.
	testkit.Poll(t, 30*time.Second, "the sidecar answering again", func() bool {
		return fromSidecar(s.do(0, "GET", "/orders/1", "x-api-key", "comes-and-goes-probe-"+strconv.Itoa(time.Now().Nanosecond())))
	})
	between, bySidecar := 0, 0
	for i := 0; bySidecar < 3; i++ {
		if i == 10 {
			t.Fatalf("%d of 10 requests admitted by the sidecar, want 3", bySidecar)
		}
		r := s.do(0, "GET", "/orders/1", "x-api-key", client)
		if r.status == http.StatusOK {
			between++
		}
		if fromSidecar(r) {
			bySidecar++
		}
	}
	// Stopped again: the bucket holds what is left of the plan.
	last := stopped("sidecar stopped again", 4)
	if got := 1 + first + between + last; got > capacity {
		t.Errorf("admitted %d (1 by the sidecar, %d while stopped, %d by the sidecar or failing open between, %d stopped again), want at most the plan's %d",
			got, first, between, last, capacity)
	}
	if got, want := s.stat(counter("local_allowed"))+s.stat(counter("local_denied"))-localBefore, int64(1+4); got < want {
		t.Errorf("local counters rose by %d, want at least %d: the bucket decided each request while the sidecar was stopped", got, want)
	}
}
