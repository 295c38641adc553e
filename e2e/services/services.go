// Package services runs the upstream services of the benchmarks and the
// end-to-end tests, as they were before the edge limiter and as they are
// after it.
//
// A Service is one HTTP listener — the one endpoint a gateway cluster points
// at — in front of Replicas replica objects taken in turn (round-robin).
// Each replica keeps the state a separate process would: its own per-client
// token buckets (the per-service limiter of ADR-001, package bucket), its own
// coarse safety limit (package safety) and its own bounded worker pool
// (package pool). Round-robin inside one listener stands in for a load
// balancer over Replicas processes: what the benchmarks measure — how much
// each replica's limiter admits, how long each replica's queue grows —
// depends only on the share of the traffic each replica sees, and
// round-robin makes that share exactly 1/Replicas. One listener per service
// also keeps the gateway's clusters at one endpoint each, as envoy.yaml
// declares them.
//
// A replica handles a request in this order: count it (with the edge's
// shadow decision it carries, if any); the safety limit
// (429); the per-service limiter, whose decision is also compared with the
// edge's shadow decision when the request carries one (package shadow); in
// LimiterEnforce, its 429; the worker pool (503 when the queue is full);
// 200. GET /_stats and GET /_shadow on the listener report the counts as
// JSON, GET /metrics the totals in the Prometheus text format; none of them
// reach a replica.
package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/clientkey"
	"github.com/edgelimit/edgelimit/e2e/services/pool"
	"github.com/edgelimit/edgelimit/e2e/services/safety"
	"github.com/edgelimit/edgelimit/e2e/services/shadow"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// Mode is what the per-service limiter (ADR-001) does.
type Mode uint8

const (
	// LimiterOff runs no per-service limiter: the design with the edge.
	LimiterOff Mode = iota
	// LimiterEnforce gives every replica a bucket per client shaped by the
	// client's plan and answers 429 when it is empty: the old design.
	LimiterEnforce
	// LimiterObserve decides as LimiterEnforce does but never rejects; the
	// decision is only compared with the edge's shadow decision.
	LimiterObserve
)

func (m Mode) String() string {
	switch m {
	case LimiterOff:
		return "off"
	case LimiterEnforce:
		return "enforce"
	case LimiterObserve:
		return "observe"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode reads "off", "enforce" or "observe".
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{LimiterOff, LimiterEnforce, LimiterObserve} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("want off, enforce or observe, got %q", s)
}

// Config shapes a service. The zero value (with a Name) is a service of
// DefaultReplicas replicas that admits everything at once. With Replicas 1
// as well, it is the plain counting service of the end-to-end tests and the
// demo: 200 to every request, and per client what arrived and with which
// shadow decision.
type Config struct {
	Name string // reported in responses and stats; required
	// Replicas is how many replica objects share the listener. Defaults to
	// DefaultReplicas (3).
	Replicas int
	// Plans gives each client's plan. Required when Limiter is not
	// LimiterOff or SafetyFactor is set. A client without a plan is not
	// limited by the service.
	Plans safety.Plans
	// Limiter is the per-service limiter's mode. Defaults to LimiterOff.
	Limiter Mode
	// SafetyFactor, when > 0, puts every replica behind a coarse safety
	// limit of SafetyFactor times the client's plan (the design keeps 10).
	// Defaults to 0: none.
	SafetyFactor float64
	// Workers, Queue and ServiceTime give every replica a worker pool
	// (package pool). Workers 0, the default, means no pool: unbounded
	// capacity, no service time.
	Workers     int
	Queue       int
	ServiceTime time.Duration
	// Clock reads the time for the limiters. Defaults to time.Now.
	Clock func() time.Time
}

// DefaultReplicas is the replicas per service of the incident.
const DefaultReplicas = 3

func (c *Config) check() error {
	if c.Name == "" {
		return errors.New("name: required")
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Replicas < 1 {
		return fmt.Errorf("replicas: must be >= 1, got %d", c.Replicas)
	}
	if c.Limiter > LimiterObserve {
		return fmt.Errorf("limiter: want off, enforce or observe, got %v", c.Limiter)
	}
	if (c.Limiter != LimiterOff || c.SafetyFactor != 0) && c.Plans == nil {
		return fmt.Errorf("plans: required with limiter %v and safety factor %v", c.Limiter, c.SafetyFactor)
	}
	if c.SafetyFactor < 0 {
		return fmt.Errorf("safety factor: must be >= 0, got %v", c.SafetyFactor)
	}
	if c.Workers < 0 {
		return fmt.Errorf("workers: must be >= 0, got %d", c.Workers)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return nil
}

// Service is one running service: a listener and its replicas.
type Service struct {
	Name string
	Addr string // host:port it listens on

	replicas []*replica
	next     atomic.Uint64
	shadow   *shadow.Counter
	srv      *fasthttp.Server
}

// Start checks c and starts the service on addr ("127.0.0.1:0" for a free
// port).
func Start(addr string, c Config) (*Service, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("service %q: %w", c.Name, err)
	}
	s := &Service{Name: c.Name, shadow: shadow.NewCounter()}
	for i := 0; i < c.Replicas; i++ {
		r, err := newReplica(s, i, c)
		if err != nil {
			return nil, fmt.Errorf("service %q: %w", c.Name, err)
		}
		s.replicas = append(s.replicas, r)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("service %q: %w", c.Name, err)
	}
	s.Addr = l.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		json.NewEncoder(w).Encode(s.Stats())
	})
	mux.Handle("GET /_shadow", s.shadow.Handler())
	mux.HandleFunc("GET /metrics", s.metrics)
	reports := fasthttpadaptor.NewFastHTTPHandler(mux)
	// fasthttp's server, which reads a request and writes its answer on
	// the connection's goroutine: net/http's starts a goroutine per
	// request to watch the connection while the handler runs, and on the
	// 2-CPU machines the benchmarks run on, the services share the CPUs
	// with what is measured (e2e/bench/README.md has the numbers). The
	// reports go through net/http's handlers, adapted.
	s.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if report(ctx) {
				reports(ctx)
				return
			}
			// Round-robin: replica i gets requests i, i+R, i+2R, ...
			n := s.next.Add(1) - 1
			s.replicas[n%uint64(len(s.replicas))].handle(ctx)
		},
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// The read buffer bounds a request's headers: Envoy's default
		// limit (60 KiB) gets through, as up to 1 MiB did through
		// net/http's server. A request beyond it is answered 431.
		ReadBufferSize: 64 << 10,
		// No read timeout, as net/http's server had none while a
		// connection is idle: the gateway keeps its connections to the
		// service open between requests.
	}
	go s.srv.Serve(l)
	return s, nil
}

