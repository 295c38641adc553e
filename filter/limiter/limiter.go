// Package limiter is the rate-limit filter's logic in plain Go: the plugin
// configuration, API-key extraction, per-route costs, the sidecar callout
// and what each answer means, the shared deny cache, the circuit breaker on
// the callout, metrics and logs.
//
// It talks to the proxy only through abi.Host and implements abi.Plugin, so
// it runs unchanged inside Envoy (wired by filter/main.go) and natively
// behind the emulated host of package filter/filtertest/native.
package limiter

import (
	"slices"
	"strconv"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/internal/grpclocal"
)

// Names the filter uses on the wire.
const (
	// ShadowHeader tells the service the decision for a request that was not
	// enforced (shadow mode, or a non-canary client): "allow", "deny", or
	// "unknown" when the check failed open. A client's own copy is always
	// removed.
	ShadowHeader = "x-ratelimit-shadow"
	// KeyHeader is the request header holding the client's API key unless
	// api_key_header names another, and the header the callout hands the
	// key to the sidecar in.
	KeyHeader = "x-api-key"
	// AuthorizationHeader holds "Bearer <key>", the key of a request whose
	// key header is absent or empty.
	AuthorizationHeader = "authorization"
	// CheckPath is the sidecar endpoint of every callout.
	CheckPath = "/v1/check"
	// SentHeader carries the proxy's clock when it sent the check, in
	// whole microseconds since the epoch, so that the sidecar knows a check
	// that waited unread (the sidecar stopped or starved) past the
	// filter's timeout: its request was let through already, and a
	// decision must not take tokens for it.
	SentHeader = "x-ratelimit-sent"
)

// tickPeriodMs is how often each root context warms its connections to the
// sidecar and flushes throttled log lines.
const tickPeriodMs = 10000

// Limiter is the filter in one VM; it implements abi.Plugin. A VM is single
// threaded, so nothing here is locked; what VMs share goes through the host's
// shared data.
type Limiter struct {
	host    abi.Host
	roots   rootSet
	streams streamTable
	m       metrics
	defined bool

	// What the hot path reuses so that a request allocates nothing (see
	// RATIONALE.md, "Why the hot path does not allocate"): streams that
	// ended, the pairs of a callout's answer, the headers the filter hands
	// the host and the text of their values.
	free     []*stream
	pairs    [][2]string
	headers  [][2]string
	encoded  []byte // a callout's header map, as the host takes it
	text     text
	policies policyMemo
}

// root is one plugin configuration.
type root struct {
	cfg      *Config
	check    abi.PairsTemplate // the headers of a check's callout
	warmCall abi.PairsTemplate // the headers of a warm-up call (warm.go)
	cache    denyCache
	breaker  breaker
	local    *localLimiter // nil unless on_failure is "local"
	calls    streamTable   // pending callouts by token
	fails    failLog
	warm     warmRound
	tickMs   uint32 // the tick period last set; firstTickMs when a round is due at once (the first, or one rewarm brought forward)
}

func newRoot() *root { return &root{} }

// rootSet is the VM's root contexts by id: one per plugin configuration
// the VM runs, a few at most, so a slice looked through in order, which
// inside wasm costs a fraction of a map lookup (RATIONALE.md, "Why
// the stream tables are not maps"); two lookups a request.
type rootSet []rootEntry

type rootEntry struct {
	id uint32
	r  *root
}

// get returns id's root, nil if there is none.
func (rs rootSet) get(id uint32) *root {
	for i := range rs {
		if rs[i].id == id {
			return rs[i].r
		}
	}
	return nil
}

// put makes r id's root.
func (rs *rootSet) put(id uint32, r *root) {
	for i := range *rs {
		if (*rs)[i].id == id {
			(*rs)[i].r = r
			return
		}
	}
	*rs = append(*rs, rootEntry{id, r})
}

// remove forgets id's root, if any.
func (rs *rootSet) remove(id uint32) {
	for i := range *rs {
		if (*rs)[i].id == id {
			*rs = slices.Delete(*rs, i, i+1)
			return
		}
	}
}

// stream is one HTTP request.
type stream struct {
	id   uint32
	root *root
	// key is the client's API key, a copy in keyBuf: the host's value is
	// gone once the request callback returns, and the key is needed again
	// for the callout's answer.
	key     string
	keyBuf  [MaxKeyLen]byte
	cost    int64
	enforce bool
	token   uint32
	pending bool    // a callout is out and the request waits for it
	entry   bool    // the deny cache held an entry for the key (not denying this request)
	beyond  bool    // the cost is above that entry's capacity: asked, not counted as pending
	reask   bool    // the entry denies it but is past its trust: asked again, else denied by it
	counted bool    // the callout's cost is pending in a deny entry
	in      anchors // that entry
	probe   bool    // the callout is the circuit breaker's probe
	settled bool    // the filter has resumed or answered the request
	gone    bool    // the proxy deleted the stream; only its answer is left
	sentAt  int64   // when the callout was dispatched (host clock, ns)
	// The rate-limit headers set on the response once the request was
	// allowed, kept as their parts: the quota, whose plan is a copy in
	// planBuf (empty when too long to be a policy name, which names it
	// "default" all the same).
	limited bool
	quota   quota
	planBuf [maxPlanLen]byte
}

