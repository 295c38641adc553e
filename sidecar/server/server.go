// Package server is the sidecar's HTTP face: POST /v1/check, GET /healthz,
// GET /readyz and GET /metrics, on fasthttp. Handle serves all four (the
// check listener); HandleAdmin serves the last three only (the admin
// listener, for probes and Prometheus).
//
// POST /v1/check answers, for the API key in x-api-key:
//
//	200 allowed, 429 denied          with the ratelimit headers below
//	400 malformed request            plain-text reason
//	403 unknown key, no default_plan
//	503 cannot decide now            Redis failed, or no answer within the deadline
//
// Headers on 200 and 429: ratelimit-limit (plan capacity), ratelimit-remaining
// (whole tokens left), ratelimit-reset (seconds until full, rounded up),
// x-ratelimit-tokens (exact tokens left), x-ratelimit-plan, x-ratelimit-rate
// (the plan's refill rate in tokens per second, formatted so that it parses
// back to the same float64; gateways bound an outage with it). On 429 also
// retry-after (seconds until cost tokens are back, rounded up, at least 1) and
// x-ratelimit-retry-after-ms (the same wait in milliseconds, rounded up to
// the next whole millisecond). A cost larger than the plan's capacity can
// never succeed: it gets 429 with x-ratelimit-never: true, no
// x-ratelimit-retry-after-ms (there is no such wait), and retry-after set to
// the seconds until the bucket is full (at least 1) so that every 429 carries
// retry-after as the contract says. It is a denial, not a 400, so that a
// gateway that fails open on errors still rejects it.
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

	"github.com/edgelimit/edgelimit/lua"
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
)

// DefaultTimeout is the default deadline for one decision.
const DefaultTimeout = 3 * time.Millisecond

// Decider makes decisions on Redis (decide.Decider in production).
type Decider interface {
	// Decide takes cost tokens from bucket key under limit l, or returns
	// an error wrapping context.DeadlineExceeded at deadline.
	Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error)
	// Ready reports whether decisions can be made now.
	Ready(ctx context.Context) error
}

// Options configure a Server.
type Options struct {
	Plans   func() *plans.Plans // the plans in force, read on every request
	Decider Decider
	Keys    *keys.Digester
	// Timeout is the sidecar's own deadline for one decision, counted from
	// the moment the request is read: past it the answer is 503 at once.
	// Defaults to DefaultTimeout (3 ms).
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
	errorLog throttle
}

// New returns a Server.
func New(o Options) *Server {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Server{o: o}
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
		bucket, limit = s.o.Hot.Route(bucket, hotClient.Regions, req.Region, limit, req.Cost)
	}

	res, err := s.o.Decider.Decide(start.Add(s.o.Timeout), bucket, limit, req.Cost)
	s.o.Stats.Latency.UpdateDuration(start)
	if err != nil {
		s.o.Stats.Errors.Inc()
		reason := "redis unavailable"
		if errors.Is(err, context.DeadlineExceeded) {
			s.o.Stats.RedisTimeouts.Inc()
			reason = "redis timeout"
		} else {
			s.o.Stats.RedisErrors.Inc()
		}
		s.errorLog.do(func(suppressed int64) {
			s.o.Log.Warn("decision failed, answering 503", "client", keys.LogID(bucket), "reason", reason, "err", err, "suppressed", suppressed)
		})
		text(ctx, fasthttp.StatusServiceUnavailable, reason)
		return
	}

	h := &ctx.Response.Header
	h.Set(HeaderLimit, plan.LimitHeader)
	h.Set(HeaderPlan, plan.Name)
	setInt(h, HeaderRemaining, int64(math.Floor(math.Max(res.Tokens, 0))))
	setInt(h, HeaderReset, ceilDiv(res.ResetAfter, time.Second))
	var num [32]byte
	h.SetBytesV(HeaderTokens, strconv.AppendFloat(num[:0], res.Tokens, 'f', -1, 64))
	// The plan's rate, not a hot client's region share: a gateway that
	// enforces the plan on its own during an outage needs the whole plan.
	// 'g' with -1 is the shortest form that parses back exactly.
	h.SetBytesV(HeaderRate, strconv.AppendFloat(num[:0], plan.Rate, 'g', -1, 64))
	switch {
	case res.Allowed:
		s.o.Stats.Allowed.Inc()
		ctx.SetStatusCode(fasthttp.StatusOK)
	case res.Never:
		// No wait helps; retry-after is still sent (the bucket's time to
		// full, a lower bound on anything changing) because gateways treat
		// a 429 without it as malformed and would fail open.
		s.o.Stats.Denied.Inc()
		h.Set(HeaderNever, "true")
		setInt(h, HeaderRetryAfter, max(1, ceilDiv(res.ResetAfter, time.Second)))
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	default:
		s.o.Stats.Denied.Inc()
		ms := ceilDiv(res.RetryAfter, time.Millisecond)
		setInt(h, HeaderRetryAfterMs, ms)
		setInt(h, HeaderRetryAfter, max(1, (ms+999)/1000))
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	}
	if s.o.Log.Enabled(context.Background(), slog.LevelDebug) {
		s.o.Log.Debug("decision", "client", keys.LogID(bucket), "plan", plan.Name, "cost", req.Cost,
			"allowed", res.Allowed, "tokens", res.Tokens, "retry_after", res.RetryAfter)
	}
}

func (s *Server) readyz(ctx *fasthttp.RequestCtx) {
	if err := s.o.Decider.Ready(context.Background()); err != nil {
		text(ctx, fasthttp.StatusServiceUnavailable, "not ready: "+err.Error())
		return
	}
	text(ctx, fasthttp.StatusOK, "ready")
}

// ceilDiv returns d/unit rounded up, and 0 for d <= 0.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}

func setInt(h *fasthttp.ResponseHeader, name string, v int64) {
	var num [20]byte
	h.SetBytesV(name, strconv.AppendInt(num[:0], v, 10))
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

// throttle lets through at most one log line per second; the lines it holds
// back are counted and reported with the next one. During an outage every
// request fails the same way, and one line per request would flood the log.
type throttle struct {
	next       atomic.Int64 // unix nanoseconds when the next line may go out
	suppressed atomic.Int64
}

func (t *throttle) do(log func(suppressed int64)) {
	now := time.Now().UnixNano()
	next := t.next.Load()
	if now < next || !t.next.CompareAndSwap(next, now+int64(time.Second)) {
		t.suppressed.Add(1)
		return
	}
	log(t.suppressed.Swap(0))
}
