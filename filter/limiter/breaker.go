package limiter

import (
	"strconv"

	"github.com/edgelimit/edgelimit/filter/abi"
)

// The circuit breaker stops the filter from calling a sidecar that cannot
// answer, so that an outage does not add the callout timeout to every
// request. After Failures callouts in a row have failed (timeout, 503,
// reset, failed dispatch: breakerFailure), it opens: requests fail open at
// once (failed_open.circuit_open) without a callout. A failure counts only
// when the sidecar has given no answer since the failed callout went out:
// a callout that timed out while others, sent before or with it, were being
// answered was late because the proxy (or the sidecar) was busy with a
// burst, not because the sidecar is gone, and opening then would let the
// whole burst through unlimited.
// Nor does a timeout whose callback ran well after its deadline: the
// worker was too busy to run it on time, which is the proxy's own
// congestion, and the same congestion made the answer late. Once the open interval
// has passed, the first request is a probe and every other one keeps
// failing open until its answer: a probe that gets any answer from the
// sidecar closes the breaker, one that fails opens it again for twice as
// long, up to MaxOpenMs. A warm-up call (warm.go) answered 200, sent after
// the breaker last opened, ends the open interval at once (wake): the
// sidecar answered through Redis, so the next request probes instead of
// failing open for the rest of an interval that may be seconds long. Only
// the probe's answer closes the breaker.
//
// The state lives in proxy-wasm shared data, one value per sidecar cluster,
// so that every worker VM of the process opens together and a single probe
// goes out per process. Updates use compare-and-swap. filter/RATIONALE.md,
// "Why the circuit breaker is in the filter", has the reasons and the
// choice of defaults.

// BreakerConfig is the circuit breaker's configuration ("breaker").
type BreakerConfig struct {
	// Failures is how many callout failures in a row open the breaker;
	// 0 disables it. Defaults to 5.
	Failures uint32
	// MinOpenMs is how long the breaker first stays open, and again after
	// it closed. Defaults to 100.
	MinOpenMs uint32
	// MaxOpenMs caps the open interval, which doubles after each failed
	// probe. Defaults to 5000, or to MinOpenMs when that is larger.
	MaxOpenMs uint32
}

// Defaults and limits of the breaker's configuration.
const (
	DefaultBreakerFailures  = 20
	DefaultBreakerMinOpenMs = 100
	DefaultBreakerMaxOpenMs = 5000
	MaxBreakerFailures      = 10000
	MaxBreakerOpenMs        = 60000
)

type breakerPhase uint8

const (
	// phaseClosed: callouts go out; consecutive failures are counted.
	phaseClosed breakerPhase = iota
	// phaseOpen: no callouts until the interval has passed.
	phaseOpen
	// phaseHalfOpen: one probe is out; no other callouts until its answer
	// or until its lease runs out.
	phaseHalfOpen
	numPhases
)

// breakerState is the shared state of one sidecar cluster's breaker. Times
// are the host clock in nanoseconds.
type breakerState struct {
	phase breakerPhase
	// failures counts consecutive failed callouts while closed.
	failures uint32
	// interval is the length of the current (or last) open interval; 0
	// when closed.
	interval int64
	// until is when the open interval ends (open), or when the probe is
	// presumed lost (half-open); 0 when closed.
	until int64
	// since is when the breaker opened after being closed, for the log line
	// that reports the outage's length; while closed, when the streak's
	// last counted failure came back (0: no streak).
	since int64
}

// breakerEvent is a transition worth a metric or a log line.
type breakerEvent uint8

const (
	evNone breakerEvent = iota
	evOpened
	evReopened
	evClosed
)

// breakerFailure reports whether a failed callout counts against the
// sidecar: the answers that say it cannot decide now. A timeout, a 503 (no
// connection, or the sidecar cannot reach Redis), a reset and a failed
// dispatch count. Any answer the sidecar chose to give, a 200 or a 429 but
// also another status or a malformed one, came back promptly and counts as
// success: the breaker saves waiting, and such an answer costs no wait
// (its fault shows in failed_open.status and failed_open.malformed).
func breakerFailure(a *Answer) bool {
	if a.Outcome != FailedOpen {
		return false
	}
	switch a.Reason {
	case ReasonTimeout, ReasonUnavailable, ReasonReset, ReasonDispatch:
		return true
	}
	return false
}

// admit decides whether a callout may go out at now. A closed breaker
// admits every callout; an open one none until its interval has passed,
// then exactly one, the probe, which makes it half-open for lease (so
// that a probe whose answer never comes, because its VM went away, is
// replaced). next differs from st only when a probe is admitted.
func (st breakerState) admit(lease, now int64) (next breakerState, allow, probe bool) {
	switch st.phase {
	case phaseOpen:
		// A clock stepped back by more than the interval would keep the
		// breaker open longer than it was ever meant to be.
		if now < st.until && st.until-now <= st.interval {
			return st, false, false
		}
	case phaseHalfOpen:
		if now < st.until && st.until-now <= lease {
			return st, false, false
		}
	default:
		return st, true, false
	}
	st.phase, st.until = phaseHalfOpen, now+lease
	return st, true, true
}

