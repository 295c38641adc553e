package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/envoy/wasmhost"
)

// routerListener serves a listener without the wasm filter, as Envoy serves
// a connection manager whose only HTTP filter is the router: the first
// route that matches the request sends it to its cluster or answers it
// directly, no match is a 404. envoy.yaml's stats listener is one, routing
// /stats/prometheus and /ready to the admin.
type routerListener struct {
	g    *gateway
	name string
	addr string // as configured at start; bound once
	// network is what addr is bound on (envoyconfig.ListenNetwork).
	network string
	// http.<stat_prefix>.downstream_rq_total and _<class>xx; rq_total,
	// the router's, which has every request here (no filter before it).
	rqTotal  lazyCounter
	rqClass  *classCounters
	rqRouted lazyCounter
}

func newRouterListener(g *gateway, l envoyconfig.Listener) *routerListener {
	prefix := "http." + l.StatPrefix + ".downstream_rq_"
	return &routerListener{g: g, name: l.Name, addr: l.Address, network: envoyconfig.ListenNetwork(l.Address, l.IPv4Compat),
		rqTotal:  lazyCounter{c: &g.counters, name: prefix + "total"},
		rqClass:  newClassCounters(&g.counters, prefix),
		rqRouted: lazyCounter{c: &g.counters, name: "http." + l.StatPrefix + ".rq_total"}}
}

// routes returns this listener's routes in a generation's configuration
// (none if a reload removed the listener: every request is then a 404).
func (l *routerListener) routes(gen *generation) []envoyconfig.Route {
	for _, c := range gen.cfg.Listeners {
		if c.Name == l.name {
			return c.Routes
		}
	}
	return nil
}

func (l *routerListener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g := l.g
	if r.ProtoMajor == 2 && refuseHTTP2(w, r, g.log) {
		return
	}
	x := &exchange{start: time.Now()}
	l.rqTotal.inc()
	l.rqRouted.inc()
	defer func() {
		if x.status != 0 {
			l.rqClass.inc(x.status)
		}
		g.writeAccessLog(r, x)
	}()
	gen := g.acquire()
	defer gen.release()
	// No normalize_path here: envoy.yaml's stats listener sets none, and
	// its routes are exact paths.
	path := r.URL.RequestURI()
	fw := g.forward(r, gen, l.routes(gen), path, requestHeaders(r, path), x)
	defer fw.done()
	if fw.resp == nil {
		if fw.status != 0 {
			g.writeReply(w, x, localHeaders(fw.status, fw.body), []byte(fw.body))
		}
		return
	}
	x.details = "via_upstream"
	g.writeHeaders(w, x, responseHeaders(fw.resp, fw.start))
	if err := copyBody(w, fw.resp.Body, fw.resp.ContentLength); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// forwarded is what Envoy's router did with a request: the upstream's
// response (resp, sent at start), or an answer of its own (status and
// body: no route, a direct response, an upstream failure), or nothing to
// send (status 0: the client went away). done releases it.
type forwarded struct {
	resp   *http.Response
	start  time.Time
	status int
	body   string
	cancel context.CancelFunc
}

func (f *forwarded) done() {
	if f.resp != nil {
		f.resp.Body.Close()
	}
	if f.cancel != nil {
		f.cancel()
	}
}

// forward is Envoy's router: the first of routes that matches path sends
// the request, with headers, to its cluster or answers it with its direct
// response; no match is a 404. x records which.
func (g *gateway) forward(r *http.Request, gen *generation, routes []envoyconfig.Route, path string,
	headers []wasmhost.Header, x *exchange) forwarded {
	rt, ok := matchRoute(routes, path)
	switch {
	case !ok:
		x.details = "route_not_found"
		return forwarded{status: http.StatusNotFound}
	case rt.Direct != nil:
		x.details = "direct_response"
		return forwarded{status: rt.Direct.Status, body: rt.Direct.Body}
	}
	u := gen.clusters[rt.Cluster].up
	x.cluster = rt.Cluster
	u.stats.total.inc()
	ctx, cancel := context.WithTimeout(r.Context(), routeTimeout)
	f := forwarded{start: time.Now(), cancel: cancel}
	idle := newIdleTimer(ctx, gen.cfg.StreamIdleTimeout)
	if idle != nil {
		ctx, f.cancel = idle.ctx, func() { idle.stop(); cancel() }
		if r.Body != nil && r.Body != http.NoBody {
			rr := *r
			rr.Body = idleBody{r.Body, idle}
			r = &rr
		}
	}
	resp, err := u.roundTrip(ctx, r, headers)
	if err != nil {
		if idle.fired() && r.Context().Err() == nil {
			// Envoy's connection manager, before any response began: 408
			// "stream timeout", through the filters' encoder path.
			x.details = "stream_idle_timeout"
			f.status, f.body = http.StatusRequestTimeout, "stream timeout"
			return f
		}
		f.status, f.body = g.upstreamFailure(r, u, x, err)
		return f
	}
	u.stats.class.inc(resp.StatusCode)
	if idle != nil {
		idle.touch()
		resp.Body = idleBody{resp.Body, idle}
	}
	f.resp = resp
	return f
}

// errStreamIdle ends an upstream exchange idle for stream_idle_timeout.
var errStreamIdle = errors.New("stream_idle_timeout")

// idleTimer is Envoy's stream_idle_timeout on the router's part of a
// stream: the exchange with the service is ended (ctx cancelled) once
// neither the request's body nor the response has moved for d. Envoy's
// timer runs from the request to the end of the response, reset by every
// headers and data frame either way, so a service silent for longer gets
// the client a 408 (the response not begun) or a reset (begun), before the
// route's 15 s timeout.
type idleTimer struct {
	ctx context.Context
	d   time.Duration
	t   *time.Timer
}

// newIdleTimer starts an idleTimer on parent, nil for d 0 (disabled, as
// in Envoy).
func newIdleTimer(parent context.Context, d time.Duration) *idleTimer {
	if d <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(parent)
	return &idleTimer{ctx: ctx, d: d, t: time.AfterFunc(d, func() { cancel(errStreamIdle) })}
}

func (i *idleTimer) touch() { i.t.Reset(i.d) }
func (i *idleTimer) stop()  { i.t.Stop() }

// fired reports whether the timer ended the exchange.
func (i *idleTimer) fired() bool {
	return i != nil && errors.Is(context.Cause(i.ctx), errStreamIdle)
}

// idleBody is a body whose every read resets the stream's idle timer.
type idleBody struct {
	io.ReadCloser
	idle *idleTimer
}

func (b idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.idle.touch()
	}
	return n, err
}