// report reports whether ctx asks for one of the service's reports
// (GET /_stats, /_shadow, /metrics) rather than a replica.
func report(ctx *fasthttp.RequestCtx) bool {
	if !ctx.IsGet() && !ctx.IsHead() {
		return false
	}
	switch string(ctx.Path()) {
	case "/_stats", "/_shadow", "/metrics":
		return true
	}
	return false
}

// Close stops the service, waiting up to 5 s for requests in flight.
func (s *Service) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.ShutdownWithContext(ctx)
}

// Shadow returns the comparison of the edge's shadow decisions with the
// replicas' own, per client.
func (s *Service) Shadow() shadow.Report { return s.shadow.Report() }

// ClientStats is what happened to one client's requests.
type ClientStats struct {
	Received      int64     `json:"received"`
	OK            int64     `json:"ok"`             // served: 200
	LimiterDenied int64     `json:"limiter_denied"` // 429 from the per-service limiter
	SafetyDenied  int64     `json:"safety_denied"`  // 429 from the safety limit
	Shed          int64     `json:"shed"`           // 503: the worker pool's queue was full
	First         time.Time `json:"first"`          // arrival of the first request
	Last          time.Time `json:"last"`           // arrival of the last request
	// The edge's shadow decisions the requests carried (package shadow),
	// counted whatever the per-service limiter, if any, made of them.
	ShadowAllow   int64 `json:"shadow_allow,omitempty"`
	ShadowDeny    int64 `json:"shadow_deny,omitempty"`
	ShadowUnknown int64 `json:"shadow_unknown,omitempty"`
	ShadowInvalid int64 `json:"shadow_invalid,omitempty"` // a value the filter never sends
}

// Shadowed returns how many of the requests carried the edge's shadow
// decision e; EdgeNone counts none.
func (c ClientStats) Shadowed(e shadow.Edge) int64 {
	switch e {
	case shadow.EdgeAllow:
		return c.ShadowAllow
	case shadow.EdgeDeny:
		return c.ShadowDeny
	case shadow.EdgeUnknown:
		return c.ShadowUnknown
	case shadow.EdgeInvalid:
		return c.ShadowInvalid
	}
	return 0
}

// Window returns the time from the first request to the last.
func (c ClientStats) Window() time.Duration { return c.Last.Sub(c.First) }

