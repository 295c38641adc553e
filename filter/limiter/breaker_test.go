package limiter

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/filter/abi"
)

const ms = int64(1e6)

// testBreaker opens after 3 failures, for 100 ms doubling to 400 ms; with
// a 5 ms callout timeout the probe's lease is 105 ms.
var testBreaker = BreakerConfig{Failures: 3, MinOpenMs: 100, MaxOpenMs: 400}

const testLease = 105 * ms

// TestBreakerStateMachine walks the pure state machine through a whole
// outage: failures, open, probes that fail with a growing interval, a probe
// that closes it, and a new outage starting again from the shortest
// interval. at is in milliseconds after anchor.
func TestBreakerStateMachine(t *testing.T) {
	type step struct {
		at     int64
		op     string // "admit", or the result of a callout: "ok", "fail", "probe-ok", "probe-fail"
		allow  bool   // admit: whether the callout may go
		probe  bool   // admit: whether it is the probe
		event  breakerEvent
		phase  breakerPhase
		until  int64 // in ms after anchor, when not closed
		failed uint32
	}
	steps := []step{
		{at: 0, op: "admit", allow: true, phase: phaseClosed},
		{at: 1, op: "fail", phase: phaseClosed, failed: 1},
		{at: 2, op: "fail", phase: phaseClosed, failed: 2},
		{at: 3, op: "ok", phase: phaseClosed}, // a success breaks the run
		{at: 4, op: "fail", phase: phaseClosed, failed: 1},
		{at: 5, op: "fail", phase: phaseClosed, failed: 2},
		{at: 6, op: "fail", event: evOpened, phase: phaseOpen, until: 106},
		{at: 7, op: "admit", phase: phaseOpen, until: 106},
		{at: 8, op: "ok", phase: phaseOpen, until: 106},   // sent before it opened
		{at: 9, op: "fail", phase: phaseOpen, until: 106}, // likewise
		{at: 105, op: "admit", phase: phaseOpen, until: 106},
		{at: 106, op: "admit", allow: true, probe: true, phase: phaseHalfOpen, until: 106 + 105},
		{at: 107, op: "admit", phase: phaseHalfOpen, until: 211},
		{at: 108, op: "ok", phase: phaseHalfOpen, until: 211}, // not the probe
		{at: 110, op: "probe-fail", event: evReopened, phase: phaseOpen, until: 310},
		{at: 309, op: "admit", phase: phaseOpen, until: 310},
		{at: 310, op: "admit", allow: true, probe: true, phase: phaseHalfOpen, until: 415},
		{at: 310, op: "probe-fail", event: evReopened, phase: phaseOpen, until: 710},
		{at: 710, op: "admit", allow: true, probe: true, phase: phaseHalfOpen, until: 815},
		{at: 711, op: "probe-fail", event: evReopened, phase: phaseOpen, until: 1111}, // capped at 400 ms
		{at: 1111, op: "admit", allow: true, probe: true, phase: phaseHalfOpen, until: 1216},
		{at: 1112, op: "probe-ok", event: evClosed, phase: phaseClosed},
		{at: 1113, op: "admit", allow: true, phase: phaseClosed},
		{at: 1114, op: "probe-fail", phase: phaseClosed, failed: 1}, // a late probe counts as any callout
		{at: 1115, op: "fail", phase: phaseClosed, failed: 2},
		{at: 1116, op: "fail", event: evOpened, phase: phaseOpen, until: 1216}, // from min_open_ms again
	}
	var st breakerState
	for i, s := range steps {
		now := anchor + s.at*ms
		var ev breakerEvent
		switch s.op {
		case "admit":
			var allow, probe bool
			st, allow, probe = st.admit(testLease, now)
			if allow != s.allow || probe != s.probe {
				t.Fatalf("step %d (%+v): admit = %v, probe %v", i, s, allow, probe)
			}
		default:
			failed := s.op == "fail" || s.op == "probe-fail"
			probe := s.op == "probe-ok" || s.op == "probe-fail"
			st, ev = st.record(&testBreaker, failed, probe, now, now)
		}
		want := breakerState{phase: s.phase, failures: s.failed}
		if s.phase != phaseClosed {
			want.until = anchor + s.until*ms
		}
		if ev != s.event || st.phase != want.phase || st.failures != want.failures || st.until != want.until {
			t.Fatalf("step %d (%+v): event %d, state %+v; want until anchor+%d ms", i, s, ev, st, s.until)
		}
	}
}

