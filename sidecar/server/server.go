// Package server is the sidecar's HTTP face: POST /v1/check, POST /v1/warm,
// GET /healthz, GET /readyz and GET /metrics, on fasthttp. Handle serves
// them all (the check listener); HandleAdmin serves the last three only (the
// admin listener, for probes and Prometheus).
//
// POST /v1/check answers, for the API key in x-api-key:
//
//	200 allowed, 429 denied          with the ratelimit headers below
//	400 malformed request            plain-text reason
//	403 unknown key, no default_plan
//	503 cannot decide now            Redis failed, or no answer within the deadline
//
// Headers on 200 and 429 (Answer.Fill formats them): ratelimit-limit (plan
// capacity), ratelimit-remaining (whole tokens left), ratelimit-reset
// (seconds until full, rounded up), x-ratelimit-tokens (exact tokens left),
// x-ratelimit-plan, x-ratelimit-rate (the plan's refill rate in tokens per
// second, formatted so that it parses back to the same float64). On 429 also
// x-ratelimit-retry-after-ms (the exact wait in milliseconds, unrounded) and
// retry-after (whole seconds no earlier than it, at least 1). Nothing a
// gateway needs is sent only rounded: it can rebuild the bucket from the
// exact tokens and rate. A cost larger than the plan's capacity can never
// succeed: it gets 429 with x-ratelimit-never: true, no
// x-ratelimit-retry-after-ms (there is no such wait), and a retry-after (the
// seconds until full, at least 1) that only older gateways need. It is a
// denial, not a 400, so that a gateway that fails open on errors still
// rejects it.
package server

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/seconds"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/faillog"
	"github.com/edgelimit/edgelimit/sidecar/hot"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// Response headers of POST /v1/check.
const (
	HeaderLimit        = "ratelimit-limit"
	HeaderRemaining    = "ratelimit-remaining"
	HeaderReset        = "ratelimit-reset"
	HeaderTokens       = "x-ratelimit-tokens"
	HeaderPlan         = "x-ratelimit-plan"
	HeaderRate         = "x-ratelimit-rate"
	HeaderRetryAfter   = "retry-after"
	HeaderRetryAfterMs = "x-ratelimit-retry-after-ms"
	HeaderNever        = "x-ratelimit-never"
	HeaderBucketRate   = "x-ratelimit-bucket-rate"
)

// DefaultTimeout is the default deadline for one decision.
const DefaultTimeout = 4 * time.Millisecond

// Decider makes decisions on Redis: in production a denycache.Cache in
// front of a decide.Decider, or the Decider alone with -deny-cache=false.
type Decider interface {
	// Decide takes cost tokens from bucket key under limit l, or returns
	// an error wrapping context.DeadlineExceeded at deadline.
	Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error)
	// Ready reports whether decisions can be made now.
	Ready(ctx context.Context) error
	// Refused returns Redis's error reply to the latest check that took
	// tokens, if it came lately and no check was admitted since (Redis
	// refuses writes), else nil.
	Refused() error
}

// Options configure a Server.
type Options struct {
	Plans   func() *plans.Plans // the plans in force, read on every request
	Decider Decider
	Keys    *keys.Digester
	// Timeout is the sidecar's own deadline for one decision, counted from
	// the moment the request is read: past it the answer is 503 at once.
	// A check read Timeout or more after the proxy sent it, by its
	// x-ratelimit-sent, is answered 503 without a decision. Defaults to
	// DefaultTimeout (4 ms).
	Timeout time.Duration
	// Hot, if set, splits hot clients' buckets by region; without it a hot
	// client has one bucket like any other.
	Hot   *hot.Sharder
	Stats *stats.Stats // required
	Log   *slog.Logger // defaults to slog.Default()
}

// Server handles the sidecar's HTTP requests.
type Server struct {
	o        Options
	errorLog faillog.Log // failed decisions' lines: at most one a second, and their end
	sent     peerLags
	// stopping is set when the sidecar starts to shut down: its check
	// listener is closed or closing, so it cannot decide any more.
	stopping atomic.Bool
}