func (c *ClientStats) add(o ClientStats) {
	c.Received += o.Received
	c.OK += o.OK
	c.LimiterDenied += o.LimiterDenied
	c.SafetyDenied += o.SafetyDenied
	c.Shed += o.Shed
	c.ShadowAllow += o.ShadowAllow
	c.ShadowDeny += o.ShadowDeny
	c.ShadowUnknown += o.ShadowUnknown
	c.ShadowInvalid += o.ShadowInvalid
	if !o.First.IsZero() && (c.First.IsZero() || o.First.Before(c.First)) {
		c.First = o.First
	}
	if o.Last.After(c.Last) {
		c.Last = o.Last
	}
}

// ReplicaStats is one replica's counts.
type ReplicaStats struct {
	Clients map[string]ClientStats `json:"clients"`
	Pool    *pool.Stats            `json:"pool,omitempty"`
}

// Stats is a service's counts, replica by replica.
type Stats struct {
	Service  string         `json:"service"`
	Replicas []ReplicaStats `json:"replicas"`
}

// Client returns client's counts summed over the replicas.
func (s Stats) Client(client string) ClientStats {
	var c ClientStats
	for _, r := range s.Replicas {
		c.add(r.Clients[client])
	}
	return c
}

// Total returns every client's counts summed.
func (s Stats) Total() ClientStats {
	var c ClientStats
	for _, r := range s.Replicas {
		for _, v := range r.Clients {
			c.add(v)
		}
	}
	return c
}

// Stats returns a snapshot of the counts.
func (s *Service) Stats() Stats {
	st := Stats{Service: s.Name, Replicas: make([]ReplicaStats, len(s.replicas))}
	for i, r := range s.replicas {
		st.Replicas[i] = r.stats()
	}
	return st
}

// replica is one replica's state.
type replica struct {
	svc     *Service
	index   int
	clock   func() time.Time
	plans   safety.Plans
	mode    Mode
	buckets *bucket.Buckets
	safety  *safety.Limiter // nil: none
	pool    *pool.Pool      // nil: none

	mu      sync.Mutex
	clients map[string]*ClientStats
}

func newReplica(s *Service, i int, c Config) (*replica, error) {
	r := &replica{svc: s, index: i, clock: c.Clock, plans: c.Plans, mode: c.Limiter,
		buckets: bucket.New(c.Clock), clients: map[string]*ClientStats{}}
	if c.SafetyFactor > 0 {
		l, err := safety.New(safety.Config{Plans: c.Plans, Factor: c.SafetyFactor, Clock: c.Clock})
		if err != nil {
			return nil, err
		}
		r.safety = l
	}
	if c.Workers > 0 {
		p, err := pool.New(pool.Config{Workers: c.Workers, Queue: c.Queue, ServiceTime: c.ServiceTime})
		if err != nil {
			return nil, err
		}
		r.pool = p
	}
	return r, nil
}

// count applies f to client's counts under the lock.
func (r *replica) count(client string, f func(*ClientStats)) {
	r.mu.Lock()
	c := r.clients[client]
	if c == nil {
		c = &ClientStats{}
		r.clients[client] = c
	}
	f(c)
	r.mu.Unlock()
}

// answer is a replica's reply to a request.
type answer struct {
	status  int
	headers [][2]string
	body    []byte
}

// handle answers the request of ctx, its client named as
// clientkey.FromRequest names it.
func (r *replica) handle(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	a := r.serve(ctx, clientkey.Of(string(h.Peek(limiter.KeyHeader)), string(h.Peek(limiter.AuthorizationHeader))),
		shadow.ParseEdge(string(h.Peek(limiter.ShadowHeader))))
	ctx.SetStatusCode(a.status)
	for _, kv := range a.headers {
		ctx.Response.Header.Set(kv[0], kv[1])
	}
	ctx.SetBody(a.body)
}