func TestBreakerIntervalAndOutageStart(t *testing.T) {
	var st breakerState
	for i := range 3 {
		st, _ = st.record(&testBreaker, true, false, anchor+int64(i)*ms, anchor+int64(i)*ms)
	}
	if st.interval != 100*ms || st.since != anchor+2*ms {
		t.Fatalf("opened %+v, want a 100 ms interval since anchor+2ms", st)
	}
	for _, want := range []int64{200, 400, 400} {
		now := st.until
		st, _, _ = st.admit(testLease, now)
		st, _ = st.record(&testBreaker, true, true, now, now)
		if st.interval != want*ms || st.since != anchor+2*ms {
			t.Fatalf("after a failed probe: %+v, want a %d ms interval, outage since anchor+2ms", st, want)
		}
	}
}

// TestBreakerWake: a warm-up call's 200 ends the open interval at its
// answer, so that the next callout is the probe, only when the call was
// sent after the breaker last opened (or opened again after a failed
// probe); it changes neither a closed breaker nor a half-open one (the
// probe is out), nor the interval a failed probe doubles.
func TestBreakerWake(t *testing.T) {
	var open breakerState
	for i := range 3 {
		open, _ = open.record(&testBreaker, true, false, anchor+int64(i)*ms, anchor+int64(i)*ms)
	}
	opened := anchor + 2*ms // open until opened+100ms
	for _, c := range []struct {
		what        string
		st          breakerState
		sentAt, now int64
		woken       bool
	}{
		{"sent as it opened", open, opened, opened + 30*ms, true},
		{"sent before it opened", open, opened - 1, opened + 30*ms, false},
		{"answered after the interval", open, opened + 10*ms, opened + 100*ms, false},
		{"closed", breakerState{}, opened, opened + 30*ms, false},
	} {
		st, woken := c.st.wake(c.sentAt, c.now)
		if woken != c.woken {
			t.Errorf("%s: woken %v, want %v", c.what, woken, c.woken)
			continue
		}
		if !woken {
			if st != c.st {
				t.Errorf("%s: %+v, want it unchanged %+v", c.what, st, c.st)
			}
			continue
		}
		if st.phase != phaseOpen || st.until != c.now || st.interval != 100*ms || st.since != opened {
			t.Errorf("%s: %+v, want open until %d, the interval and outage start as they were", c.what, st, c.now)
		}
		if _, allow, probe := st.admit(testLease, c.now); !allow || !probe {
			t.Errorf("%s: the next callout allow=%v probe=%v, want the probe", c.what, allow, probe)
		}
	}
	// Half-open: the probe is out.
	now := open.until
	half, _, _ := open.admit(testLease, now)
	if st, woken := half.wake(now, now+ms); woken || st != half {
		t.Errorf("half-open: woken %v, %+v; want it unchanged", woken, st)
	}
	// The probe failed: open again for 200 ms from its answer; a call sent
	// before that answer wakes nothing, one sent after does, and the
	// interval a failed probe doubles stays 200 ms.
	reopened, _ := half.record(&testBreaker, true, true, now, now+ms)
	if _, woken := reopened.wake(now, now+50*ms); woken {
		t.Error("reopened: a call sent before the failed probe's answer woke it")
	}
	st, woken := reopened.wake(now+ms, now+50*ms)
	if !woken || st.interval != 200*ms {
		t.Errorf("reopened: woken %v, %+v; want woken with its 200 ms interval", woken, st)
	}
	st, _, _ = st.admit(testLease, now+50*ms)
	if st, _ = st.record(&testBreaker, true, true, now+50*ms, now+51*ms); st.interval != 400*ms {
		t.Errorf("a failed probe after a wake: %+v, want the interval doubled to 400 ms", st)
	}
}

