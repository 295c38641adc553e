package wasmhost

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/envoy/http1"
)

// HTTPCluster is an upstream cluster calls can be sent to.
type HTTPCluster struct {
	Endpoints []string // "host:port", used in turn
	// ConnectTimeout bounds connection set-up; defaults to Envoy's 5s.
	ConnectTimeout time.Duration
	// Limits is the cluster's circuit breaker (Envoy's
	// circuit_breakers.thresholds at the default priority).
	Limits CircuitBreaker
}

// CircuitBreaker is an Envoy cluster's circuit breaker thresholds; a field
// <= 0 takes Envoy's default, 1024. A call past MaxRequests in flight, or
// one that would have to wait for a connection while MaxPendingRequests
// already do, overflows: Dispatch fails it inline with ErrOverflow, and
// proxy_http_call returns INTERNAL_FAILURE, with no callback, as in Envoy
// (its async client completes the request inline with the router's local
// reply, and the wasm host reports a request that completed inline as a
// failure to send). A call that finds no idle connection waits (pending)
// for one being dialled, or, with MaxConnections open, for one to come
// free.
type CircuitBreaker struct {
	MaxConnections, MaxPendingRequests, MaxRequests int
}

// DefaultCircuitBreakerLimit is Envoy's default for each threshold.
const DefaultCircuitBreakerLimit = 1024

func (b CircuitBreaker) resolved() CircuitBreaker {
	for _, v := range []*int{&b.MaxConnections, &b.MaxPendingRequests, &b.MaxRequests} {
		if *v <= 0 {
			*v = DefaultCircuitBreakerLimit
		}
	}
	return b
}

// ErrOverflow is a call its cluster's circuit breaker refused.
var ErrOverflow = errors.New("callout: the cluster's circuit breaker overflowed")

// HTTPDispatcher sends calls over HTTP/1.1 to clusters of real endpoints,
// with pooled keep-alive connections, and answers failures as an Envoy
// cluster does: a connection that cannot be made, or that ends before a
// response, is a 503 local reply; a response cut short is a reset. The
// call's timeout is the host's (a 504). It is safe for concurrent use by
// many VMs.
//
// It is a small client of its own rather than net/http's, for what a call
// costs (RATIONALE.md: callout client): the request is written on the
// caller's goroutine to an idle connection, and each connection has one
// goroutine, parked in the network poller, that reads its responses, as
// Envoy's worker reads an upstream connection when epoll reports it.
type HTTPDispatcher struct {
	clusters map[string]*httpCluster
}

type httpCluster struct {
	endpoints      []string
	connectTimeout time.Duration
	next           atomic.Uint64
	limits         CircuitBreaker

	// byWorker is each worker's connections, one pool per endpoint, made
	// at the worker's first call: Envoy's connection pools are per worker
	// thread and never shared between workers, so a worker's calls find
	// only the connections its own calls opened. The circuit breaker's
	// counts below are the cluster's, across workers, as Envoy's are.
	pmu      sync.Mutex
	byWorker [][]*endpointPool
	closed   bool

	mu       sync.Mutex
	requests int            // calls in flight, from dispatch to their end
	conns    int            // connections open or being dialled
	dialing  int            // calls waiting for a connection being dialled for them
	waiting  []*waitingCall // calls waiting for a connection to come free, oldest first
}

// waitingCall is a call that found no idle connection with the cluster at
// MaxConnections: pending until one comes free or its context ends.
type waitingCall struct {
	ctx             context.Context
	a               *activeCall
	call            Callout
	path, authority string
	pool            *endpointPool
	stop            func() bool
}