// wake ends the open interval at now, so that the next request is the
// probe, when the sidecar answered at now a warm-up call sent at sentAt,
// after the breaker last opened (until − interval): a call sent before
// then may have been answered before the failure that opened it. It
// changes nothing but the open interval's end: a half-open
// breaker's probe is already out, and a failed probe still doubles the
// interval.
func (st breakerState) wake(sentAt, now int64) (breakerState, bool) {
	if st.phase != phaseOpen || now >= st.until || sentAt < st.until-st.interval {
		return st, false
	}
	st.until = now
	return st, true
}

// record applies the result, at now, of a callout sent at sentAt when the
// breaker admitted it (probe: as the probe). While closed, a failure adds
// to the streak only if its callout was sent at or after the streak's last
// counted failure came back (since): each counted failure was sent when the
// one before was already known, so the callouts of one wave, sent together
// before any of them came back, count once however many fail. While open, and while half-open for
// any callout but a probe, results change nothing: those callouts went out
// before the breaker opened and say nothing about the sidecar since.
func (st breakerState) record(b *BreakerConfig, failed, probe bool, sentAt, now int64) (breakerState, breakerEvent) {
	minOpen, maxOpen := msToNs(b.MinOpenMs), msToNs(max(b.MaxOpenMs, b.MinOpenMs))
	switch st.phase {
	case phaseClosed:
		if !failed {
			st.failures, st.since = 0, 0
			return st, evNone
		}
		switch {
		case st.failures == 0:
			st.failures, st.since = 1, now
		case sentAt < st.since && now >= st.since:
			// Of a wave already counted. A clock back before the last
			// counted failure (a step of the host's wall clock) says
			// nothing about waves: every callout sent since would read as
			// older than it, and none would count until the clock was
			// back there, the breaker closed throughout an outage.
			return st, evNone
		case st.failures < ^uint32(0):
			st.failures, st.since = st.failures+1, now
		}
		if st.failures < b.Failures {
			return st, evNone
		}
		return breakerState{phase: phaseOpen, interval: minOpen, until: now + minOpen, since: now}, evOpened
	case phaseHalfOpen:
		if !probe {
			return st, evNone
		}
		if !failed {
			return breakerState{}, evClosed
		}
		d := min(max(2*st.interval, minOpen), maxOpen)
		st.phase, st.interval, st.until = phaseOpen, d, now+d
		return st, evReopened
	}
	return st, evNone
}

func msToNs(ms uint32) int64 { return int64(ms) * 1e6 }

// breaker is one plugin's handle on the shared breaker of its sidecar
// cluster.
type breaker struct {
	cfg BreakerConfig
	key string
	// lease is how long a probe may stay unanswered before another request
	// probes: the callout timeout, after which Envoy always answers, plus
	// the first open interval.
	lease int64
	// answered is when this VM last received an answer from the sidecar
	// (host clock, ns). It is the VM's own, not shared: it needs no host
	// call, and in a burst every worker sees answers of its own.
	answered int64
	// late is how long after sentAt a timeout's callback may run and
	// still count: the callout timeout plus lateSlack.
	late int64
}

// lateSlack is how far past its deadline a timeout may be delivered and
// still say the sidecar did not answer. An idle worker runs its timer well
// within it even on a loaded machine; a worker later than that was busy.
const lateSlack = int64(1e6)

const (
	breakerFormat = 1
	breakerSize   = 30
	// breakerCASAttempts bounds the retries when another VM updated the
	// state between our read and write; giving up loses one count or one
	// probe, never a request.
	breakerCASAttempts = 4
	// maxBreakerInterval bounds an interval read from shared data.
	maxBreakerInterval = int64(MaxBreakerOpenMs) * 1e6
)

func newBreaker(c *Config) breaker {
	return breaker{
		cfg:   c.Breaker,
		key:   "edgelimit/breaker/v" + strconv.Itoa(breakerFormat) + "/" + c.SidecarCluster,
		lease: msToNs(c.TimeoutMs) + msToNs(c.Breaker.MinOpenMs),
		late:  msToNs(c.TimeoutMs) + lateSlack,
	}
}

func (b *breaker) enabled() bool { return b.cfg.Failures > 0 }

// load reads the shared state. A missing or unreadable value is a closed
// breaker with no failures: what cannot be read must not stop callouts.
func (b *breaker) load(h abi.Host) (breakerState, uint32) {
	v, cas, s := h.GetSharedData(b.key)
	if s != abi.StatusOK {
		return breakerState{}, cas
	}
	st, ok := decodeBreaker(v)
	if !ok {
		return breakerState{}, cas
	}
	return st, cas
}