// matchRoute is the first route that matches path, as Envoy picks it.
func matchRoute(routes []envoyconfig.Route, path string) (envoyconfig.Route, bool) {
	for _, rt := range routes {
		if rt.Matches(path) {
			return rt, true
		}
	}
	return envoyconfig.Route{}, false
}

// localHeaders are the headers of a reply Envoy makes itself: a body is
// text/plain with its length.
func localHeaders(status int, body string) []wasmhost.Header {
	h := []wasmhost.Header{{":status", strconv.Itoa(status)}}
	if body != "" {
		h = append(h, wasmhost.Header{"content-length", strconv.Itoa(len(body))}, wasmhost.Header{"content-type", "text/plain"})
	}
	return h
}

// upstreamFailure counts a request to u that got no response and returns
// the router's answer: its status and body, or status 0 when the client
// went away and nothing is sent.
func (g *gateway) upstreamFailure(r *http.Request, u *upstream, x *exchange, err error) (int, string) {
	switch {
	case errors.Is(err, errUpstreamRequest):
		x.details = "upstream_request_invalid"
		return http.StatusBadRequest, ""
	case r.Context().Err() != nil:
		x.details = "downstream_remote_disconnect"
		return 0, ""
	case errors.Is(err, context.DeadlineExceeded):
		u.stats.timeout.inc()
		x.details = "upstream_response_timeout"
		return http.StatusGatewayTimeout, "upstream request timeout"
	default:
		u.stats.connectFail.inc()
		x.details = "upstream_reset_before_response_started{connection_failure}"
		return http.StatusServiceUnavailable, upstreamFailureBody(err)
	}
}

// checkListeners logs what a reloaded configuration changes in the
// listeners without the wasm filter that is not applied: they are bound
// once, as the filter's listener is.
func (g *gateway) checkListeners(cfg *envoyconfig.Config) {
	var names []string
	for _, l := range cfg.Listeners {
		names = append(names, l.Name)
		i := slices.IndexFunc(g.others, func(o *routerListener) bool { return o.name == l.Name })
		switch {
		case i < 0:
			g.log.Warn("new listener not served: restart the gateway to serve it", "listener", l.Name, "configured", l.Address)
		case g.others[i].addr != l.Address:
			g.log.Warn("listener address change not applied: restart the gateway to move the listener", "listener", l.Name, "address", g.others[i].addr, "configured", l.Address)
		}
	}
	for _, o := range g.others {
		if !slices.Contains(names, o.name) {
			g.log.Warn("listener removed from the configuration: it answers 404 until the gateway restarts", "listener", o.name)
		}
	}
}