// Stopping makes /readyz answer 503 from now on: the sidecar is shutting
// down and its check listener no longer takes checks, whatever Redis says.
// /healthz is unchanged (the process still runs).
func (s *Server) Stopping() { s.stopping.Store(true) }

// New returns a Server.
func New(o Options) *Server {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{o: o}
	s.errorLog.Every = time.Second
	return s
}

// Handle is the fasthttp request handler.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch string(path) {
	case "/v1/check":
		if !ctx.IsPost() {
			methodNotAllowed(ctx, "POST")
			return
		}
		s.check(ctx)
	case "/v1/warm":
		if !ctx.IsPost() {
			methodNotAllowed(ctx, "POST")
			return
		}
		s.warm(ctx)
	default:
		s.HandleAdmin(ctx)
	}
}

// HandleAdmin is the admin listener's handler: GET /healthz, /readyz and
// /metrics, and 404 for anything else, /v1/check included, so that opening
// the admin port to the network never opens the decision endpoint.
func (s *Server) HandleAdmin(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/healthz":
		if getOrHead(ctx) {
			text(ctx, fasthttp.StatusOK, "ok")
		}
	case "/readyz":
		if getOrHead(ctx) {
			s.readyz(ctx)
		}
	case "/metrics":
		if getOrHead(ctx) {
			ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
			s.o.Stats.WritePrometheus(ctx)
		}
	default:
		text(ctx, fasthttp.StatusNotFound, "not found")
	}
}