// TestBreakerClock: the breaker runs on the proxy's wall clock. A step
// back never keeps it open beyond one interval or a probe's lease; a step
// forward only probes early.
func TestBreakerClock(t *testing.T) {
	open := breakerState{phase: phaseOpen, interval: 100 * ms, until: anchor + 100*ms, since: anchor}
	if _, allow, _ := open.admit(testLease, anchor); allow {
		t.Error("admitted at the start of the interval")
	}
	if _, allow, probe := open.admit(testLease, anchor-1); !allow || !probe {
		t.Error("clock stepped back: the breaker stays open longer than its interval")
	}
	if _, allow, probe := open.admit(testLease, anchor+3600e9); !allow || !probe {
		t.Error("clock stepped forward: no probe")
	}
	half := breakerState{phase: phaseHalfOpen, interval: 100 * ms, until: anchor + testLease, since: anchor}
	if _, allow, _ := half.admit(testLease, anchor); allow {
		t.Error("second probe within the lease")
	}
	if next, allow, probe := half.admit(testLease, anchor-1); !allow || !probe || next.until != anchor-1+testLease {
		t.Errorf("clock stepped back under a probe: %+v, %v, %v; want a new probe", next, allow, probe)
	}
	// A stored value with a longer lease (another configuration) is
	// honoured only up to this one's.
	long := breakerState{phase: phaseHalfOpen, interval: 100 * ms, until: anchor + 10*testLease}
	if _, allow, _ := long.admit(testLease, anchor); !allow {
		t.Error("another configuration's lease kept the probe away")
	}
}

func TestBreakerFailure(t *testing.T) {
	for _, c := range []struct {
		a    Answer
		want bool
	}{
		{Answer{Outcome: Allowed}, false},
		{Answer{Outcome: Denied}, false},
		{failed(ReasonTimeout, "", 504), true},
		{failed(ReasonUnavailable, "", 503), true},
		{failed(ReasonReset, "", 0), true},
		{failed(ReasonDispatch, "", 0), true},
		{failed(ReasonStatus, "", 500), false},
		{failed(ReasonMalformed, "", 200), false},
		{failed(ReasonInternal, "", 0), false},
		{failed(ReasonCircuitOpen, "", 0), false},
	} {
		if got := breakerFailure(&c.a); got != c.want {
			t.Errorf("%s (status %d): failure %v, want %v", c.a.Reason, c.a.Status, got, c.want)
		}
	}
}

func TestBreakerEncoding(t *testing.T) {
	st := breakerState{phase: phaseHalfOpen, failures: 0x01020304, interval: 400 * ms, until: anchor + 5, since: anchor}
	b := encodeBreaker(st)
	if len(b) != breakerSize {
		t.Fatalf("%d bytes, want %d", len(b), breakerSize)
	}
	if got, ok := decodeBreaker(b); !ok || got != st {
		t.Fatalf("decoded %+v, %v; want %+v", got, ok, st)
	}
	// The zero state is the empty value; the 30 bytes of the zero state an
	// earlier filter wrote still read as it.
	if z := encodeBreaker(breakerState{}); len(z) != 0 {
		t.Errorf("the zero state encodes as %v, want the empty value", z)
	}
	legacyZero := append([]byte{breakerFormat}, make([]byte, breakerSize-1)...)
	for _, z := range [][]byte{nil, {}, legacyZero} {
		if got, ok := decodeBreaker(z); !ok || got != (breakerState{}) {
			t.Errorf("decoded %v as %+v, %v; want the zero state", z, got, ok)
		}
	}
	bad := map[string][]byte{
		"short":        b[:breakerSize-1],
		"long":         append(slices.Clone(b), 0),
		"format":       append([]byte{2}, b[1:]...),
		"phase":        append([]byte{breakerFormat, byte(numPhases)}, b[2:]...),
		"interval<0":   encodeBreaker(breakerState{phase: phaseOpen, interval: -1}),
		"interval>max": encodeBreaker(breakerState{phase: phaseOpen, interval: maxBreakerInterval + 1}),
		"until<0":      encodeBreaker(breakerState{phase: phaseOpen, until: -1}),
		"since<0":      encodeBreaker(breakerState{phase: phaseOpen, since: -1}),
	}
	for name, v := range bad {
		if st, ok := decodeBreaker(v); ok {
			t.Errorf("%s: decoded %+v", name, st)
		}
	}
}