// pools returns the worker's pools, one per endpoint, making them at its
// first call. After Close they are made closed: a connection dialled into
// one closes when its call ends.
func (c *httpCluster) pools(worker int) []*endpointPool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	for len(c.byWorker) <= worker {
		c.byWorker = append(c.byWorker, nil)
	}
	if c.byWorker[worker] == nil {
		ps := make([]*endpointPool, len(c.endpoints))
		for i, e := range c.endpoints {
			ps[i] = http1.NewPool[*calloutConn](e, c.connectTimeout)
			if c.closed {
				ps[i].Close()
			}
		}
		c.byWorker[worker] = ps
	}
	return c.byWorker[worker]
}

// close closes every worker's idle connections.
func (c *httpCluster) close() {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	c.closed = true
	for _, ps := range c.byWorker {
		for _, p := range ps {
			p.Close()
		}
	}
}

// pending is the calls waiting for a connection; c.mu is held.
func (c *httpCluster) pending() int { return c.dialing + len(c.waiting) }

// connClosed forgets a connection, and gives a waiting call a new one in
// its place.
func (c *httpCluster) connClosed() {
	c.mu.Lock()
	c.conns--
	var w *waitingCall
	if len(c.waiting) > 0 && c.conns < c.limits.MaxConnections {
		w = c.takeWaiting(0)
		c.conns++
		c.dialing++
	}
	c.mu.Unlock()
	if w != nil {
		go c.dialFor(w.ctx, w.pool, w.a, w.call, w.path, w.authority)
	}
}

// takeWaiting takes the i-th waiting call (0: the oldest) off the queue;
// c.mu is held.
func (c *httpCluster) takeWaiting(i int) *waitingCall {
	w := c.waiting[i]
	c.waiting = slices.Delete(c.waiting, i, i+1)
	w.stop()
	return w
}

// dialFor dials a connection for one call (its cluster already counted
// the connection and the call as dialling) and sends the call on it.
func (c *httpCluster) dialFor(ctx context.Context, pool *endpointPool, a *activeCall, call Callout, path, authority string) {
	cc, err := dial(ctx, c, pool)
	c.mu.Lock()
	c.dialing--
	c.mu.Unlock()
	if err != nil {
		c.connClosed()
		if ctx.Err() == nil {
			a.respond(failureResponse(err))
		}
		return
	}
	if !cc.send(ctx, a, call, path, authority) {
		a.respond(failureResponse(io.ErrUnexpectedEOF))
	}
}

// idle hands a connection that finished its call to the oldest call
// waiting for its pool (its worker's, to its endpoint), or back to the pool.
func (cc *calloutConn) idle() {
	c := cc.cluster
	c.mu.Lock()
	var w *waitingCall
	if i := slices.IndexFunc(c.waiting, func(w *waitingCall) bool { return w.pool == cc.pool }); i >= 0 {
		w = c.takeWaiting(i)
	}
	c.mu.Unlock()
	if w == nil {
		cc.pool.Put(cc)
		return
	}
	if !cc.send(w.ctx, w.a, w.call, w.path, w.authority) {
		w.a.respond(failureResponse(io.ErrUnexpectedEOF))
	}
}

// endpointPool is the connections to one endpoint: the idle ones, ready for
// a request (package http1, shared with the gateway's router).
type endpointPool = http1.Pool[*calloutConn]

// calloutConn is one HTTP/1.1 connection, carrying one call at a time.
type calloutConn struct {
	*http1.Conn
	pool      *endpointPool
	cluster   *httpCluster
	closeOnce sync.Once
	// req is reused by every response read, for its method (HEAD has no
	// body).
	req http.Request

	mu      sync.Mutex
	current *activeCall // the call in flight, nil when idle
	dead    bool
	// wmu is held while a request is written: the response may be read,
	// and the connection handed to the next call, before the writer's
	// Flush has returned.
	wmu sync.Mutex
}

// activeCall is a call written to a connection, waiting for its response.
type activeCall struct {
	respond func(CalloutResponse)
	stop    func() bool // stops watching the call's context
	method  string
	conn    atomic.Pointer[calloutConn] // once written
	reading atomic.Bool                 // its response has begun to arrive
}