// newStream returns a stream for id, reusing one that ended when it can.
func (l *Limiter) newStream(id uint32, r *root) *stream {
	n := len(l.free)
	if n == 0 {
		return &stream{id: id, root: r}
	}
	s := l.free[n-1]
	l.free[n-1] = nil
	l.free = l.free[:n-1]
	*s = stream{id: id, root: r}
	return s
}

// maxFree bounds the streams kept for reuse: enough for the requests one VM
// has in flight in a burst; beyond it, ended streams are left to the garbage
// collector.
const maxFree = 1024

// release hands back a stream nothing refers to any more: it is out of the
// streams map and has no callout pending.
func (l *Limiter) release(s *stream) {
	if len(l.free) < maxFree {
		s.root = nil
		l.free = append(l.free, s)
	}
}

// New returns the filter for one VM. It makes no host call, so it may run
// from an init function.
func New(h abi.Host) *Limiter {
	return &Limiter{host: h, encoded: make([]byte, 0, calloutMapBytes)}
}

var _ abi.Plugin = (*Limiter)(nil)

// OnContextCreate registers a root context (parent 0) or a stream of one.
func (l *Limiter) OnContextCreate(id, parent uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				l.logPanic("proxy_on_context_create", r)
			}
		}
	}()
	if parent == 0 {
		l.roots.put(id, newRoot())
	} else if r := l.roots.get(parent); r != nil {
		l.streams.put(id, l.newStream(id, r))
	}
	done = true
}

// OnVMStart accepts any VM configuration; the filter reads none.
func (l *Limiter) OnVMStart(uint32, int) bool { return true }

// OnConfigure reads, validates and applies the plugin configuration. A bad
// one is logged ("edgelimit: invalid configuration: <why>") and rejected, so
// that Envoy refuses it.
func (l *Limiter) OnConfigure(rootID uint32, size int) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			l.logPanic("proxy_on_configure", r)
			ok = false
		}
	}()
	h := l.host
	r := l.roots.get(rootID)
	if r == nil {
		r = newRoot()
		l.roots.put(rootID, r)
	}
	var data []byte
	if size > 0 {
		b, s := h.GetBuffer(abi.BufferPluginConfiguration, 0, size)
		if s != abi.StatusOK {
			h.Log(abi.LogError, "edgelimit: cannot read the plugin configuration: "+s.String())
			return false
		}
		data = b
	}
	cfg, err := Parse(data)
	if err != nil {
		h.Log(abi.LogError, "edgelimit: invalid configuration: "+err.Error())
		return false
	}
	if !l.defined {
		if failed := l.m.define(h); failed != "" {
			h.Log(abi.LogWarn, "edgelimit: metric not defined: "+failed)
		}
		l.defined = true
	}
	r.cfg, r.cache, r.breaker = cfg, newDenyCache(cfg.SidecarCluster), newBreaker(cfg)
	r.check, r.warmCall = checkHeaders(cfg), warmHeaders(cfg)
	if r.local = newLocalLimiter(cfg); r.local != nil {
		r.local.m = &l.m
	}
	// The first tick comes at once, for the warm-up (warm.go); the ticks
	// after it come every second until a round of it went well, then every
	// tickPeriodMs.
	r.tickMs, r.warm = firstTickMs, warmRound{}
	h.SetTickPeriod(firstTickMs)
	h.Log(abi.LogInfo, "edgelimit: configured: "+cfg.Summary())
	return true
}

// OnRequestHeaders decides a request: it answers it at once (mode off, no
// key, cached denial, failed dispatch) or pauses it until the sidecar's
// answer.
func (l *Limiter) OnRequestHeaders(id uint32, _ int, _ bool) (act abi.Action) {
	s := l.streams.get(id)
	if s == nil || s.root.cfg == nil {
		return abi.ActionContinue
	}
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				l.logPanic("proxy_on_request_headers", r)
				l.panicOpen(s)
				l.forget(s)
				act = abi.ActionContinue
			}
		}
	}()
	act = l.check(s)
	done = true
	return act
}

