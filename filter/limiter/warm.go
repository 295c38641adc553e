package limiter

import "github.com/edgelimit/edgelimit/filter/abi"

// Warm connections (filter/RATIONALE.md, "Why the filter opens its
// connections before the traffic"): a callout goes out on an idle HTTP/1.1
// connection of the proxy's pool to the sidecar cluster, or waits for a new
// one. The first burst after start would set up one connection per request
// at once, in the proxy, the kernel and the sidecar, all inside the 5 ms the
// check has. So each root context, on its first tick and on every tick
// after, makes warm_connections calls at once to the sidecar's
// POST /v1/warm, which takes a check's path through the sidecar and Redis
// without a client (a peek that writes nothing) and answers as a check
// does: the proxy opens as many connections as it has no idle one for,
// keeps them in its pool once answered, and each has carried a check's
// whole path once before a client's check needs it. A round that went
// wrong (a call refused, failed or still unanswered at the next tick: the
// sidecar is not up yet, or gone, or Redis down) is made again a second
// later instead of ten. The answers decide nothing: they reach no counter,
// and a failed one reaches no breaker. A 200 to a call sent after the
// circuit breaker (last) opened ends its open interval early
// (breaker.wake): the next request is the probe, so that checking resumes
// within about a second of the sidecar and Redis answering again rather
// than at the end of an interval of up to max_open_ms. It only brings the
// probe forward: the probe, a check, is still what closes the breaker, so a
// sidecar whose peeks Redis answers while it refuses the checks' writes
// (READONLY, OOM, an ACL user without hset) does not close it.

// warmPath is what a warm-up call asks the sidecar, with a POST and no
// body.
const warmPath = "/v1/warm"

// warmTimeoutMs bounds a warm-up call. Far above a check's timeout: a call
// that times out resets its stream, and the proxy closes the HTTP/1.1
// connection the call was to leave open; and below warmRetryMs, so that a
// round has ended by the next tick.
const warmTimeoutMs = 500

// firstTickMs is the first tick's delay after configuration: the warm-up
// goes out as soon as the proxy runs the root context's timers.
const firstTickMs = 1

// warmRetryMs is the tick period after a round whose outcome is not known
// good: the first one, and one that went wrong.
const warmRetryMs = 1000

// warmRound is a root context's last round of warm-up calls.
type warmRound struct {
	tokens []uint32 // its calls not answered yet
	failed bool     // one was refused, or answered other than 200, or rewarm asked for the next round a second away
	sent   int64    // when its calls went out (host clock, ns)
	// outage: requests failed open on the open breaker since the sidecar
	// last answered this VM; its next answer sends a round at once
	// (Limiter.rewarm).
	outage bool
}

// warm makes the root context's warm-up calls, and returns the tick period
// to run at until the next tick: tickPeriodMs if the round before this one
// went well, else warmRetryMs. A round stops at the first call the proxy
// refuses (no such cluster, or its circuit breaker full).
func (l *Limiter) warm(r *root, first bool) uint32 {
	cfg := r.cfg
	if cfg == nil || cfg.Mode == ModeOff || cfg.WarmConnections == 0 {
		return tickPeriodMs
	}
	period := uint32(tickPeriodMs)
	if first || r.warm.failed || len(r.warm.tokens) > 0 {
		period = warmRetryMs
	}
	r.warm.tokens, r.warm.failed, r.warm.sent = r.warm.tokens[:0], false, l.host.Now()
	for range cfg.WarmConnections {
		l.text.reset()
		l.encoded = r.warmCall.Append(l.encoded[:0], l.text.large(l.host.Now()/1000))
		token, st := l.host.HTTPCall(cfg.SidecarCluster, l.encoded, nil, nil, warmTimeoutMs)
		if st != abi.StatusOK {
			r.warm.failed = true
			return warmRetryMs
		}
		r.warm.tokens = append(r.warm.tokens, token)
	}
	return period
}

// warmHeaders is the header map of a warm-up call under cfg: the same for
// every call but the proxy's clock at the send (SentHeader), as a check
// carries it. The sidecar learns from it how quick the way from this proxy
// is, every round, whether or not clients are sending: what tells it a
// check that waited unread from one that did not (sidecar/RATIONALE.md,
// "Why does the sidecar not decide a check the proxy has given up on?").
func warmHeaders(cfg *Config) abi.PairsTemplate {
	return abi.NewPairsTemplate([][2]string{{":method", "POST"}, {":path", warmPath}, {":authority", cfg.SidecarAuthority}}, SentHeader)
}

// warmAnswer takes a warm-up call's answer off its round: anything but a
// 200 marks the round failed, a call that got no answer at all (no
// headers, so no :status) among them. A 200 says the sidecar and Redis
// answer: it brings the open breaker's probe forward (breaker.wake). The
// answer of a call from an earlier round, or no warm-up call at all, is
// ignored.
func (l *Limiter) warmAnswer(r *root, token uint32) {
	defer l.recoverLog("proxy_on_http_call_response")
	t := r.warm.tokens
	for i := range t {
		if t[i] != token {
			continue
		}
		t[i] = t[len(t)-1]
		r.warm.tokens = t[:len(t)-1]
		if st, _ := l.host.GetHeader(abi.MapHTTPCallResponseHeaders, ":status"); st != "200" {
			r.warm.failed = true
		} else if r.breaker.enabled() {
			r.breaker.wake(l.host, r.warm.sent, l.host.Now())
		}
		return
	}
}
