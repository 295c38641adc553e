package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync/atomic"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/envoy/http1"
	"github.com/edgelimit/edgelimit/envoy/wasmhost"
)

// upstream is one cluster the router forwards to, over the same lean
// HTTP/1.1 client the plugin's callouts use (package http1), not net/http's
// Transport: the handler's goroutine writes the request and reads the
// response itself, with no read and write loop goroutines per connection
// and no handoffs between them (envoy/wasmhost/RATIONALE.md, "What a request
// costs the host").
type upstream struct {
	name  string
	pools []*upstreamPool // one per endpoint, used in turn
	next  atomic.Uint64
	stats *clusterCounters
}

type upstreamPool = http1.Pool[*upstreamConn]

// upstreamConn is one connection to an endpoint, carrying one request at a
// time; req is reused for every response read (its method: HEAD has no
// body).
type upstreamConn struct {
	*http1.Conn
	req http.Request
}

func newUpstream(c envoyconfig.Cluster) *upstream {
	u := &upstream{name: c.Name}
	for _, e := range c.Endpoints {
		u.pools = append(u.pools, http1.NewPool[*upstreamConn](e, c.ConnectTimeout))
	}
	return u
}

// close closes the idle connections; those in use close when their
// request ends.
func (u *upstream) close() {
	for _, p := range u.pools {
		p.Close()
	}
}

// errUpstreamRequest is a request whose method or path cannot be sent, as
// net/http refuses to build it.
var errUpstreamRequest = errors.New("upstream: invalid method or path")

// errInvalidHeader is a header net/http's transport refuses to send.
var errInvalidHeader = errors.New("upstream: invalid header field")

// expectedTimeout is the x-envoy-expected-rq-timeout-ms header Envoy's
// router sets on the upstream request.
var expectedTimeout = wasmhost.Header{"x-envoy-expected-rq-timeout-ms", strconv.FormatInt(routeTimeout.Milliseconds(), 10)}

// roundTrip sends the request, with the headers the filter left, to the
// next endpoint on an idle connection or a new one, and returns the
// response; its body returns the connection to the pool once read to the
// end and closed. ctx ending closes the connection (Envoy resets the
// stream): the error is then ctx's.
//
// A connection the server closed while idle is one Envoy's pool, which
// sees the close event, never uses. Here an idempotent request without a
// body (GET, HEAD, OPTIONS, TRACE) is sent on the idle connection as it is
// and, if that connection ends before any byte of an answer, again on a
// new one, as net/http retries it; any other request first checks that the
// idle connection is still open (Conn.Alive, one more system call) and is
// not sent twice.
func (u *upstream) roundTrip(ctx context.Context, r *http.Request, headers []wasmhost.Header) (*http.Response, error) {
	method, path, authority := firstValue(headers, ":method"), firstValue(headers, ":path"), firstValue(headers, ":authority")
	pool := u.pools[u.next.Add(1)%uint64(len(u.pools))]
	if !http1.ValidMethod(method) {
		return nil, errUpstreamRequest
	}
	target, ok := http1.Target(pool.Addr, path)
	if !ok {
		return nil, errUpstreamRequest
	}
	for _, h := range headers {
		if !http1.ValidHeader(h[0], h[1]) {
			return nil, errInvalidHeader
		}
	}
	hasBody := r.Body != nil && r.Body != http.NoBody
	bodyLen := int64(0)
	if hasBody {
		bodyLen = r.ContentLength // -1: unknown, sent chunked
	}
	retry := !hasBody && idempotent(method)
	for {
		cc, reused := take(pool, !retry)
		if !reused {
			c, err := pool.Dial(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, err
			}
			cc = &upstreamConn{Conn: c}
		}
		resp, err := u.exchange(ctx, pool, cc, r.Body, method, target, authority, headers, bodyLen)
		if errors.Is(err, errStale) {
			if reused && retry && ctx.Err() == nil {
				continue
			}
			err = io.ErrUnexpectedEOF
		}
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return resp, err
	}
}

// take returns an idle connection; with check, only one still open,
// closing those the server closed meanwhile.
func take(p *upstreamPool, check bool) (*upstreamConn, bool) {
	for {
		cc, ok := p.Take()
		if !ok {
			return nil, false
		}
		if !check || cc.Alive() {
			return cc, true
		}
		cc.Close()
	}
}

// idempotent reports whether a request may be sent again, as net/http's
// transport decides.
func idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return false
}

// errStale is a connection that ended before any byte of a response.
var errStale = errors.New("upstream: connection closed before a response")

func (u *upstream) exchange(ctx context.Context, pool *upstreamPool, cc *upstreamConn, body io.Reader, method, target, authority string,
	headers []wasmhost.Header, bodyLen int64) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { cc.Close() })
	fail := func(err error) (*http.Response, error) {
		stop()
		cc.Close()
		return nil, err
	}
	w := cc.W
	http1.WriteHead(w, method, target, authority, append(headers[:len(headers):len(headers)], expectedTimeout), dropUpstream, bodyLen)
	var err error
	switch {
	case bodyLen > 0:
		_, err = io.CopyN(w, body, bodyLen)
	case bodyLen < 0:
		cw := httputil.NewChunkedWriter(w)
		if _, err = io.Copy(cw, body); err == nil {
			cw.Close()
			_, err = w.WriteString("\r\n")
		}
	}
	if err != nil {
		return fail(err)
	}
	if err := w.Flush(); err != nil {
		return fail(errStale)
	}
	if _, err := cc.R.Peek(1); err != nil {
		return fail(errStale)
	}
	cc.req.Method = method
	for {
		resp, err := http.ReadResponse(cc.R, &cc.req)
		if err != nil {
			return fail(err)
		}
		// Interim answers (100 Continue to a forwarded Expect) precede
		// the response; 101 is final.
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		resp.Body = &upstreamBody{body: resp.Body, cc: cc, pool: pool, stop: stop, keep: !resp.Close}
		return resp, nil
	}
}

// dropUpstream are the names not forwarded: connection-level headers, and
// the router's own x-envoy-expected-rq-timeout-ms, which it sets.
func dropUpstream(name string) bool {
	return hopHeaders[name] || name == expectedTimeout[0]
}

// upstreamBody is a response body whose connection goes back to the pool
// once the body was read to its end, and is closed otherwise.
type upstreamBody struct {
	body io.ReadCloser
	cc   *upstreamConn
	pool *upstreamPool
	stop func() bool
	keep bool
	eof  bool
	done bool
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if b.eof && b.keep && b.stop() {
		b.body.Close()
		b.pool.Put(b.cc)
		return nil
	}
	b.stop()
	// Closed first, so that the body's Close does not drain it.
	b.cc.Close()
	b.body.Close()
	return nil
}