func (l *Limiter) check(s *stream) abi.Action {
	h, cfg := l.host, s.root.cfg
	// The decision header is the filter's alone: a client's copy never
	// reaches the service.
	h.RemoveHeader(abi.MapRequestHeaders, ShadowHeader)
	if cfg.Mode == ModeOff {
		l.m.inc(h, cUnchecked)
		return abi.ActionContinue
	}
	keyHeader, kst := h.GetHeader(abi.MapRequestHeaders, cfg.APIKeyHeader)
	auth := ""
	if keyHeader == "" {
		auth, _ = h.GetHeader(abi.MapRequestHeaders, AuthorizationHeader)
	}
	key, ks := ExtractKey(keyHeader, auth)
	// The proxy reads the first of repeated headers; the service may read
	// another. Leave it only the key that was charged: Envoy's replace
	// removes every value of the name before adding one. A key header
	// that was not charged (an empty first value, the key taken from
	// authorization; or no valid key at all) is removed with every value
	// after it, so that `x-api-key:` followed by `x-api-key: <key>` cannot
	// hand the service a key that no bucket paid for.
	switch {
	case ks == KeyFound && keyHeader != "":
		h.ReplaceHeader(abi.MapRequestHeaders, cfg.APIKeyHeader, key)
	case kst == abi.StatusOK:
		h.RemoveHeader(abi.MapRequestHeaders, cfg.APIKeyHeader)
	}
	if ks != KeyFound {
		return l.noKey(s, ks)
	}
	s.key, s.cost, s.enforce = owned(s.keyBuf[:], key), 1, cfg.Enforced(key)
	if len(cfg.Costs) > 0 {
		method, _ := h.GetHeader(abi.MapRequestHeaders, ":method")
		path, _ := h.GetHeader(abi.MapRequestHeaders, ":path")
		s.cost = cfg.Cost(method, path)
	}
	now := h.Now()
	if act, denied := l.fromCache(s, now, true); denied {
		return act
	}
	// The deny cache comes first: it needs no sidecar, so a client it
	// denies stays denied while the breaker is open.
	if b := &s.root.breaker; b.enabled() {
		allow, probe := b.allow(h, now)
		if !allow {
			s.root.warm.outage = true
			if s.reask {
				// No one to ask: the entry still bounds the bucket.
				act, _ := l.fromCache(s, now, false)
				return act
			}
			if l.failOpen(s, ReasonCircuitOpen, "circuit breaker open", now) {
				return abi.ActionPause
			}
			return abi.ActionContinue
		}
		s.probe = probe
		if probe {
			l.m.recordState(h, phaseHalfOpen)
		}
	}
	return l.dispatch(s, now)
}

// isPreflight reports whether a request is a CORS preflight: method
// OPTIONS, a non-empty Origin and a non-empty
// Access-Control-Request-Method, what Envoy's CORS filter takes for one.
// An OPTIONS that lacks either header is an ordinary request.
func isPreflight(h abi.Host) bool {
	if m, _ := h.GetHeader(abi.MapRequestHeaders, ":method"); m != "OPTIONS" {
		return false
	}
	if v, _ := h.GetHeader(abi.MapRequestHeaders, "origin"); v == "" {
		return false
	}
	v, _ := h.GetHeader(abi.MapRequestHeaders, "access-control-request-method")
	return v != ""
}

func (l *Limiter) noKey(s *stream, ks KeyStatus) abi.Action {
	h := l.host
	// A browser's CORS preflight never carries the key (Fetch sends it
	// without credentials), so asking it for one would answer every
	// cross-origin call of a browser 401 before the call is made. It goes
	// on uncharged, without the key header (check removed it). Asked only
	// here, of a request without a key: the allowed path reads no more
	// headers for it, and a request with a key pays, whatever its method.
	if isPreflight(h) {
		l.m.inc(h, cPreflight)
		return abi.ActionContinue
	}
	c, body, details := cMissingKey, missingKeyBody, "edgelimit_missing_api_key"
	if ks == KeyInvalid {
		c, body, details = cInvalidKey, invalidKeyBody, "edgelimit_invalid_api_key"
	}
	l.m.inc(h, c)
	cfg := s.root.cfg
	if !cfg.RejectMissingKey {
		return abi.ActionContinue
	}
	// A request without a key is enforced only where every client is: in
	// mode shadow, and beside a canary list (which no missing key is in),
	// it runs in shadow like any client outside the list, and shadow never
	// rejects. The service is told what enforcement would do.
	if !cfg.Enforced("") {
		h.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "deny")
		return abi.ActionContinue
	}
	l.text.reset()
	l.send(401, details, []byte(body), append(l.headers[:0],
		[2]string{"www-authenticate", "Bearer"},
		[2]string{"content-type", ProblemContentType}), grpclocal.Unauthenticated, l.requestType(), "")
	s.settled = true
	return abi.ActionPause
}

// inFlightCost is the cost of r's callouts for key that are unanswered and
// were sent after the local time after: each may still spend its cost from
// the client's bucket, after any decision answered by then.
func (r *root) inFlightCost(key string, after int64) int64 {
	var c int64
	for i := range r.calls.slots {
		if s := r.calls.slots[i].s; s != nil && s.sentAt > after && s.key == key {
			c += s.cost
		}
	}
	return c
}

// fromCache answers the request 429 when the client's deny cache entry
// shows that the bucket cannot hold its cost now; otherwise it notes
// whether the client has an entry and leaves the request to the caller.
// With reask, an entry past its trust (DenyTrust) that would deny is asked
// about again by this request, if no other took that turn: the plan the
// entry's answer came from may have changed since.
func (l *Limiter) fromCache(s *stream, now int64, reask bool) (abi.Action, bool) {
	e, ok := s.root.cache.lookup(l.host, s.key)
	if !ok {
		return abi.ActionContinue, false
	}
	// A cost above the capacity the entry's answer gave can never succeed
	// on that plan: answered from the entry while it is trusted, as any
	// denial it makes is, and past that asked about, one a second per
	// client per process (reasks), so that a plan raised since is in force
	// within DenyTrust, as for every other cached denial. A burst of such
	// requests costs one callout a second, not one each. The callout is not
	// counted as pending (by the entry's plan it cannot spend), and its
	// answer, a never or a decision by the plan in force, replaces the
	// entry as any answer for a client with one does.
	if s.cost > e.limit {
		s.beyond = true
		if act, denied := l.cachedDeny(s, &e, 0, reask, now); denied {
			return act, true
		}
		s.entry = true
		return abi.ActionContinue, false
	}
	if e.denies(s.cost, now) {
		return l.cachedDeny(s, &e, 0, reask, now)
	}
	// The bucket may hold this request's cost, but not that and the costs
	// of the client's callouts already on their way, nor could it when
	// full: a burst past the bucket is answered here, not with a callout
	// per request that can only be denied (filter/RATIONALE.md, "Callouts
	// on their way"). Those the workers counted in the entry, or this
	// worker's own if it knows of more (a count lost to a race).
	if c := max(e.pending, s.root.inFlightCost(s.key, e.recv)); c > 0 && (s.cost+c > e.limit || e.denies(s.cost+c, now)) {
		return l.cachedDeny(s, &e, c, reask, now)
	}
	s.entry = true
	return abi.ActionContinue, false
}