// arrived reports whether the call's response (its bytes, or the close
// that ends it) is in its connection's socket, or being read from it,
// though not yet handed over. A response being read counts once: a reader
// still short of its end at the next look is waiting for bytes that have
// not come.
func (a *activeCall) arrived() bool {
	if a.reading.Swap(false) {
		return true
	}
	cc := a.conn.Load()
	if cc == nil {
		return false
	}
	cc.mu.Lock()
	mine := cc.current == a && !cc.dead
	cc.mu.Unlock()
	return mine && unread(cc.NC)
}

// unread reports whether bytes, or the peer's close, wait unread in the
// socket of c: either is an event Envoy's loop would handle before a timer
// that expired in the same iteration.
func unread(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	waiting := false
	rc.Control(func(fd uintptr) { waiting = socketUnread(int(fd)) > 0 || socketEnded(int(fd)) })
	return waiting
}

// NewHTTPDispatcher returns a dispatcher for the given clusters, by name.
func NewHTTPDispatcher(clusters map[string]HTTPCluster) *HTTPDispatcher {
	d := &HTTPDispatcher{clusters: map[string]*httpCluster{}}
	for name, c := range clusters {
		d.clusters[name] = &httpCluster{limits: c.Limits.resolved(),
			endpoints: slices.Clone(c.Endpoints), connectTimeout: c.ConnectTimeout}
	}
	return d
}

// Cluster reports whether the cluster is configured and has an endpoint.
func (d *HTTPDispatcher) Cluster(name string) bool {
	c := d.clusters[name]
	return c != nil && len(c.endpoints) > 0
}

// Close closes the idle pooled connections; a connection still carrying a
// call is closed when the call ends.
func (d *HTTPDispatcher) Close() {
	for _, c := range d.clusters {
		c.close()
	}
}

// errBadRequest is a call whose method or path cannot be sent; net/http
// refuses the same ones.
var errBadRequest = errors.New("callout: invalid method or path")

// errBadWorker is a call from no worker: the host's own mistake.
var errBadWorker = errors.New("callout: negative worker index")

// Dispatch writes the call to an idle connection of the next endpoint
// among those of the call's worker, or dials a new one on its own
// goroutine.
func (d *HTTPDispatcher) Dispatch(ctx context.Context, call Callout, respond func(CalloutResponse)) error {
	_, err := d.DispatchWatched(ctx, call, respond)
	return err
}

// DispatchWatched is Dispatch, and reports whether the response has
// reached the call's socket (WatchingDispatcher).
func (d *HTTPDispatcher) DispatchWatched(ctx context.Context, call Callout, respond func(CalloutResponse)) (func() bool, error) {
	c := d.clusters[call.Cluster]
	if c == nil || len(c.endpoints) == 0 {
		return nil, ErrNoSuchCluster
	}
	if call.Worker < 0 {
		return nil, errBadWorker
	}
	pools := c.pools(call.Worker)
	pool := pools[c.next.Add(1)%uint64(len(pools))]
	var method, path, authority string
	for _, h := range call.Headers {
		switch h[0] {
		case ":method":
			method = h[1]
		case ":path":
			path = h[1]
		case ":authority":
			authority = h[1]
		}
	}
	if !http1.ValidMethod(method) {
		return nil, errBadRequest
	}
	// What net/http would send for it, or its refusal.
	path, ok := http1.Target(pool.Addr, path)
	if !ok {
		return nil, errBadRequest
	}
	for _, h := range call.Headers {
		if !http1.ValidHeader(h[0], h[1]) {
			// net/http's transport refuses such a header before sending;
			// the call ends as a request that got no response.
			respond(failureResponse(errors.New("invalid header")))
			return nil, nil
		}
	}
	c.mu.Lock()
	if c.requests >= c.limits.MaxRequests {
		c.mu.Unlock()
		return nil, ErrOverflow
	}
	c.requests++
	c.mu.Unlock()
	// The call holds its place until its response is handed over, as an
	// Envoy stream until it completes, or until the host stops waiting for
	// it (its context ends: a timeout resets the stream).
	var once sync.Once
	end := func() {
		once.Do(func() {
			c.mu.Lock()
			c.requests--
			c.mu.Unlock()
		})
	}
	// A call that responds stops the watch, so that the end of its
	// context starts no goroutine to do what is done already.
	stopEnd := whenDone(ctx, end)
	a := &activeCall{respond: func(r CalloutResponse) { stopEnd(); end(); respond(r) }, method: method}
	for cc, ok := pool.Take(); ok; cc, ok = pool.Take() {
		if cc.send(ctx, a, call, path, authority) {
			return a.arrived, nil
		}
		// It died while idle, just now; another one may not have.
	}
	c.mu.Lock()
	switch {
	case c.pending() >= c.limits.MaxPendingRequests:
		c.mu.Unlock()
		end()
		return nil, ErrOverflow
	case c.conns < c.limits.MaxConnections:
		c.conns++
		c.dialing++
		c.mu.Unlock()
		go c.dialFor(ctx, pool, a, call, path, authority)
	default:
		w := &waitingCall{ctx: ctx, a: a, call: call, path: path, authority: authority, pool: pool}
		w.stop = whenDone(ctx, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if i := slices.Index(c.waiting, w); i >= 0 {
				c.waiting = slices.Delete(c.waiting, i, i+1)
			}
		})
		c.waiting = append(c.waiting, w)
		c.mu.Unlock()
	}
	return a.arrived, nil
}