// FuzzDecodeBreaker: shared data is read without panicking; what decodes
// re-encodes to the same bytes, and the state machine then never keeps
// callouts away longer than an interval or a lease.
func FuzzDecodeBreaker(f *testing.F) {
	f.Add(encodeBreaker(breakerState{phase: phaseOpen, interval: 100 * ms, until: anchor + 100*ms, since: anchor}), int64(0))
	f.Add(encodeBreaker(breakerState{phase: phaseHalfOpen, interval: 400 * ms, until: anchor + testLease}), int64(testLease))
	f.Add(encodeBreaker(breakerState{failures: 2}), int64(-1))
	f.Fuzz(func(t *testing.T, b []byte, offset int64) {
		st, ok := decodeBreaker(b)
		if !ok {
			return
		}
		// The zero state re-encodes as the empty value, whatever form of
		// it was read (TestBreakerEncoding).
		if re := encodeBreaker(st); !slices.Equal(re, b) && !(st == breakerState{} && len(re) == 0) {
			t.Fatalf("re-encoded %v from %v", re, b)
		}
		now := anchor + offset
		next, allow, probe := st.admit(testLease, now)
		if !allow && st.until-now > max(st.interval, testLease) {
			t.Fatalf("%+v at %d: refused for more than an interval or a lease", st, now)
		}
		if probe && (next.phase != phaseHalfOpen || next.until != now+testLease) {
			t.Fatalf("%+v: probe left %+v", st, next)
		}
		for _, failed := range []bool{false, true} {
			after, _ := next.record(&testBreaker, failed, probe, now, now)
			if after.phase == phaseOpen && after != next && (after.interval < 100*ms || after.interval > 400*ms) {
				t.Fatalf("%+v: opened for %d ns, outside min_open_ms..max_open_ms", next, after.interval)
			}
		}
	})
}