// reasks reports whether a request the entry e denies is to be asked about
// instead: e is past its trust, or unsure (what the client spent
// elsewhere since e's answer would change its Retry-After), and this
// request took the turn to ask (denyCache.reask), so that a plan changed
// since e's answer is in force within DenyTrust of the change reaching the
// sidecar, and a client told to wait is told the wait Redis knows. Its
// answer replaces the entry, as any answer for a client with one does.
func (l *Limiter) reasks(s *stream, e *denyEntry, reask, unsure bool, now int64) bool {
	if !reask || e.trusted(now) && !unsure || !s.root.cache.reask(l.host, s.key, anchors{e.sent, e.recv}, unsure, now) {
		return false
	}
	s.entry, s.reask = true, true
	return true
}

// cachedDeny answers a request the deny cache denies, counting spent, the
// cost of the callouts in flight the denial counted, unless, with reask,
// the request is to be asked about instead (reasks): it then reports false
// and leaves the request to the caller.
func (l *Limiter) cachedDeny(s *stream, e *denyEntry, spent int64, reask bool, now int64) (abi.Action, bool) {
	q, retry, sure := e.reply(s.cost, spent, now)
	if l.reasks(s, e, reask, !sure, now) {
		return abi.ActionContinue, false
	}
	if !s.enforce {
		l.m.inc(l.host, cShadowWouldDeny)
		l.host.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "deny")
		return abi.ActionContinue, true
	}
	l.m.inc(l.host, cDeniedCached)
	l.deny(s, &q, retry, "edgelimit_rate_limited_cached")
	return abi.ActionPause, true
}

func (l *Limiter) dispatch(s *stream, now int64) abi.Action {
	cfg := s.root.cfg
	l.text.reset()
	l.encoded = s.root.check.Append(l.encoded[:0], s.key, l.text.int(s.cost), l.text.large(now/1000))
	token, st := l.host.HTTPCall(cfg.SidecarCluster, l.encoded, nil, nil, cfg.TimeoutMs)
	if st != abi.StatusOK {
		l.breakerResult(s.root, true, s.probe, ReasonDispatch, now, now)
		if s.reask {
			// A re-ask that could not go out: the entry still denies it.
			if act, denied := l.fromCache(s, now, false); denied {
				l.m.inc(l.host, cFailedCached)
				return act
			}
		}
		detail := "proxy_http_call failed: " + st.String()
		if st == abi.StatusBadArgument {
			// What Envoy answers for a cluster it does not have: the
			// filter sends every header it asks for.
			detail += ": the proxy has no cluster " + quote(cfg.SidecarCluster) + " (sidecar_cluster)"
		}
		if l.failOpen(s, ReasonDispatch, detail, now) {
			return abi.ActionPause
		}
		return abi.ActionContinue
	}
	s.token, s.pending, s.sentAt = token, true, now
	s.root.calls.put(token, s)
	if s.entry && !s.beyond {
		s.in, s.counted = s.root.cache.addPending(l.host, s.key, s.cost, now)
	}
	return abi.ActionPause
}

// calloutMapBytes is room for the largest header map of a check's
// callout, made at start so that it never grows under traffic
// (RATIONALE.md, "Why the hot path does not allocate"): with a 255-byte
// authority, a 64-byte region, a 256-byte key, a 7-digit cost and a
// 16-digit clock it comes to under 800 bytes.
const calloutMapBytes = 1024

// checkHeaders is the template of a check's callout headers under cfg:
// what is the same in every callout (method, path, authority, region)
// encoded once per configuration, the client's key and the request's cost
// filled in per callout (dispatch), and the proxy's clock when it is sent.
func checkHeaders(cfg *Config) abi.PairsTemplate {
	fixed := [][2]string{{":method", "POST"}, {":path", CheckPath}, {":authority", cfg.SidecarAuthority}}
	if cfg.Region != "" {
		fixed = append(fixed, [2]string{"x-ratelimit-region", cfg.Region})
	}
	return abi.NewPairsTemplate(fixed, KeyHeader, "x-ratelimit-cost", SentHeader)
}

// uncount takes a callout's cost off what its entry counts as pending once
// the callout is answered and the answer replaced no entry.
func (l *Limiter) uncount(s *stream) {
	if s.counted {
		s.counted = false
		s.root.cache.subPending(l.host, s.key, s.cost, s.in)
	}
}