// allow reports whether a callout may go out at now, and whether it is the
// probe.
func (b *breaker) allow(h abi.Host, now int64) (allow, probe bool) {
	for attempt := 0; attempt < breakerCASAttempts; attempt++ {
		st, cas := b.load(h)
		next, allow, probe := st.admit(b.lease, now)
		if !probe {
			return allow, false
		}
		switch h.SetSharedData(b.key, encodeBreaker(next), cas) {
		case abi.StatusOK:
			return true, true
		case abi.StatusCASMismatch:
			continue // another VM wrote first, maybe taking the probe: look again
		}
		// A host that cannot store the state cannot have opened the
		// breaker through it either.
		return true, false
	}
	return false, false
}

// counts reports whether a failed callout counts against the sidecar: a
// probe's always does; another's does unless the sidecar has answered one
// of this VM's callouts since it was sent, or it is a timeout whose
// callback ran late (the proxy's own congestion).
func (b *breaker) counts(probe, timedOut bool, sentAt, now int64) bool {
	return probe || !(sentAt < b.answered || timedOut && now-sentAt > b.late)
}

// record applies the result, at now, of a callout sent at sentAt
// (timedOut: Envoy's timeout ended it), and reports the state it found and
// the transition it made. A failure of a callout sent before the sidecar's
// latest answer changes nothing: the sidecar was answering after it left;
// neither does a timeout delivered more than lateSlack after its deadline
// (see the package comment above). Such a failure neither counts nor
// resets the count. A probe's result always counts: it is the one callout
// out.
func (b *breaker) record(h abi.Host, failed, probe, timedOut bool, sentAt, now int64) (breakerState, breakerEvent) {
	switch {
	case !failed:
		b.answered = max(b.answered, now)
	case !b.counts(probe, timedOut, sentAt, now):
		return breakerState{}, evNone
	}
	for attempt := 0; attempt < breakerCASAttempts; attempt++ {
		st, cas := b.load(h)
		next, ev := st.record(&b.cfg, failed, probe, sentAt, now)
		if next == st {
			return st, evNone // the common case, a success while closed: no write
		}
		switch h.SetSharedData(b.key, encodeBreaker(next), cas) {
		case abi.StatusOK:
			return st, ev
		case abi.StatusCASMismatch:
			continue
		}
		return st, evNone
	}
	return breakerState{}, evNone
}

// wake applies a warm-up call's 200, answered at now to a call sent at
// sentAt, to the shared state (breakerState.wake). Giving up after
// breakerCASAttempts leaves the interval as it was: its probe comes at its
// end.
func (b *breaker) wake(h abi.Host, sentAt, now int64) {
	for attempt := 0; attempt < breakerCASAttempts; attempt++ {
		st, cas := b.load(h)
		next, ok := st.wake(sentAt, now)
		if !ok || h.SetSharedData(b.key, encodeBreaker(next), cas) != abi.StatusCASMismatch {
			return
		}
	}
}

// Shared value: format byte, phase byte, failures (u32), interval, until,
// since (i64), little-endian. The zero state (closed, no streak), where a
// healthy breaker spends its life once it has been used, is the empty
// value: each request reads the state twice, and a proxy hands over an
// empty value without calling into the module for memory (Envoy's
// copyToPointerSize allocates nothing for it), where a value costs a
// proxy_on_memory_allocate call and a decode. A filter of the same format
// from before that change read the empty value as unreadable, which is the
// same closed breaker, and the 30 bytes it wrote for the zero state still
// decode.
func encodeBreaker(st breakerState) []byte {
	if st == (breakerState{}) {
		return nil
	}
	b := make([]byte, 0, breakerSize)
	b = append(b, breakerFormat, byte(st.phase),
		byte(st.failures), byte(st.failures>>8), byte(st.failures>>16), byte(st.failures>>24))
	b = appendU64(b, uint64(st.interval))
	b = appendU64(b, uint64(st.until))
	return appendU64(b, uint64(st.since))
}

// decodeBreaker reads a shared value; false for one it does not understand
// or whose numbers it cannot use.
func decodeBreaker(b []byte) (breakerState, bool) {
	if len(b) == 0 {
		return breakerState{}, true
	}
	if len(b) != breakerSize || b[0] != breakerFormat || b[1] >= byte(numPhases) {
		return breakerState{}, false
	}
	st := breakerState{
		phase:    breakerPhase(b[1]),
		failures: uint32(b[2]) | uint32(b[3])<<8 | uint32(b[4])<<16 | uint32(b[5])<<24,
		interval: int64(u64(b[6:])),
		until:    int64(u64(b[14:])),
		since:    int64(u64(b[22:])),
	}
	if st.interval < 0 || st.interval > maxBreakerInterval || st.until < 0 || st.since < 0 {
		return breakerState{}, false
	}
	return st, true
}