func (s *Server) check(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	s.o.Stats.InFlight.Add(1)
	defer s.o.Stats.InFlight.Add(-1)
	req, err := ParseCheck(&ctx.Request.Header)
	if err != nil {
		s.o.Stats.BadRequests.Inc()
		text(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	p := s.o.Plans()
	// One digest finds a client listed by digest and names its bucket.
	sum := s.o.Keys.Sum(req.Key)
	plan, hotClient, ok := p.LookupSum(req.Key, sum)
	if !ok {
		s.o.Stats.UnknownKeys.Inc()
		text(ctx, fasthttp.StatusForbidden, "unknown api key")
		return
	}
	bucket := keys.BucketKeyOf(sum)
	limit := lua.Limit{Capacity: plan.Capacity, Rate: plan.Rate}
	if s.o.Hot != nil && hotClient != nil {
		bucket, limit = s.o.Hot.Route(start.Add(s.o.Timeout), bucket, hotClient.Regions, req.Region, limit, req.Cost)
	}

	waited, measured := s.waited(ctx, start, req.Sent)
	if measured {
		s.o.Stats.Wait.Update(waited.Seconds())
	}
	if waited >= s.o.Timeout {
		// It waited unread for its whole deadline, which leaves of the
		// proxy's wait (the filter's shipped 5 ms against the default 4)
		// only the answer's way back: no time is left to decide it in,
		// the proxy lets its request through, and a decision would only
		// take tokens for it. sidecar/RATIONALE.md, "Why does the sidecar
		// not decide a check the proxy has given up on?".
		s.o.Stats.Errors.Inc()
		s.o.Stats.Expired.Inc()
		text(ctx, fasthttp.StatusServiceUnavailable, "expired before it was read")
		return
	}
	res, err := s.o.Decider.Decide(start.Add(s.o.Timeout), bucket, limit, req.Cost)
	s.o.Stats.Latency.UpdateDuration(start)
	if err != nil {
		s.o.Stats.Errors.Inc()
		reason, logged := "redis unavailable", s.errorLog.Failed
		if errors.Is(err, context.DeadlineExceeded) {
			s.o.Stats.RedisTimeouts.Inc()
			reason, logged = "redis timeout", s.errorLog.TimedOut
		} else {
			s.o.Stats.RedisErrors.Inc()
		}
		if held, log := logged(start, 1); log {
			s.o.Log.Warn("decision failed, answering 503", "client", keys.LogID(bucket), "reason", reason, "err", err, "suppressed", held)
		}
		text(ctx, fasthttp.StatusServiceUnavailable, reason)
		return
	}
	if held, ended := s.errorLog.Succeeded(start); ended {
		s.o.Log.Info("decisions succeed again", "suppressed", held)
	}

	var a Answer
	a.FillBucket(res, plan, limit.Rate)
	a.SetHeaders(&ctx.Response.Header)
	ctx.SetStatusCode(a.Status)
	if res.Allowed {
		s.o.Stats.Allowed.Inc()
	} else {
		s.o.Stats.Denied.Inc()
	}
	if s.o.Log.Enabled(context.Background(), slog.LevelDebug) {
		s.o.Log.Debug("decision", "client", keys.LogID(bucket), "plan", plan.Name, "cost", req.Cost,
			"allowed", res.Allowed, "tokens", res.Tokens, "retry_after", res.RetryAfter)
	}
}

// waited is how long a request sent at sent (x-ratelimit-sent, 0 when
// absent) and read at start waited beyond the quickest trip from its
// address (sendLag), whose lag it records. measured is false, and the wait
// 0, without the header, for an address past the tracked ones, for a
// proxy clock too far off to tell a wait by, or for a request from this
// host sent after it was read.
func (s *Server) waited(ctx *fasthttp.RequestCtx, start time.Time, sent int64) (_ time.Duration, measured bool) {
	if sent == 0 {
		return 0, false
	}
	ip := ctx.RemoteIP()
	if sent > start.UnixMicro() && (ip.IsLoopback() || ip.Equal(ctx.LocalIP())) {
		// From this host (loopback, or the connection's own address: the
		// same network namespace) the proxy's clock is the sidecar's, and
		// nothing is read before it is sent. Such a lag is no trip, and
		// taken as the least it would have every check from the address
		// read as having waited: one request claiming a clock 50 s ahead
		// would have the proxy's checks answered 503 for 10-20 s.
		return 0, false
	}
	l := s.sent.of(ip, start)
	if l == nil {
		return 0, false
	}
	w, ok := l.waited(start, sent)
	if !ok {
		// The proxy's clock is more than maxLag from the sidecar's: its
		// checks' waits go unmeasured and unbounded.
		s.o.Stats.ClockOff.Inc()
	}
	return w, ok
}

// WarmLimit and WarmPlan are what a warm-up peeks with and answers with
// (exported for the filter's test support, which answers as the sidecar
// does; nothing changes them).
var (
	WarmLimit = lua.Limit{Capacity: 1, Rate: 1}
	WarmPlan  = plans.Plan{Name: "warm-up", Capacity: 1, Rate: 1, LimitHeader: "1"}
)

// warmWriteLimit is what a warm-up spends one token with while Redis
// refuses the checks' writes: a bucket so large and quick to refill that
// the spend is always admitted, so that it always writes (a denial would
// not). The bucket expires 2 s after (the script's ttl: capacity/rate
// plus 1 s).
var warmWriteLimit = lua.Limit{Capacity: 1e9, Rate: 1e9}

// warm answers a gateway's warm-up call (POST /v1/warm, the filter's
// warm_connections): a peek (cost 0) at keys.WarmBucket, which writes
// nothing, made and answered the way a check is (the decision queue, a
// pipeline to Redis, the script, the answer's headers), on the connection
// the call came on. A connection the gateway opened for its checks has then
// carried a check's whole path once before a client's check needs it
// within the 5 ms (filter/RATIONALE.md, "Why the filter opens its
// connections before the traffic", has the measurements). No decision is
// counted: sidecar_warm_ups_total is. The proxy's clock at the send
// (x-ratelimit-sent) counts towards the least lag from its address, as a
// check's does: each round tells the sidecar how quick the way from the
// proxy is, with or without clients.
//
// While Redis refuses the checks' writes (Decider.Refused: READONLY, OOM,
// NOPERM to the latest check that took tokens), Redis still answers a peek,
// so a peek's 200 would say the sidecar can decide when it cannot. The
// warm-up then spends a token of a bucket no client has
// (warmWriteLimit), a write as every admission makes: 503 while Redis
// refuses it, 200 (with a peek's answer) once it takes it, which also ends
// the refusal for /readyz as an admitted check does. The gateway's
// breaker keeps its open interval while the writes are refused, and ends
// it at the first warm-up round that finds them taken again.
func (s *Server) warm(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	sent, err := ParseSent(&ctx.Request.Header)
	if err != nil {
		s.o.Stats.BadRequests.Inc()
		text(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	s.waited(ctx, start, sent)
	if s.o.Decider.Refused() != nil {
		res, err := s.o.Decider.Decide(start.Add(s.o.Timeout), keys.WarmBucket, warmWriteLimit, 1)
		if err != nil || !res.Allowed {
			s.o.Stats.WarmUpErrors.Inc()
			reason := "checks refused"
			if errors.Is(err, context.DeadlineExceeded) {
				reason = "redis unavailable" // late, as a peek's failure says: nothing learnt of the writes
			}
			text(ctx, fasthttp.StatusServiceUnavailable, reason)
			return
		}
	}
	res, err := s.o.Decider.Decide(start.Add(s.o.Timeout), keys.WarmBucket, WarmLimit, 0)
	if err != nil {
		s.o.Stats.WarmUpErrors.Inc()
		text(ctx, fasthttp.StatusServiceUnavailable, "redis unavailable")
		return
	}
	s.o.Stats.WarmUps.Inc()
	var a Answer
	a.Fill(res, &WarmPlan)
	a.SetHeaders(&ctx.Response.Header)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

func (s *Server) readyz(ctx *fasthttp.RequestCtx) {
	if s.stopping.Load() {
		text(ctx, fasthttp.StatusServiceUnavailable, "not ready: shutting down")
		return
	}
	if err := s.o.Decider.Ready(context.Background()); err != nil {
		text(ctx, fasthttp.StatusServiceUnavailable, "not ready: "+err.Error())
		return
	}
	text(ctx, fasthttp.StatusOK, "ready")
}

// maxAnswerFields bounds the headers one answer carries (Fill writes eight
// at most, FillBucket nine).
const maxAnswerFields = 10

// Answer is the status and headers of a decided check, formatted without
// allocating (an Answer kept on the stack). It is exported so that the
// filter's behaviour table answers exactly as the sidecar does, down to the
// rounding, from the same code.
type Answer struct {
	Status int
	fields [maxAnswerFields]span
	n, end int
	// buf holds the values: a plan name (at most 64 bytes), the two numbers
	// in 'f' form, x-ratelimit-tokens and x-ratelimit-retry-after-ms, at
	// most 326 bytes each (a subnormal float64 written out: a float's
	// residue after a spend can take 33), and four integers and the two
	// rates ('g') of at most 24 each: 836 bytes at most.
	buf [1024]byte
}

type span struct {
	name     *headerName
	from, to int
}

// headerName is a response header's name, and the same in the form
// fasthttp writes it ("Ratelimit-Limit"), so that setting it skips
// fasthttp's normalizing of the name on every answer.
type headerName struct {
	name      string
	canonical []byte
}

func newHeaderName(name string) *headerName {
	c := []byte(name)
	upper := true
	for i, b := range c {
		switch {
		case upper && 'a' <= b && b <= 'z':
			c[i] = b - 'a' + 'A'
		case !upper && 'A' <= b && b <= 'Z':
			c[i] = b - 'A' + 'a'
		}
		upper = b == '-'
	}
	return &headerName{name, c}
}

var (
	nameLimit        = newHeaderName(HeaderLimit)
	nameRemaining    = newHeaderName(HeaderRemaining)
	nameReset        = newHeaderName(HeaderReset)
	nameTokens       = newHeaderName(HeaderTokens)
	namePlan         = newHeaderName(HeaderPlan)
	nameRate         = newHeaderName(HeaderRate)
	nameRetryAfter   = newHeaderName(HeaderRetryAfter)
	nameRetryAfterMs = newHeaderName(HeaderRetryAfterMs)
	nameNever        = newHeaderName(HeaderNever)
	nameBucketRate   = newHeaderName(HeaderBucketRate)
)

// Len is the number of headers Fill wrote.
func (a *Answer) Len() int { return a.n }

// Field returns header i; the value is a view of the Answer, valid until it
// is filled again.
func (a *Answer) Field(i int) (name string, value []byte) {
	f := a.fields[i]
	return f.name.name, a.buf[f.from:f.to]
}

// SetHeaders sets the answer's headers on h.
func (a *Answer) SetHeaders(h *fasthttp.ResponseHeader) {
	for _, f := range a.fields[:a.n] {
		h.SetCanonical(f.name.canonical, a.buf[f.from:f.to])
	}
}

func (a *Answer) put(name *headerName, v []byte) {
	n := copy(a.buf[a.end:], v)
	a.fields[a.n] = span{name, a.end, a.end + n}
	a.end += n
	a.n++
}

func (a *Answer) putString(name *headerName, v string) {
	n := copy(a.buf[a.end:], v)
	a.fields[a.n] = span{name, a.end, a.end + n}
	a.end += n
	a.n++
}

// Fill formats the answer to a check of plan that the script decided as res.
//
//   - ratelimit-limit: the capacity; ratelimit-remaining: whole tokens left
//     (floor); ratelimit-reset: seconds until full (ceiling of the exact ms);
//     x-ratelimit-tokens: the exact tokens ('f', shortest round trip);
//     x-ratelimit-plan; x-ratelimit-rate: the plan's rate ('g', shortest
//     round trip).
//   - 429 with a wait: x-ratelimit-retry-after-ms, the exact wait in ms
//     ('f', shortest round trip: "0.01", never rounded), and retry-after,
//     whole seconds no earlier than that wait (ceiling, at least 1).
//   - 429 that can never succeed (cost above capacity): x-ratelimit-never:
//     true, no x-ratelimit-retry-after-ms, and retry-after as the seconds
//     until full (at least 1), kept only for gateways older than this
//     contract, which read a 429 without retry-after as malformed and would
//     let the request through; current gateways tell the client no
//     Retry-After.
func (a *Answer) Fill(res lua.Result, plan *plans.Plan) {
	a.n, a.end = 0, 0
	var num [32]byte
	a.putString(nameLimit, plan.LimitHeader)
	a.putString(namePlan, plan.Name)
	a.put(nameRemaining, strconv.AppendInt(num[:0], int64(math.Floor(math.Max(res.Tokens, 0))), 10))
	a.put(nameReset, strconv.AppendInt(num[:0], seconds.Ceil(res.ResetMs), 10))
	a.put(nameTokens, strconv.AppendFloat(num[:0], res.Tokens, 'f', -1, 64))
	// The plan's rate, not a hot client's region share: a gateway that
	// enforces the plan on its own during an outage needs the whole plan.
	// 'g' with -1 is the shortest form that parses back exactly.
	a.put(nameRate, strconv.AppendFloat(num[:0], plan.Rate, 'g', -1, 64))
	switch {
	case res.Allowed:
		a.Status = fasthttp.StatusOK
	case res.Never:
		a.Status = fasthttp.StatusTooManyRequests
		a.putString(nameNever, "true")
		a.put(nameRetryAfter, strconv.AppendInt(num[:0], max(1, seconds.Ceil(res.ResetMs)), 10))
	default:
		a.Status = fasthttp.StatusTooManyRequests
		a.put(nameRetryAfterMs, strconv.AppendFloat(num[:0], res.RetryMs, 'f', -1, 64))
		a.put(nameRetryAfter, strconv.AppendInt(num[:0], max(1, seconds.Ceil(res.RetryMs)), 10))
	}
}

// FillBucket is Fill for a check decided on a bucket that refills at
// bucketRate tokens per second: a hot client's region bucket, refilling at
// its share of the plan's rate. When that is not the plan's rate it adds
// x-ratelimit-bucket-rate ('g', shortest round trip), the rate the exact
// tokens refill at, from which a gateway tells the client when its quota
// comes back (RateLimit's t, a cached denial's Retry-After); the plan's
// rate stays in x-ratelimit-rate for what describes the plan.
func (a *Answer) FillBucket(res lua.Result, plan *plans.Plan, bucketRate float64) {
	a.Fill(res, plan)
	if bucketRate != plan.Rate {
		var num [32]byte
		a.put(nameBucketRate, strconv.AppendFloat(num[:0], bucketRate, 'g', -1, 64))
	}
}

func text(ctx *fasthttp.RequestCtx, code int, body string) {
	ctx.SetStatusCode(code)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(body + "\n")
}

func getOrHead(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	methodNotAllowed(ctx, "GET, HEAD")
	return false
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	text(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
}