// OnHTTPCallResponse applies the sidecar's answer to the request waiting for
// it. It runs on the root context: the stream becomes the effective context
// before it is resumed or answered.
func (l *Limiter) OnHTTPCallResponse(rootID, token uint32, numHeaders, bodySize, _ int) {
	r := l.roots.get(rootID)
	if r == nil {
		return
	}
	s := r.calls.remove(token)
	if s == nil {
		// A warm-up call's, or a request's that already failed open.
		l.warmAnswer(r, token)
		return
	}
	s.pending = false
	defer func() {
		if p := recover(); p != nil {
			l.logPanic("proxy_on_http_call_response", p)
			if !s.gone && !s.settled && l.host.SetEffectiveContext(s.id) == abi.StatusOK {
				l.panicOpen(s)
				l.resume(s)
			}
		}
	}()
	h := l.host
	now := h.Now()
	l.m.recordLatency(h, now-s.sentAt)
	a := l.answer(numHeaders)
	// The breaker learns from every answer, whether or not the client is
	// still there.
	l.breakerResult(r, breakerFailure(&a), s.probe, a.Reason, s.sentAt, now)
	r.local.learn(h, s, &a, now)
	// A denial is cached even when the client has gone: the next request
	// of the same client is spared a callout. An admission updates the
	// client's entry if it has one, so that what a cached denial tells the
	// client counts what it spent since; a client with no entry (the
	// healthy path) costs nothing here. A new entry counts nothing as
	// pending, this callout's cost included: every callout still on its
	// way was sent before this answer came.
	if a.Outcome == Denied || (a.Outcome == Allowed && s.entry) {
		if e, ok := newDenyEntry(s.key, s.cost, s.sentAt, now, &a); ok {
			stored, evicted := r.cache.store(h, e, now)
			l.m.add(h, cDenyEvicted, evicted)
			if stored {
				s.counted = false
			}
		}
	}
	if a.Outcome == UnknownKey && s.entry {
		// The key is in no plan now: no bucket of its old plan bounds
		// anything, and its next request is asked about.
		r.cache.drop(h, s.key, now)
	}
	l.uncount(s)
	if s.gone {
		l.release(s) // the answer was all that was left of it
		return
	}
	if a.Reason == ReasonUnavailable && a.Outcome == FailedOpen && s.root.fails.due(ReasonUnavailable, now) {
		// A 503 about to be logged says who answered it, read from its
		// body, which Envoy holds only while this callback runs.
		a.Detail = l.unavailableDetail(bodySize)
	}
	if h.SetEffectiveContext(s.id) != abi.StatusOK {
		return // nothing left to resume
	}
	switch a.Outcome {
	case Allowed:
		if s.enforce {
			l.m.inc(h, cAllowed)
			s.limited, s.quota = true, quotaOf(&a)
			s.quota.plan = ""
			if len(a.Plan) <= maxPlanLen {
				s.quota.plan = owned(s.planBuf[:], a.Plan)
			}
		} else {
			l.m.inc(h, cShadowAllowed)
			h.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "allow")
		}
	case Denied:
		if s.enforce {
			l.m.inc(h, cDenied)
			q := quotaOf(&a)
			// Retry-After is never earlier than the sidecar's (the exact
			// wait, rounded up) nor than t; a request that can never
			// succeed gets none.
			retry := int64(0)
			if !a.Never {
				retry = max(a.RetryAfter, q.next, 1)
			}
			l.deny(s, &q, retry, "edgelimit_rate_limited")
			return
		}
		l.m.inc(h, cShadowWouldDeny)
		h.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "deny")
	case UnknownKey:
		if s.enforce {
			l.m.inc(h, cUnknownKey)
			l.text.reset()
			l.send(403, "edgelimit_unknown_api_key", []byte(unknownKeyBody),
				append(l.headers[:0], [2]string{"content-type", ProblemContentType}), grpclocal.PermissionDenied,
				l.requestType(), "")
			s.settled = true
			return
		}
		l.m.inc(h, cShadowWouldDeny)
		h.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "deny")
	default:
		// The sidecar did not decide. What the deny cache has learned
		// since the callout went out decides as it would for a request
		// arriving now: a client known to be past its bucket is not let
		// through because its own check was late (in a burst, answers to
		// the client's other callouts came meanwhile). The rest fails
		// open. filter/RATIONALE.md, "A failed callout meets the deny
		// cache first".
		if act, denied := l.fromCache(s, now, false); denied {
			l.m.inc(h, cFailedCached)
			if act == abi.ActionPause {
				return // answered 429
			}
		} else if l.failOpen(s, a.Reason, a.Detail, now) {
			return
		}
	}
	l.resume(s)
}

// breakerResult feeds a callout's result to the root's circuit breaker and
// reports the transition it made: metrics, and a line when the breaker
// opens after being closed or closes again. A failure that counts, and the
// breaker closing, bring the next warm-up round forward (rewarm).
func (l *Limiter) breakerResult(r *root, failed, probe bool, reason Reason, sentAt, now int64) {
	b := &r.breaker
	if !b.enabled() {
		return
	}
	before, ev := b.record(l.host, failed, probe, reason == ReasonTimeout, sentAt, now)
	// The healthy path (an answer, the breaker closed and staying so)
	// ends here: what follows is a function of its own, kept out of the
	// path every allowed request takes.
	if failed || ev != evNone || r.warm.outage {
		l.breakerChanged(r, before, ev, failed, probe, reason, sentAt, now)
	}
}