// serve handles a request of client carrying the edge's shadow decision
// edge; ctx ends when the server stops.
func (r *replica) serve(ctx context.Context, client string, edge shadow.Edge) answer {
	now := r.clock()
	r.count(client, func(c *ClientStats) {
		c.Received++
		if c.First.IsZero() {
			c.First = now
		}
		c.Last = now
		switch edge {
		case shadow.EdgeAllow:
			c.ShadowAllow++
		case shadow.EdgeDeny:
			c.ShadowDeny++
		case shadow.EdgeUnknown:
			c.ShadowUnknown++
		case shadow.EdgeInvalid:
			c.ShadowInvalid++
		}
	})
	if r.safety != nil {
		if d, _ := r.safety.Allow(client); !d.Allowed {
			r.count(client, func(c *ClientStats) { c.SafetyDenied++ })
			h, body := safety.Denial(d, r.safety.Factor())
			return answer{http.StatusTooManyRequests, h, body}
		}
	}
	if r.mode != LimiterOff {
		if d, limited := r.decide(client); limited {
			r.svc.shadow.Record(client, edge, d.Allowed)
			if !d.Allowed && r.mode == LimiterEnforce {
				r.count(client, func(c *ClientStats) { c.LimiterDenied++ })
				return r.deny(d)
			}
		}
	}
	if r.pool != nil {
		switch err := r.pool.Serve(ctx); {
		case errors.Is(err, pool.ErrFull):
			r.count(client, func(c *ClientStats) { c.Shed++ })
			return answer{http.StatusServiceUnavailable, [][2]string{{"retry-after", "1"},
				{"content-type", "text/plain; charset=utf-8"}}, []byte("overloaded\n")}
		case err != nil:
			// The server is stopping: the request was not served.
			return answer{http.StatusServiceUnavailable, nil, nil}
		}
	}
	r.count(client, func(c *ClientStats) { c.OK++ })
	return answer{http.StatusOK, [][2]string{{"content-type", "application/json"}, {"x-replica", r.name()}},
		fmt.Appendf(nil, "{\"service\":%q,\"replica\":%d}\n", r.svc.Name, r.index)}
}

// decide runs the per-service limiter; limited is false for a request it
// has no plan for.
func (r *replica) decide(client string) (d bucket.Decision, limited bool) {
	if client == "" {
		return bucket.Decision{Allowed: true}, false
	}
	plan, ok := r.plans(client)
	if !ok {
		return bucket.Decision{Allowed: true}, false
	}
	d, err := r.buckets.Take(client, plan, 1)
	if err != nil {
		return bucket.Decision{Allowed: true}, false
	}
	return d, true
}

// deny is the per-service limiter's 429 for decision d.
func (r *replica) deny(d bucket.Decision) answer {
	h := [][2]string{{"content-type", "application/json"}, {"x-replica", r.name()}}
	secs := int64(1)
	if d.RetryAfter > time.Second {
		secs = int64((d.RetryAfter + time.Second - 1) / time.Second)
	}
	if !d.Never {
		h = append(h, [2]string{"retry-after", strconv.FormatInt(secs, 10)})
	}
	return answer{http.StatusTooManyRequests, h, fmt.Appendf(nil, "{\"error\":\"rate_limited\",\"replica\":%q}\n", r.name())}
}

func (r *replica) name() string { return r.svc.Name + "-" + strconv.Itoa(r.index) }

func (r *replica) stats() ReplicaStats {
	r.mu.Lock()
	st := ReplicaStats{Clients: make(map[string]ClientStats, len(r.clients))}
	for k, v := range r.clients {
		st.Clients[k] = *v
	}
	r.mu.Unlock()
	if r.pool != nil {
		ps := r.pool.Stats()
		st.Pool = &ps
	}
	return st
}

// metrics writes the service's totals in the Prometheus text format. Clients
// are not labels (their number is unbounded); /_stats and /_shadow have the
// per-client counts.
func (s *Service) metrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("content-type", "text/plain; version=0.0.4")
	t := s.Stats().Total()
	svc := strconv.Quote(s.Name)
	fmt.Fprintf(w, "# HELP service_requests_total Requests that reached the service, by outcome.\n# TYPE service_requests_total counter\n")
	for _, kv := range []struct {
		outcome string
		n       int64
	}{{"ok", t.OK}, {"limiter_denied", t.LimiterDenied}, {"safety_denied", t.SafetyDenied}, {"shed", t.Shed}} {
		fmt.Fprintf(w, "service_requests_total{service=%s,outcome=%q} %d\n", svc, kv.outcome, kv.n)
	}
	sh := s.shadow.Report().Total
	fmt.Fprintf(w, "# HELP service_shadow_comparisons_total The edge's shadow decisions against the per-service limiter's, by result.\n# TYPE service_shadow_comparisons_total counter\n")
	for _, kv := range []struct {
		result string
		n      int64
	}{{"agree", sh.Agree}, {"edge_denied_service_allowed", sh.EdgeDenied}, {"edge_allowed_service_denied", sh.EdgeAllowed}, {"edge_unknown", sh.Unknown}, {"invalid_header", sh.Invalid}} {
		fmt.Fprintf(w, "service_shadow_comparisons_total{service=%s,result=%q} %d\n", svc, kv.result, kv.n)
	}
}