// TestBreakerShared drives two VMs' handles on one shared value, with
// compare-and-swap races.
func TestBreakerShared(t *testing.T) {
	h := newSharedHost()
	cfg := DefaultConfig()
	cfg.Breaker = testBreaker
	a, b := newBreaker(cfg), newBreaker(cfg)
	if a.key != "edgelimit/breaker/v1/ratelimit_sidecar" || a.lease != testLease {
		t.Fatalf("key %q, lease %d", a.key, a.lease)
	}
	if allow, _ := a.allow(h, anchor); !allow || h.writes != 0 {
		t.Fatalf("closed: allow %v after %d writes; want allowed with no write", allow, h.writes)
	}
	a.record(h, true, false, false, anchor, anchor)
	b.record(h, true, false, false, anchor, anchor)
	if _, ev := a.record(h, true, false, false, anchor, anchor); ev != evOpened {
		t.Fatalf("third failure across two VMs: event %d, want opened", ev)
	}
	if allow, _ := b.allow(h, anchor+99*ms); allow {
		t.Fatal("the other VM is not open")
	}
	// Successes while closed write nothing.
	writes := h.writes
	c := newBreaker(&Config{SidecarCluster: "other", TimeoutMs: 5, Breaker: testBreaker})
	for range 3 {
		c.record(h, false, false, false, anchor, anchor)
	}
	if h.writes != writes {
		t.Errorf("successes while closed wrote %d times", h.writes-writes)
	}

	// A write from another VM between our read and write: look again.
	h.casFailures = 1
	if allow, probe := a.allow(h, anchor+100*ms); !allow || !probe {
		t.Fatalf("probe lost to a CAS retry: %v %v", allow, probe)
	}
	if allow, _ := b.allow(h, anchor+100*ms); allow {
		t.Fatal("a second probe")
	}
	// Another VM keeps winning: give up this probe, lose nothing else.
	h.casFailures = breakerCASAttempts
	before := slices.Clone(h.data[a.key])
	if _, ev := b.record(h, false, true, false, anchor+101*ms, anchor+101*ms); ev != evNone || !slices.Equal(h.data[a.key], before) {
		t.Fatalf("record after %d CAS failures: event %d, state changed", breakerCASAttempts, ev)
	}
	if _, ev := a.record(h, false, true, false, anchor+101*ms, anchor+101*ms); ev != evClosed {
		t.Fatalf("probe success: event %d, want closed", ev)
	}
	// Closed again with no streak: the empty value, which costs a read no
	// allocation in the module (encodeBreaker).
	if v, ok := h.data[a.key]; !ok || len(v) != 0 {
		t.Fatalf("closed again: shared value %v (set %v), want the empty value", v, ok)
	}
	if allow, _ := b.allow(h, anchor+102*ms); !allow {
		t.Fatal("closed, yet the other VM refuses")
	}

	// Unreadable shared data is a closed breaker, overwritten by the next
	// change.
	h.data[a.key] = []byte("garbage")
	if allow, _ := a.allow(h, anchor); !allow {
		t.Fatal("unreadable state refused a callout")
	}
	a.record(h, true, false, false, anchor+200*ms, anchor+205*ms)
	if st, ok := decodeBreaker(h.data[a.key]); !ok || st.failures != 1 {
		t.Fatalf("after a failure: %+v, %v", st, ok)
	}
}

// A burst that the proxy (or the sidecar) is slow to get through: callouts
// that time out while others sent before or with them are still being
// answered do not count, so the breaker stays closed; once no answer comes
// after a callout leaves, its failure counts, and Failures of those open it.
func TestBreakerTellsCongestionFromOutage(t *testing.T) {
	h := newSharedHost()
	cfg := DefaultConfig()
	cfg.Breaker = testBreaker
	b := newBreaker(cfg)
	// 30 callouts leave together at anchor; the first answers come back
	// at +3 ms, the rest time out at +5 ms, interleaved with late answers.
	b.record(h, false, false, false, anchor, anchor+3*ms)
	for i := range 30 {
		failed := i%3 != 0
		if _, ev := b.record(h, failed, false, failed, anchor+int64(i)*ms/10, anchor+5*ms+int64(i)*ms/10); ev != evNone {
			t.Fatalf("callout %d of the burst: event %d, want none", i, ev)
		}
	}
	if st, _ := b.load(h); st.phase != phaseClosed || st.failures != 0 {
		t.Fatalf("after the burst: %+v, want closed with no failures counted", st)
	}
	// Then the sidecar stops answering: callouts sent after its last answer
	// fail, and the third of them (testBreaker.Failures) opens the breaker.
	last := anchor + 5*ms + 3*ms
	for i := range int64(testBreaker.Failures) {
		sent := last + (i+1)*6*ms // each sent once the one before had failed
		_, ev := b.record(h, true, false, true, sent, sent+5*ms)
		if want := evNone; i == int64(testBreaker.Failures)-1 {
			want = evOpened
			if ev != want {
				t.Fatalf("failure %d after the last answer: event %d, want opened", i+1, ev)
			}
		} else if ev != want {
			t.Fatalf("failure %d after the last answer: event %d, want none", i+1, ev)
		}
	}
}

