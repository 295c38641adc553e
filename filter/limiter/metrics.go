package limiter

import "github.com/edgelimit/edgelimit/filter/abi"

// Metric names, as defined with proxy_define_metric; Envoy shows each as
// wasmcustom.<name>. Every request the filter decides is counted in one of
// the requests.* counters.
const (
	MetricAllowed         = "edgelimit.requests.allowed"
	MetricDenied          = "edgelimit.requests.denied"
	MetricDeniedCached    = "edgelimit.requests.denied_cached"
	MetricShadowAllowed   = "edgelimit.requests.shadow_allowed"
	MetricShadowWouldDeny = "edgelimit.requests.shadow_would_deny"
	MetricMissingKey      = "edgelimit.requests.missing_key"
	MetricInvalidKey      = "edgelimit.requests.invalid_key"
	// MetricUnknownKey counts requests refused because the sidecar does not
	// know the key (403: no plan lists it and there is no default plan).
	MetricUnknownKey = "edgelimit.requests.unknown_key"
	MetricUnchecked  = "edgelimit.requests.unchecked"
	// MetricPreflight counts CORS preflights (OPTIONS with Origin and
	// Access-Control-Request-Method) passed on uncharged: a browser sends
	// them without the key.
	MetricPreflight = "edgelimit.requests.preflight"
	// MetricFailedOpenPrefix + Reason.String() counts requests that failed
	// open, by reason.
	MetricFailedOpenPrefix = "edgelimit.requests.failed_open."
	// MetricCalloutLatency is a histogram of the time from dispatching the
	// callout to its answer, in microseconds (sub-millisecond callouts are
	// the norm, so milliseconds would mostly read 0).
	MetricCalloutLatency = "edgelimit.callout.latency_us"
	// MetricBreakerOpened counts the circuit breaker opening after
	// consecutive callout failures; MetricBreakerReopened, opening again
	// because its probe failed; MetricBreakerClosed, closing because its
	// probe got an answer. Each transition is counted once per process, by
	// the VM that made it.
	MetricBreakerOpened   = "edgelimit.breaker.opened"
	MetricBreakerReopened = "edgelimit.breaker.reopened"
	MetricBreakerClosed   = "edgelimit.breaker.closed"
	// MetricBreakerState is a gauge of the breaker's state: 0 closed, 1
	// open, 2 half-open (a probe is out). Set at each transition and
	// refreshed from the shared state at every tick (1 ms after start, then
	// every second until a warm-up round goes well, then every 10 s).
	MetricBreakerState = "edgelimit.breaker.state"
	// MetricLocalAllowed and MetricLocalDenied count requests the sidecar
	// could not decide that the local bucket admitted or answered 429
	// (on_failure "local"); each is also counted in failed_open.<reason>.
	MetricLocalAllowed = "edgelimit.requests.local_allowed"
	MetricLocalDenied  = "edgelimit.requests.local_denied"
	// MetricFailedCached counts callouts that failed (any reason) whose
	// request the deny cache then decided: each request is counted in
	// denied_cached (or shadow_would_deny) as well. With the
	// failed_open.<reason> counters, it makes every failed callout.
	MetricFailedCached = "edgelimit.callout.failed_cached"
	// MetricDenyEvicted counts deny cache entries still trusted (under
	// DenyTrust since their answer or re-ask) evicted from their full
	// shared-data key for another client's: the client's requests in the
	// rest of that trust go to the sidecar, until a 429 stores it again.
	// Each eviction is counted once per process, by the VM whose write
	// made it.
	MetricDenyEvicted = "edgelimit.deny_cache.evicted"
	// MetricLocalEvicted counts local buckets (on_failure "local")
	// evicted from their full shared-data key: the client is then held
	// only by the workers that remember its plan. Counted as
	// MetricDenyEvicted is.
	MetricLocalEvicted = "edgelimit.local_bucket.evicted"
)

type counter uint8