func dial(ctx context.Context, cl *httpCluster, p *endpointPool) (*calloutConn, error) {
	c, err := p.Dial(ctx)
	if err != nil {
		return nil, err
	}
	cc := &calloutConn{Conn: c, pool: p, cluster: cl}
	go cc.readLoop()
	return cc, nil
}

// Close closes the connection; its cluster counts it closed once.
func (cc *calloutConn) Close() error {
	cc.closeOnce.Do(cc.cluster.connClosed)
	return cc.Conn.Close()
}

// send writes the call and leaves its response to the read loop; it
// reports false, having sent nothing, if the connection is dead. A
// connection that cannot be written is a call that got no response.
func (cc *calloutConn) send(ctx context.Context, a *activeCall, call Callout, path, authority string) bool {
	cc.mu.Lock()
	if cc.dead {
		cc.mu.Unlock()
		return false
	}
	cc.current = a
	a.conn.Store(cc)
	// The host stops waiting (timeout, closed VM): Envoy resets the
	// stream, which on HTTP/1.1 closes the connection. whenDone watches
	// the context without a goroutine until it ends; set under the lock,
	// so the read loop sees it with the call.
	a.stop = whenDone(ctx, func() { cc.abandon(a) })
	cc.mu.Unlock()
	cc.wmu.Lock()
	defer cc.wmu.Unlock()
	w := cc.W
	http1.WriteHead(w, a.method, path, authority, call.Headers, nil, int64(len(call.Body)))
	w.Write(call.Body)
	if err := w.Flush(); err != nil {
		cc.fail(a)
	}
	return true
}

// abandon ends the call the host stopped waiting for, and its connection.
func (cc *calloutConn) abandon(a *activeCall) {
	cc.mu.Lock()
	mine := cc.current == a
	if mine {
		cc.current = nil
		cc.dead = true
	}
	cc.mu.Unlock()
	if mine {
		cc.Close()
	}
}

// fail ends the connection and answers its call, if still in flight, as a
// request that got no response.
func (cc *calloutConn) fail(a *activeCall) {
	cc.mu.Lock()
	mine := cc.current == a
	if mine {
		cc.current = nil
	}
	cc.dead = true
	cc.mu.Unlock()
	cc.Close()
	if mine {
		a.stop()
		a.respond(failureResponse(io.ErrUnexpectedEOF))
	}
}