// Timeouts whose callbacks ran more than lateSlack after their deadline
// come from a worker too busy to run them on time: they change nothing,
// even with no answer from the sidecar since (a burst at a cold start);
// one delivered on time counts, and a late one does not reset the count.
func TestBreakerLateTimeoutsAreCongestion(t *testing.T) {
	h := newSharedHost()
	cfg := DefaultConfig()
	cfg.Breaker = testBreaker
	b := newBreaker(cfg)
	if b.late != 5*ms+lateSlack {
		t.Fatalf("late = %d, want the 5 ms timeout plus %d", b.late, lateSlack)
	}
	for i := range int64(10) {
		sent := anchor + i*ms/10
		if _, ev := b.record(h, true, false, true, sent, sent+5*ms+lateSlack+1); ev != evNone {
			t.Fatalf("late timeout %d: event %d, want none", i, ev)
		}
	}
	if st, _ := b.load(h); st.failures != 0 {
		t.Fatalf("late timeouts counted: %+v", st)
	}
	// On time (exactly at the slack) counts; a late one in between
	// neither counts nor resets; a 503 counts whenever it comes.
	sent := anchor + 20*ms
	b.record(h, true, false, true, sent, sent+5*ms+lateSlack)
	b.record(h, true, false, true, sent, sent+50*ms)
	if st, _ := b.load(h); st.failures != 1 {
		t.Fatalf("after one timely and one late timeout: %d failures, want 1", st.failures)
	}
	b.record(h, true, false, false, sent+10*ms, sent+50*ms)
	if _, ev := b.record(h, true, false, true, sent+60*ms, sent+65*ms); ev != evOpened {
		t.Fatalf("third counted failure: event %d, want opened", ev)
	}
}

// One wave of callouts, sent together before any came back, counts once
// however many of them fail; callouts sent once a failure was known add to
// the streak.
func TestBreakerWaveCountsOnce(t *testing.T) {
	st := breakerState{}
	for i := range int64(30) {
		var ev breakerEvent
		if st, ev = st.record(&testBreaker, true, false, anchor+i*ms/30, anchor+5*ms+i*ms/30); ev != evNone {
			t.Fatalf("failure %d of the wave: event %d, want none", i, ev)
		}
	}
	if st.failures != 1 || st.since != anchor+5*ms {
		t.Fatalf("after the wave: %+v, want 1 failure since its first came back", st)
	}
	st, _ = st.record(&testBreaker, true, false, anchor+5*ms, anchor+10*ms)
	st, ev := st.record(&testBreaker, true, false, anchor+10*ms, anchor+15*ms)
	if ev != evOpened {
		t.Fatalf("third failure, each sent after one had failed: event %d, want opened (%+v)", ev, st)
	}
	// A success ends the streak: the next failure starts a new one.
	st = breakerState{failures: 2, since: anchor}
	st, _ = st.record(&testBreaker, false, false, anchor+ms, anchor+2*ms)
	if st.failures != 0 || st.since != 0 {
		t.Fatalf("after a success: %+v, want no streak", st)
	}
}

// failingSharedHost refuses every shared-data write with status.
type failingSharedHost struct {
	*sharedHost
	status abi.Status
}

func (h failingSharedHost) SetSharedData(string, []byte, uint32) abi.Status { return h.status }

