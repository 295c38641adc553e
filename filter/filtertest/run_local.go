package filtertest

import (
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/filtertest/sidecaranswer"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// The cases of "on_failure": "local". Like the breaker's, they never
// advance the clock past a pending callout's timeout.

const (
	localAllowed = limiter.MetricLocalAllowed
	localDenied  = limiter.MetricLocalDenied
)

// withRate adds x-ratelimit-rate to an answer exactly as the sidecar
// formats it.
func withRate(h []Header, rate float64) []Header {
	return append(h, Header{"x-ratelimit-rate", strconv.FormatFloat(rate, 'g', -1, 64)})
}

// goldPolicy is learnPlan's plan as RateLimit-Policy: 3 tokens, refilled
// in 6 s.
const goldPolicy = `"gold";q=3;w=6;edgelimit-rate="0.5"`

// learnPlan has the sidecar allow key's first request under plan "gold":
// capacity 3, 0.5 tokens/s. It is called at the row's start, Redis time 0,
// and returns key's bucket as the sidecar's script keeps it, for the row's
// later answers: the full 3, less 1, leave 2 (x-ratelimit-tokens 2; full
// again in (3 - 2) / 0.5 = 2 s).
func learnPlan(t *testing.T, h Host, key string) *sidecaranswer.Bucket {
	t.Helper()
	b := sidecaranswer.NewBucket(3, 0.5)
	s, _ := waiting(t, h, get(key))
	s.RespondCallout(b.Check("gold", 0, 1), nil)
	wentOn(t, s)
	s.Done()
	return b
}

// failingTo sends a request whose callout gets answer and returns the
// stream, decided by the filter alone.
func failingTo(t *testing.T, h Host, key string, answer []Header) Stream {
	t.Helper()
	s, _ := waiting(t, h, get(key))
	s.RespondCallout(answer, nil)
	return s
}

// localLimits: with "local", every way the sidecar can fail to answer sends
// a known client through its local bucket (capacity 3, 0.5 tokens/s, full
// when first needed); a client never seen passes as with "open".
func (r runner) localLimits(t *testing.T) {
	h := r.host(t, `{"on_failure": "local", "breaker": {"failures": 4, "min_open_ms": 60000, "max_open_ms": 60000}}`)
	learnPlan(t, h, "alice")
	// The answer left the sidecar's bucket 2 tokens; 2 s on it can hold
	// 3, its capacity, and the local bucket starts there.
	h.Advance(2 * time.Second)

	// Three tokens: a 500 and a malformed 200 (which the breaker does not
	// count) and a 503 each take one.
	wentOn(t, failingTo(t, h, "alice", []Header{{":status", "500"}}))
	wentOn(t, failingTo(t, h, "alice", []Header{{":status", "200"}}))
	wentOn(t, failingTo(t, h, "alice", unavailableAnswer))
	// Empty: one token is 2 s away; the bucket is full again in 6 s.
	denial(t, failingTo(t, h, "alice", timeoutAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	denial(t, failingTo(t, h, "alice", resetAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	h.FailNextDispatch()
	s, cont := send(h, get("alice"))
	if cont {
		t.Fatal("a request the local bucket denies went on after a failed dispatch")
	}
	denial(t, s, goldPolicy, `"gold";r=0;t=2`, "6", "2")
	if rep, _ := s.LocalReply(); rep.Details != "edgelimit_rate_limited_local" {
		t.Errorf("details %q", rep.Details)
	}
	// That was the fourth failure in a row: the breaker is open, and the
	// bucket still holds.
	transitions(t, h, 1, 0, 0)
	s, _ = send(h, get("alice"))
	if _, ok := s.Callout(); ok {
		t.Fatal("callout while the breaker is open")
	}
	denial(t, s, goldPolicy, `"gold";r=0;t=2`, "6", "2")

	// Never seen: through, unlimited.
	for range 5 {
		bypassed(t, h, "stranger")
	}
	// 2 s: one token back.
	h.Advance(2 * time.Second)
	bypassed(t, h, "alice")
	denial(t, func() Stream { s, _ := send(h, get("alice")); return s }(), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	// 1.5 s more: 0.75 tokens; the missing 0.25 take 0.5 s, so 1 s.
	h.Advance(1500 * time.Millisecond)
	denial(t, func() Stream { s, _ := send(h, get("alice")); return s }(), goldPolicy, `"gold";r=0;t=1`, "5", "1")

	counters(t, h, map[string]int64{
		limiter.MetricAllowed:                           1,
		limiter.MetricFailedOpenPrefix + "status":       1,
		limiter.MetricFailedOpenPrefix + "malformed":    1,
		limiter.MetricFailedOpenPrefix + "unavailable":  1,
		limiter.MetricFailedOpenPrefix + "timeout":      1,
		limiter.MetricFailedOpenPrefix + "reset":        1,
		limiter.MetricFailedOpenPrefix + "dispatch":     1,
		limiter.MetricFailedOpenPrefix + "circuit_open": 1 + 5 + 1 + 1 + 1,
		localAllowed: 4,
		localDenied:  6,
	})
}

// localWorkers: the plan and the bucket are the process's, shared by every
// worker VM: a client learned on one worker is held on another, from the
// same tokens.
func (r runner) localWorkers(t *testing.T) {
	const config = `{"on_failure": "local", "breaker": {"failures": 0}}`
	h := r.host(t, config)
	w := worker(t, h, config)
	learnPlan(t, h, "alice")
	wentOn(t, failingTo(t, w, "alice", unavailableAnswer))
	wentOn(t, failingTo(t, h, "alice", unavailableAnswer))
	wentOn(t, failingTo(t, w, "alice", unavailableAnswer))
	denial(t, failingTo(t, h, "alice", unavailableAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	denial(t, failingTo(t, w, "alice", unavailableAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	counters(t, h, map[string]int64{
		limiter.MetricAllowed: 1, limiter.MetricFailedOpenPrefix + "unavailable": 5,
		localAllowed: 3, localDenied: 2,
	})
}

// localClockSteppedBack: a step back of the proxy's wall clock (an NTP
// step, what proxy_get_current_time_nanoseconds follows in Envoy) leaves
// a spent local bucket stamped ahead of the clock. The first request after
// it is denied on what the bucket held and restamps it, and the bucket
// refills from there: the Retry-After it was told (2 s) holds, where the
// bucket used to stay spent until the clock was back at its stamp, an
// hour here.
func (r runner) localClockSteppedBack(t *testing.T) {
	h := r.host(t, `{"on_failure": "local", "breaker": {"failures": 0}}`)
	learnPlan(t, h, "alice")
	// 2 s on the answer's 2 tokens: the capacity, 3.
	h.Advance(2 * time.Second)
	for range 3 {
		wentOn(t, failingTo(t, h, "alice", unavailableAnswer))
	}
	denial(t, failingTo(t, h, "alice", unavailableAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	h.StepWall(-time.Hour)
	denial(t, failingTo(t, h, "alice", unavailableAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	// The wait told: one token back.
	h.Advance(2 * time.Second)
	wentOn(t, failingTo(t, h, "alice", unavailableAnswer))
	denial(t, failingTo(t, h, "alice", unavailableAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	counters(t, h, map[string]int64{
		limiter.MetricAllowed: 1, limiter.MetricFailedOpenPrefix + "unavailable": 7,
		localAllowed: 4, localDenied: 3,
	})
}

// localLearnsOnlyThePlan: a 429 without the sidecar's exact tokens
// (x-ratelimit-tokens) teaches the plan only. The local bucket starts full
// when first needed, and a newer plan replaces the old one. (Once in use, the
// bucket is charged for what later answers admit: localPartialOutage.)
func (r runner) localLearnsOnlyThePlan(t *testing.T) {
	h := r.host(t, `{"on_failure": "local", "breaker": {"failures": 0}}`)
	// Without the exact tokens, which the sidecar always sends: the row is
	// about an answer that lacks them, and the deny cache stays out of it.
	// The rest is the sidecar's 429 for a bucket of 0 tokens under plan
	// "free", 2 tokens refilled at 0.5/s.
	s := failingTo(t, h, "bob", withRate(denyAnswer(2, 0, 4, 2, "", "", "free"), 0.5))
	reply(t, s, 429)
	wentOn(t, failingTo(t, h, "bob", timeoutAnswer))
	wentOn(t, failingTo(t, h, "bob", timeoutAnswer))
	denial(t, failingTo(t, h, "bob", timeoutAnswer), `"free";q=2;w=4;edgelimit-rate="0.5"`, `"free";r=0;t=2`, "4", "2")

	// 2 s on, the local bucket has refilled one token at 0.5/s, and
	// another failure takes it: 0 left, written now.
	h.Advance(2 * time.Second)
	wentOn(t, failingTo(t, h, "bob", timeoutAnswer))

	// The plan grows to 5 at 1 token/s in an answer that admits a
	// request. The 429 came from a bucket of 0 tokens (remaining 0, full
	// in (2 - 0) / 0.5 = 4 s, a token in 2 s) that nobody has spent from
	// since, so the script, reading it under the new plan 2 s on, finds
	// 0 + 2 * 1 = 2 tokens and leaves 1. The bucket in use is charged for
	// the admission, from its 0 tokens to a debt of 1 (the answer's 1 does
	// not raise it), and refills at the new rate: the next whole token is
	// 2 tokens away, 2 s at 1/s; full in (5 + 1) / 1 = 6 s.
	s = failingTo(t, h, "bob", SidecarAnswer("pro", 5, 1, 2, 1))
	wentOn(t, s)
	denial(t, failingTo(t, h, "bob", timeoutAnswer), `"pro";q=5;w=5;edgelimit-rate="1"`, `"pro";r=0;t=2`, "6", "2")
	h.Advance(2 * time.Second)
	wentOn(t, failingTo(t, h, "bob", timeoutAnswer))

	// An answer without x-ratelimit-rate (an older sidecar's, the case
	// this answer stands for) teaches nothing: that client passes.
	s = failingTo(t, h, "carol", allowAnswer(1, 0, 1, "free"))
	wentOn(t, s)
	for range 3 {
		wentOn(t, failingTo(t, h, "carol", timeoutAnswer))
	}
	counters(t, h, map[string]int64{
		limiter.MetricDenied: 1, limiter.MetricAllowed: 2,
		limiter.MetricFailedOpenPrefix + "timeout": 9,
		localAllowed: 4, localDenied: 2,
	})
}

// localNotForShadow: requests not enforced keep failing open, with
// "unknown" for the service: the local bucket is not the sidecar's
// decision, and shadow mode exists to compare the sidecar's.
func (r runner) localNotForShadow(t *testing.T) {
	h := r.host(t, `{"mode": "shadow", "on_failure": "local", "breaker": {"failures": 0}}`)
	// alice's first check under a plan of 1 token refilled at 0.5/s: 0
	// left, full in 2 s.
	s := failingTo(t, h, "alice", SidecarAnswer("gold", 1, 0.5, 1, 1))
	wentOn(t, s)
	for range 3 {
		s := failingTo(t, h, "alice", unavailableAnswer)
		wentOn(t, s)
		if got := header(t, s.UpstreamHeaders(), limiter.ShadowHeader); got != "unknown" {
			t.Errorf("%s %q, want unknown", limiter.ShadowHeader, got)
		}
	}
	counters(t, h, map[string]int64{limiter.MetricShadowAllowed: 1, limiter.MetricFailedOpenPrefix + "unavailable": 3})
}

// localOffByDefault: without on_failure, a client the sidecar described
// passes every failure, as the design says.
func (r runner) localOffByDefault(t *testing.T) {
	h := r.host(t, `{"breaker": {"failures": 0}}`)
	learnPlan(t, h, "alice")
	for range 5 {
		wentOn(t, failingTo(t, h, "alice", unavailableAnswer))
	}
	counters(t, h, map[string]int64{limiter.MetricAllowed: 1, limiter.MetricFailedOpenPrefix + "unavailable": 5})
}

// localPartialOutage: the local bucket starts no fuller than the latest
// answer says the sidecar's bucket can be, and while it is in use the
// answers the sidecar still gives are settled against it: a request the
// sidecar admitted is charged to the bucket, which can go into debt. The
// process admits the client's plan once, not once through the sidecar and
// once more through the bucket.
func (r runner) localPartialOutage(t *testing.T) {
	h := r.host(t, `{"on_failure": "local", "breaker": {"failures": 0}}`)
	// The sidecar's bucket (b, Redis time in µs from the row's start):
	// 2 of 3 left at 0. Its failures below decide nothing in Redis.
	b := learnPlan(t, h, "alice")
	// The local bucket starts at those 2, not full: 1 left.
	wentOn(t, failingTo(t, h, "alice", unavailableAnswer))
	// The sidecar admits one from its 2: 1 left there. The local bucket is
	// charged, 0 left, and not raised to the answer's 1.
	wentOn(t, failingTo(t, h, "alice", b.Check("gold", 0, 1)))
	denial(t, failingTo(t, h, "alice", unavailableAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	// 4 s: the local bucket refills 4 * 0.5 = 2 tokens, the sidecar's
	// min(3, 1 + 2) = 3. The sidecar admits one (2 left there; the local
	// bucket, charged, 1), the local bucket another (0), and the sidecar
	// one more (1 left there; the local bucket, charged, -1): a debt of
	// 1, so the next whole token is 2 tokens, 4 s, away, and the bucket
	// full in (3 + 1) / 0.5 = 8 s.
	h.Advance(4 * time.Second)
	wentOn(t, failingTo(t, h, "alice", b.Check("gold", 4e6, 1)))
	wentOn(t, failingTo(t, h, "alice", timeoutAnswer))
	wentOn(t, failingTo(t, h, "alice", b.Check("gold", 4e6, 1)))
	denial(t, failingTo(t, h, "alice", timeoutAnswer), goldPolicy, `"gold";r=0;t=4`, "8", "4")
	h.Advance(2 * time.Second)
	denial(t, failingTo(t, h, "alice", timeoutAnswer), goldPolicy, `"gold";r=0;t=2`, "6", "2")
	h.Advance(2 * time.Second)
	wentOn(t, failingTo(t, h, "alice", timeoutAnswer))
	counters(t, h, map[string]int64{
		limiter.MetricAllowed:                          4,
		limiter.MetricFailedOpenPrefix + "unavailable": 2,
		limiter.MetricFailedOpenPrefix + "timeout":     4,
		localAllowed: 3, localDenied: 3,
	})
}

// localEvictions: the local buckets hold 2048 clients per process (128
// shared-data keys of 16). Each client whose plan an answer teaches is
// written there; past 2048, each new one evicts the entry written longest
// ago in its key, so 2100 clients evict at least 52 and at most 2100.
func (r runner) localEvictions(t *testing.T) {
	h := r.host(t, `{"on_failure": "local"}`)
	const clients, held = 2100, 128 * 16
	for i := range clients {
		s, _ := waiting(t, h, get("evict-"+strconv.Itoa(i)))
		s.RespondCallout(sidecaranswer.NewBucket(3, 0.5).Check("gold", 0, 1), nil)
		wentOn(t, s)
		s.Done()
	}
	if n := metric(t, h, limiter.MetricLocalEvicted); n < clients-held || n > clients {
		t.Errorf("%s = %d, want %d to %d", limiter.MetricLocalEvicted, n, clients-held, clients)
	}
	if n := metric(t, h, limiter.MetricDenyEvicted); n != 0 {
		t.Errorf("%s = %d, want 0: no client was denied", limiter.MetricDenyEvicted, n)
	}
}