// breakerChanged is what breakerResult does beyond recording a result: the
// warm-up rounds brought forward, and the metrics and log line of a
// transition.
//
//go:noinline
func (l *Limiter) breakerChanged(r *root, before breakerState, ev breakerEvent, failed, probe bool, reason Reason, sentAt, now int64) {
	b, h := &r.breaker, l.host
	switch {
	case ev == evClosed, !failed && r.warm.outage:
		r.warm.outage = false
		l.rewarm(r, firstTickMs)
	case failed && b.counts(probe, reason == ReasonTimeout, sentAt, now):
		l.rewarm(r, warmRetryMs)
	}
	switch ev {
	case evOpened:
		l.m.inc(h, cBreakerOpened)
		l.m.recordState(h, phaseOpen)
		h.Log(abi.LogWarn, "edgelimit: circuit breaker open: "+strconv.FormatUint(uint64(b.cfg.Failures), 10)+
			" callout failures in a row, the last "+reason.String()+"; no callouts for "+
			strconv.FormatUint(uint64(b.cfg.MinOpenMs), 10)+" ms")
	case evReopened:
		l.m.inc(h, cBreakerReopened)
		l.m.recordState(h, phaseOpen)
	case evClosed:
		l.m.inc(h, cBreakerClosed)
		l.m.recordState(h, phaseClosed)
		h.Log(abi.LogInfo, "edgelimit: circuit breaker closed: the sidecar answered after "+
			strconv.FormatInt(max(now-before.since, 0)/1e6, 10)+" ms")
	}
}

// rewarm brings the root context's next round of warm-up calls (warm.go)
// forward to ms from now, unless one comes sooner. A failure the breaker
// counts says the sidecar may be gone, and its connections with it (a
// sidecar that restarts closes every one): the rounds then come every
// second until one goes well, as after a round that went wrong, so that the
// connections are open again within a second of the sidecar's return
// instead of at the next 10 s round. The breaker closing, or the first
// answer after this VM let requests through on the open breaker, says the
// sidecar answers again: a round goes out at once. The period set is the
// root context's, from whichever context calls (a callout's answer runs on
// the root; a check that could not be sent, on its stream), as in Envoy.
func (l *Limiter) rewarm(r *root, ms uint32) {
	if r.cfg == nil || r.cfg.Mode == ModeOff || r.cfg.WarmConnections == 0 || r.tickMs <= ms {
		return
	}
	if l.host.SetTickPeriod(ms) == abi.StatusOK {
		r.warm.failed = true
		r.tickMs = ms
	}
}

// answer reads the callout response being delivered.
func (l *Limiter) answer(numHeaders int) Answer {
	if numHeaders == 0 {
		return failed(ReasonReset, "sidecar callout reset", 0)
	}
	hs, st := l.host.GetHeaders(abi.MapHTTPCallResponseHeaders, l.pairs[:0])
	l.pairs = hs
	if st != abi.StatusOK {
		return failed(ReasonMalformed, "sidecar response headers unreadable: "+st.String(), 0)
	}
	// The answer's strings are views of the host's buffer, good for this
	// callback: what outlives it (the plan) is copied by the caller.
	a := ParseAnswer(hs)
	clear(hs) // no view left behind in the reused slice
	return a
}

// unavailableDetail is the log line's detail for a 503, from at most
// maxDetailBody bytes of its body: whether the sidecar answered it or the
// proxy answered it for a sidecar it could not reach (UnavailableDetail).
// Read only for a line that will be written, so an outage costs one read
// per 10 s.
//
//go:noinline
func (l *Limiter) unavailableDetail(bodySize int) string {
	if bodySize <= 0 {
		return UnavailableDetail(nil)
	}
	b, st := l.host.GetBuffer(abi.BufferHTTPCallResponseBody, 0, min(bodySize, maxDetailBody))
	if st != abi.StatusOK {
		return UnavailableDetail(nil)
	}
	return UnavailableDetail(b)
}

func (l *Limiter) resume(s *stream) {
	s.settled = true
	l.host.ContinueStream(abi.StreamRequest)
}

// deny answers the request 429 with the rate-limit headers, Retry-After
// (seconds; 0 leaves it out: the request can never succeed) and a problem
// body; the request never reaches a service. To a gRPC request Envoy sends
// a trailers-only 200 instead (package grpclocal): its grpc-status is
// RESOURCE_EXHAUSTED, which gRPC clients do not retry unless told to, not
// the UNAVAILABLE Envoy maps a 429 to, which they retry at once; and
// grpc-retry-pushback-ms carries the wait to gRPC's retries (gRFC A6). A
// gRPC-Web request gets the same status and wait in its own form (send).
func (l *Limiter) deny(s *stream, q *quota, retry int64, details string) {
	t := &l.text
	t.reset()
	headers := appendRateLimitHeaders(l.headers[:0], t, q, &l.policies)
	if retry > 0 {
		headers = append(headers, [2]string{"retry-after", t.int(retry)})
	}
	ct := l.requestType()
	var wait string
	switch {
	case grpclocal.IsGRPC(ct):
		wait = pushback(t, retry)
		headers = append(headers, [2]string{PushbackHeader, wait})
	case grpclocal.IsGRPCWeb(ct):
		wait = pushback(t, retry) // in the body's trailer frame (send)
	}
	headers = append(headers, [2]string{"content-type", ProblemContentType})
	l.headers = headers
	m := len(t.b)
	t.b = appendQuotaProblem(t.b, q, s.cost, retry)
	l.send(429, details, t.b[m:], headers, grpclocal.ResourceExhausted, ct, wait)
	s.settled = true
}