func TestBreakerSharedDataRefused(t *testing.T) {
	h := failingSharedHost{newSharedHost(), abi.StatusInternalFailure}
	cfg := DefaultConfig()
	cfg.Breaker = testBreaker
	b := newBreaker(cfg)
	for range 10 {
		if _, ev := b.record(h, true, false, false, anchor, anchor); ev != evNone {
			t.Fatalf("event %d without storing the state", ev)
		}
	}
	if allow, _ := b.allow(h, anchor); !allow {
		t.Fatal("a breaker that cannot store its state refused a callout")
	}
	// Stored open by someone, but this VM cannot take the probe: it still
	// sends the callout rather than never probing.
	h.data[b.key] = encodeBreaker(breakerState{phase: phaseOpen, interval: 100 * ms, until: anchor, since: anchor})
	if allow, probe := b.allow(h, anchor); !allow || probe {
		t.Fatalf("allow %v probe %v, want a plain callout", allow, probe)
	}
}

// TestBreakerPanicResumes: a panic while the breaker stores a failure is
// recovered like any other; the request still goes on.
func TestBreakerPanicResumes(t *testing.T) {
	h := newPanicHost()
	l := started(t, h)
	if act := l.OnRequestHeaders(2, 3, true); act != abi.ActionPause {
		t.Fatalf("action %d, want pause for the callout", act)
	}
	h.response = [][2]string{{":status", "504"}}
	h.panicOn = "SetSharedData"
	h.calls = nil
	l.OnHTTPCallResponse(1, 4, 1, 0, 0)
	if !slices.Contains(h.calls, "SetSharedData") {
		t.Fatalf("the failure was not stored: calls %q", h.calls)
	}
	if h.effective != 2 || !slices.Contains(h.calls, "ContinueStream") {
		t.Errorf("after a panic the stream was not resumed: effective %d, calls %q", h.effective, h.calls)
	}
	if n := h.counter(MetricFailedOpenPrefix + "internal"); n != 1 {
		t.Errorf("failed_open.internal = %d", n)
	}
}

// A brownout is not an outage: a sidecar that answers one check in two in
// time (its Redis slow, or one slow master among several) and 503s the
// other at its deadline is partly up, and every check it answers is
// limited. With envoy/envoy.yaml's filter configuration (the default
// breaker), 2,000 such checks, each sent 1 ms after the one before came
// back (so that every failure is a wave of its own, the case in which the
// most of them count), leave the breaker closed; the failures are a
// fixed-seed coin, whose longest run here is 11. A run of the old
// default's 5 comes every 62 checks on average (2^6 − 2), and that breaker
// opened at the fifth check, then reopened on each probe the coin failed,
// doubling its interval: the limit off most of the time. A run of 20 comes
// every 2^21 − 2 checks, 2.3 hours at 250 waves a second. The sidecar then
// stops answering: the breaker.failures-th wave of failures after its last
// answer opens the breaker.
func TestBreakerStaysClosedThroughABrownout(t *testing.T) {
	shipped, err := envoyconfig.Load("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse([]byte(shipped.Wasm.Configuration))
	if err != nil {
		t.Fatal(err)
	}
	h := newSharedHost()
	b := newBreaker(cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	now, run, longest := anchor, 0, 0
	for i := range 2000 {
		sent := now + ms
		failed := rng.IntN(2) == 0
		if failed {
			now = sent + 4*ms // the sidecar's 503 at its 4 ms deadline
			run++
			longest = max(longest, run)
		} else {
			now = sent + ms
			run = 0
		}
		if _, ev := b.record(h, failed, false, false, sent, now); ev != evNone {
			t.Fatalf("check %d of the brownout (a run of %d failures): event %d, want none: the breaker opened on a sidecar answering half its checks", i, run, ev)
		}
	}
	t.Logf("longest run of failures: %d", longest)
	// The last check it answers, then none.
	now += 2 * ms
	b.record(h, false, false, false, now-ms, now)
	n := int(cfg.Breaker.Failures)
	for i := range n {
		sent := now + ms
		now = sent + 5*ms
		_, ev := b.record(h, true, false, true, sent, now)
		if i == n-1 && ev != evOpened || i < n-1 && ev != evNone {
			t.Fatalf("failure %d of the outage: event %d", i+1, ev)
		}
	}
}