const (
	cAllowed counter = iota
	cDenied
	cDeniedCached
	cShadowAllowed
	cShadowWouldDeny
	cMissingKey
	cInvalidKey
	cUnknownKey
	cUnchecked
	cPreflight
	cFailedOpen // + Reason
)

const (
	cBreakerOpened = cFailedOpen + counter(numReasons) + iota
	cBreakerReopened
	cBreakerClosed
	cLocalAllowed
	cLocalDenied
	cFailedCached
	cDenyEvicted
	cLocalEvicted
	numCounters
)

// metrics holds the ids the host gave the filter's metrics. A metric the
// host refused to define is skipped, never fatal.
type metrics struct {
	counters   [numCounters]uint32
	defined    [numCounters]bool
	latency    uint32
	hasLatency bool
	state      uint32
	hasState   bool
}

// MetricNames lists every metric the filter defines.
func MetricNames() []string {
	names := make([]string, 0, numCounters+2)
	for c := counter(0); c < numCounters; c++ {
		names = append(names, counterName(c))
	}
	return append(names, MetricCalloutLatency, MetricBreakerState)
}

func counterName(c counter) string {
	switch c {
	case cAllowed:
		return MetricAllowed
	case cDenied:
		return MetricDenied
	case cDeniedCached:
		return MetricDeniedCached
	case cShadowAllowed:
		return MetricShadowAllowed
	case cShadowWouldDeny:
		return MetricShadowWouldDeny
	case cMissingKey:
		return MetricMissingKey
	case cInvalidKey:
		return MetricInvalidKey
	case cUnknownKey:
		return MetricUnknownKey
	case cUnchecked:
		return MetricUnchecked
	case cPreflight:
		return MetricPreflight
	case cBreakerOpened:
		return MetricBreakerOpened
	case cBreakerReopened:
		return MetricBreakerReopened
	case cBreakerClosed:
		return MetricBreakerClosed
	case cLocalAllowed:
		return MetricLocalAllowed
	case cLocalDenied:
		return MetricLocalDenied
	case cFailedCached:
		return MetricFailedCached
	case cDenyEvicted:
		return MetricDenyEvicted
	case cLocalEvicted:
		return MetricLocalEvicted
	}
	return MetricFailedOpenPrefix + Reason(c-cFailedOpen).String()
}

// define asks the host for every metric; it reports the first failure so
// that the caller can log it once.
func (m *metrics) define(h abi.Host) (failed string) {
	for c := counter(0); c < numCounters; c++ {
		id, s := h.DefineMetric(abi.MetricCounter, counterName(c))
		m.counters[c], m.defined[c] = id, s == abi.StatusOK
		if s != abi.StatusOK && failed == "" {
			failed = counterName(c) + ": " + s.String()
		}
	}
	id, s := h.DefineMetric(abi.MetricHistogram, MetricCalloutLatency)
	m.latency, m.hasLatency = id, s == abi.StatusOK
	if s != abi.StatusOK && failed == "" {
		failed = MetricCalloutLatency + ": " + s.String()
	}
	id, s = h.DefineMetric(abi.MetricGauge, MetricBreakerState)
	m.state, m.hasState = id, s == abi.StatusOK
	if s != abi.StatusOK && failed == "" {
		failed = MetricBreakerState + ": " + s.String()
	}
	return failed
}

func (m *metrics) inc(h abi.Host, c counter) { m.add(h, c, 1) }

func (m *metrics) add(h abi.Host, c counter, n int) {
	if m.defined[c] && n > 0 {
		h.IncrementMetric(m.counters[c], int64(n))
	}
}

func (m *metrics) failedOpen(h abi.Host, r Reason) {
	m.inc(h, cFailedOpen+counter(r))
}

func (m *metrics) recordLatency(h abi.Host, ns int64) {
	if m.hasLatency && ns >= 0 {
		h.RecordMetric(m.latency, uint64(ns/1000))
	}
}

func (m *metrics) recordState(h abi.Host, p breakerPhase) {
	if m.hasState {
		h.RecordMetric(m.state, uint64(p))
	}
}