// send answers the request itself: status, headers (content-type last),
// the problem body, and grpcStatus, which Envoy gives a gRPC request its
// trailers-only reply with (package grpclocal). A gRPC-Web request (ct,
// its content-type) is not gRPC to Envoy, and a browser's gRPC-Web client
// reads a call's status from the response body, not from the HTTP status:
// it gets a 200 of its own content-type whose body is a trailer frame
// holding grpc-status, grpc-message (the problem) and, for a 429,
// grpc-retry-pushback-ms (wait); the other headers stay. In the body, not
// the headers of a trailers-only reply, a page reads the status with
// Access-Control-Allow-Origin alone, whatever the CORS policy exposes.
// Appends to l.text, whose earlier strings headers may view.
func (l *Limiter) send(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32, ct, wait string) {
	if !grpclocal.IsGRPCWeb(ct) {
		l.host.SendLocalResponse(status, details, body, headers, grpcStatus)
		return
	}
	headers[len(headers)-1] = [2]string{"content-type", ct}
	t := &l.text
	m := len(t.b)
	text := grpclocal.IsGRPCWebText(ct)
	if wait != "" {
		t.b = grpclocal.AppendWebTrailers(t.b, int(grpcStatus), body, text, PushbackHeader, wait)
	} else {
		t.b = grpclocal.AppendWebTrailers(t.b, int(grpcStatus), body, text)
	}
	l.host.SendLocalResponse(200, details, t.b[m:], headers, grpcStatus)
}

// PushbackHeader is gRPC's server pushback (gRFC A6, client retries): a
// gRPC client whose retry policy retries the call's status waits this many
// milliseconds before its next attempt, and makes none when it is
// negative.
const PushbackHeader = "grpc-retry-pushback-ms"

// maxPushbackMs is the largest pushback gRFC A6 allows, a signed 32-bit
// integer of milliseconds (24.8 days).
const maxPushbackMs = 1<<31 - 1

// pushback is a 429's grpc-retry-pushback-ms: its Retry-After in
// milliseconds, so never earlier than the exact wait either; -1, do not
// retry, for a request that can never succeed (retry 0).
func pushback(t *text, retry int64) string {
	if retry <= 0 {
		return "-1"
	}
	return t.int(min(retry, maxPushbackMs/1000) * 1000)
}

// requestType is the request's content-type, which tells a gRPC or
// gRPC-Web request (package grpclocal), as Envoy tells one. Read only when
// the filter answers a request itself: the request headers are there
// until the request goes on.
func (l *Limiter) requestType() string {
	ct, _ := l.host.GetHeader(abi.MapRequestHeaders, "content-type")
	return ct
}

// failOpen lets the request through unlimited and says why: a counter per
// reason, a throttled log line, and "unknown" to the service when the
// request was not enforced. The caller resumes the request, unless failOpen
// reports that the local bucket (on_failure "local") answered it 429.
func (l *Limiter) failOpen(s *stream, r Reason, detail string, now int64) (answered bool) {
	l.m.failedOpen(l.host, r)
	s.root.fails.note(l.host, r, detail, now)
	if !s.enforce {
		l.host.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "unknown")
	}
	return l.localLimit(s, now)
}

// OnResponseHeaders adds the rate-limit headers to an allowed response.
// RateLimit and RateLimit-Policy that the service set itself are kept and
// the filter's item is added beside them (another field line, which is the
// same structured-field list): the draft lets an intermediary that enforces
// its own policy add it, never remove the service's. The legacy trio has
// room for one policy only; it is replaced by the edge's, which is the one
// enforced here.
func (l *Limiter) OnResponseHeaders(id uint32, _ int, _ bool) abi.Action {
	s := l.streams.get(id)
	if s == nil || !s.limited {
		return abi.ActionContinue
	}
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				l.logPanic("proxy_on_response_headers", r)
			}
		}
	}()
	l.text.reset()
	l.headers = appendRateLimitHeaders(l.headers[:0], &l.text, &s.quota, &l.policies)
	for i, hd := range l.headers {
		if i < 2 { // ratelimit-policy, ratelimit
			l.host.AddHeader(abi.MapResponseHeaders, hd[0], hd[1])
		} else {
			l.host.ReplaceHeader(abi.MapResponseHeaders, hd[0], hd[1])
		}
	}
	done = true
	return abi.ActionContinue
}

// OnTick warms the connections to the sidecar (warm.go) and reports
// fail-open log lines held back since the last report.
func (l *Limiter) OnTick(rootID uint32) {
	defer l.recoverLog("proxy_on_tick")
	if r := l.roots.get(rootID); r != nil {
		if p := l.warm(r, r.tickMs == firstTickMs); p != r.tickMs {
			r.tickMs = p
			l.host.SetTickPeriod(p)
		}
		r.fails.flush(l.host, l.host.Now())
		// Transitions set the gauge as they happen; VMs racing may leave
		// it behind the shared state, so the tick sets it again.
		if r.breaker.enabled() {
			st, _ := r.breaker.load(l.host)
			l.m.recordState(l.host, st.phase)
		}
	}
}