// readLoop reads one response per call written, until the connection
// ends. Bytes or an end of the connection while it is idle retire it.
func (cc *calloutConn) readLoop() {
	for {
		_, err := cc.R.Peek(1)
		cc.mu.Lock()
		a := cc.current
		if a == nil {
			// Idle (or abandoned): the server closed it or sent what
			// nobody asked for; either way it is no use any more. Dead
			// before the lock is released, so no call is sent on it.
			cc.dead = true
		}
		cc.mu.Unlock()
		if a == nil {
			cc.retire()
			return
		}
		if err != nil {
			cc.fail(a)
			return
		}
		a.reading.Store(true)
		r, keep, ok := cc.readResponse(a)
		cc.mu.Lock()
		mine := cc.current == a
		if mine {
			cc.current = nil
		}
		cc.mu.Unlock()
		if !mine {
			// Abandoned while it was read: the connection is closed.
			cc.retire()
			return
		}
		a.stop()
		if !ok {
			cc.retire()
			a.respond(r)
			return
		}
		if keep {
			cc.idle()
		} else {
			cc.retire()
		}
		a.respond(r)
		if !keep {
			return
		}
	}
}

// retire closes a connection that will carry no more calls.
func (cc *calloutConn) retire() {
	cc.mu.Lock()
	cc.dead = true
	cc.mu.Unlock()
	cc.pool.Drop(cc)
	cc.Close()
}

// readResponse parses one response; ok is false when the connection broke,
// r then being Envoy's answer for that (503 before headers, a reset after).
func (cc *calloutConn) readResponse(a *activeCall) (r CalloutResponse, keep, ok bool) {
	cc.req.Method = a.method
	resp, err := http.ReadResponse(cc.R, &cc.req)
	// Interim answers (1xx but 101) are not the response: Envoy's codec
	// skips them and goes on waiting, as the gateway's upstream does.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(cc.R, &cc.req)
	}
	if err != nil {
		return failureResponse(err), false, false
	}
	var body []byte
	switch {
	case resp.ContentLength == 0:
	case resp.ContentLength > 0 && resp.ContentLength <= 1<<20:
		// One allocation of the announced size.
		body = make([]byte, resp.ContentLength)
		_, err = io.ReadFull(resp.Body, body)
	default:
		body, err = io.ReadAll(resp.Body)
	}
	if err != nil {
		// The response had begun: Envoy can only reset.
		return CalloutResponse{Reset: true}, false, false
	}
	if len(body) == 0 {
		body = nil
	}
	return CalloutResponse{
		Headers:  responseHeaders(resp.StatusCode, resp.Header),
		Body:     body,
		Trailers: flatten(resp.Trailer),
	}, !resp.Close, true
}

// failureResponse is Envoy's local reply for a request that got no
// response headers.
func failureResponse(err error) CalloutResponse {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		if op.Timeout() {
			return LocalReplyResponse(503, "upstream connect error or disconnect/reset before headers. reset reason: connection timeout")
		}
		reason := "delayed connect error: " + op.Err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			reason = "delayed connect error: " + strconv.Itoa(int(errno))
		}
		return ConnectFailure(reason)
	}
	return LocalReplyResponse(503, "upstream connect error or disconnect/reset before headers. reset reason: connection termination")
}

// responseHeaders lists a response's headers as Envoy hands them to a
// plugin: ":status" first, lower-case names (sorted, since Go keeps no
// wire order), one entry per value.
func responseHeaders(status int, h http.Header) []Header {
	out := make([]Header, 1, 1+len(h))
	out[0] = Header{":status", strconv.Itoa(status)}
	return appendFlat(out, h)
}

func flatten(h http.Header) []Header {
	if len(h) == 0 {
		return nil
	}
	return appendFlat(nil, h)
}

func appendFlat(out []Header, h http.Header) []Header {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		lname := strings.ToLower(name)
		for _, v := range h[name] {
			out = append(out, Header{lname, v})
		}
	}
	return out
}