// OnDelete forgets a stream or a root context. A stream's pending callout
// stays registered until its answer comes (Envoy always delivers one), so
// that a denial still reaches the deny cache.
func (l *Limiter) OnDelete(id uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				l.logPanic("proxy_on_delete", r)
			}
		}
	}()
	if s := l.streams.remove(id); s != nil {
		s.gone = true
		if !s.pending {
			l.release(s)
		}
	} else {
		l.roots.remove(id)
	}
	done = true
}

// forget drops a stream's pending callout so that its answer is ignored: the
// request has already failed open.
func (l *Limiter) forget(s *stream) {
	if s.pending {
		s.root.calls.remove(s.token)
		s.pending = false
		l.uncount(s)
	}
}

// recoverLog is the deferred recovery of the callbacks that run rarely.
// The hot ones defer a closure of their own that calls recover only when
// the callback did not finish (a flag set at its end): recover stops a
// panic only when the deferred function calls it itself, and inside wasm
// each call costs (filter/RATIONALE.md, "What a request costs inside
// wasm").
func (l *Limiter) recoverLog(where string) {
	if r := recover(); r != nil {
		l.logPanic(where, r)
	}
}

// panicOpen counts a request whose callback panicked as failed open, and
// tells the service "unknown" as failOpen does, unless the request is
// enforced: known to be, or, when the panic came before its key was read,
// because every client is. The caller lets the request go on.
func (l *Limiter) panicOpen(s *stream) {
	l.m.failedOpen(l.host, ReasonInternal)
	if cfg := s.root.cfg; !s.enforce && cfg.Mode != ModeOff && !cfg.Enforced("") {
		l.host.ReplaceHeader(abi.MapRequestHeaders, ShadowHeader, "unknown")
	}
}

// logPanic logs a recovered panic. Nothing in the filter should panic; if
// something does, the request fails open and the line says where.
func (l *Limiter) logPanic(where string, r any) {
	l.host.Log(abi.LogCritical, "edgelimit: internal error in "+where+": "+abi.PanicMessage(r)+"; failing open")
}

// Summary describes the configuration in one line for the start-up log; it
// counts canary clients rather than listing their keys.
func (c *Config) Summary() string {
	missing := "reject"
	if !c.RejectMissingKey {
		missing = "allow"
	}
	return "mode=" + c.Mode.String() +
		" sidecar_cluster=" + c.SidecarCluster +
		" sidecar_authority=" + c.SidecarAuthority +
		" timeout_ms=" + strconv.FormatUint(uint64(c.TimeoutMs), 10) +
		" api_key_header=" + c.APIKeyHeader +
		" on_missing_key=" + missing +
		" canary_clients=" + strconv.Itoa(len(c.CanaryClients)) +
		" costs=" + strconv.Itoa(len(c.Costs)) +
		" region=" + c.Region +
		" breaker_failures=" + strconv.FormatUint(uint64(c.Breaker.Failures), 10) +
		" breaker_open_ms=" + strconv.FormatUint(uint64(c.Breaker.MinOpenMs), 10) +
		"-" + strconv.FormatUint(uint64(c.Breaker.MaxOpenMs), 10) +
		" warm_connections=" + strconv.FormatUint(uint64(c.WarmConnections), 10) +
		" on_failure=" + c.OnFailure.String()
}

// failLogInterval is the least time between two log lines for the same
// fail-open reason.
const failLogInterval = 10 * int64(1e9)

// failLog throttles fail-open log lines to one per reason per
// failLogInterval; the failures in between are counted and reported with
// the next line, or by the next tick once the interval has passed.
type failLog struct {
	last       [numReasons]int64
	logged     [numReasons]bool
	suppressed [numReasons]int64
}

// due reports whether a failure for r now would be logged rather than
// held back: what only its line needs is read only then.
func (f *failLog) due(r Reason, now int64) bool {
	return !f.logged[r] || now < f.last[r] || now-f.last[r] >= failLogInterval
}

func (f *failLog) note(h abi.Host, r Reason, detail string, now int64) {
	if !f.due(r, now) {
		f.suppressed[r]++
		return
	}
	msg := "edgelimit: failing open (" + r.String() + "): " + detail
	if n := f.suppressed[r]; n > 0 {
		msg += "; " + strconv.FormatInt(n, 10) + " more since the last report"
	}
	h.Log(abi.LogWarn, msg)
	f.last[r], f.logged[r], f.suppressed[r] = now, true, 0
}

func (f *failLog) flush(h abi.Host, now int64) {
	for r := Reason(0); r < numReasons; r++ {
		n := f.suppressed[r]
		if n == 0 || (now >= f.last[r] && now-f.last[r] < failLogInterval) {
			continue
		}
		h.Log(abi.LogWarn, "edgelimit: failing open ("+r.String()+"): "+
			strconv.FormatInt(n, 10)+" more since the last report")
		f.last[r], f.suppressed[r] = now, 0
	}
}
