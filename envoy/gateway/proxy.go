package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/internal/grpclocal"
)

// hopHeaders are connection-level headers a proxy does not forward.
var hopHeaders = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true,
	"upgrade": true, "te": true, "trailer": true, "host": true,
}

// exchange is one request's way through the gateway, for the stats and
// the access log.
type exchange struct {
	start   time.Time
	status  int
	cluster string
	details string
	// cors is the CORS filter's policy when the request came from one of
	// its origins (corsOrigin): every response written gets the headers
	// its encodeHeaders adds.
	cors       *envoyconfig.CORSPolicy
	corsOrigin string
	// added are the virtual host's response_headers_to_add, for a
	// request that matched a route and that the CORS filter did not
	// answer: every response written appends them.
	added []envoyconfig.Header
}

// ServeHTTP runs one request through the filter chain of the listener: the
// wasm filter, then the router.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 2 && refuseHTTP2(w, r, g.log) {
		return
	}
	x := &exchange{start: time.Now()}
	g.rqTotal.inc()
	defer func() {
		if x.status != 0 {
			g.rqClass.inc(x.status)
		}
		g.writeAccessLog(r, x)
	}()
	if !envoyMethods[r.Method] {
		// Envoy's HTTP/1 codec (Balsa, allow_custom_methods off as in
		// envoy.yaml) refuses a method not in its list before any filter:
		// a `post` is not a POST, and neither the filter's cost rules nor
		// a service should be handed one.
		x.status, x.details = http.StatusBadRequest, "http1.codec_error"
		w.Header().Set("connection", "close")
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	gen := g.acquire()
	defer gen.release()
	if gen.cfg.RejectUnderscores || gen.cfg.DropUnderscores {
		for name := range r.Header {
			if !strings.Contains(name, "_") {
				continue
			}
			if gen.cfg.DropUnderscores {
				// Envoy's HTTP/1 codec drops the header (DROP_HEADER).
				delete(r.Header, name)
				continue
			}
			// REJECT_REQUEST: Envoy's HTTP/1 codec refuses the request
			// before any filter and closes the connection. A service
			// that reads x_api_key as x-api-key (CGI's and WSGI's
			// HTTP_X_API_KEY) would otherwise take a client the filter
			// never charged.
			x.status, x.details = http.StatusBadRequest, "http1.unexpected_underscore"
			g.underscoreRejected.inc()
			w.Header().Set("connection", "close")
			http.Error(w, "Bad Request", http.StatusBadRequest)
			return
		}
	}
	if !gen.cfg.Proxy100Continue && r.Header.Get("expect") == "100-continue" {
		// proxy_100_continue false (Envoy's default): the connection
		// manager answers 100 Continue itself, before any filter, and
		// drops the Expect, so the client sends its body whatever the
		// filter decides. With true, Go's server sends the 100 when the
		// router first reads the body, after the filter let it through.
		w.WriteHeader(http.StatusContinue)
		r.Header.Del("expect")
	}
	if r.ProtoMajor == 1 && r.ProtoMinor == 0 && !gen.cfg.AcceptHTTP10 {
		// Envoy's connection manager without accept_http_10 answers an
		// HTTP/1.0 request 426 before any filter: nothing is charged.
		x.status, x.details = http.StatusUpgradeRequired, "low_version"
		w.Header().Set("connection", "close")
		w.Header().Set("content-length", "0")
		w.WriteHeader(http.StatusUpgradeRequired)
		return
	}
	path, redirect, ok := requestPath(r, gen.cfg.EscapedSlashes)
	if !ok {
		x.status, x.details = http.StatusBadRequest, "path_normalization_failed"
		replyInHeaders(w, r)
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	if redirect {
		// Envoy's UNESCAPE_AND_REDIRECT: before any filter, so the
		// request is charged nothing; the one the client sends to the
		// location is charged as that path.
		x.status, x.details = http.StatusTemporaryRedirect, "path_normalization_failed"
		replyInHeaders(w, r)
		w.Header().Set("location", path)
		w.Header().Set("content-length", "0")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return
	}
	if isUpgrade(r.Header) {
		if _, routed := matchRoute(gen.cfg.Routes, path); routed {
			// Envoy's connection manager without upgrade_configs (the
			// gateway supports none): an upgrade (WebSocket, …) to a
			// route is refused before any filter, so nothing is
			// charged, and the connection is closed. Upgrade: h2c is
			// not one: Envoy's HTTP/1 codec drops it, as the gateway
			// drops every Upgrade header.
			x.status, x.details = http.StatusForbidden, "upgrade_failed"
			g.upgradeRefused.inc()
			w.Header().Set("connection", "close")
			w.Header().Set("content-length", "0")
			w.WriteHeader(http.StatusForbidden)
			return
		}
	}
	if gen.cfg.CORS != nil && g.cors(w, r, gen.cfg.CORS, gen.cfg.Routes, path, x) {
		return
	}
	if _, routed := matchRoute(gen.cfg.Routes, path); routed {
		// Envoy's route finalizes the headers of the router's responses
		// and of every local reply once the route is known
		// (RouteEntry::finalizeResponseHeaders); the CORS filter's answer
		// to a preflight above is encoded without it.
		x.added = gen.cfg.ResponseHeadersToAdd
	}
	worker, _ := r.Context().Value(workerKey{}).(int)
	vm := gen.workers[worker%len(gen.workers)]
	// The stream's context is made by its first call, and it ends
	// without the handler waiting for a busy VM's proxy_on_log and
	// proxy_on_done: each phase runs on this goroutine when the VM is
	// idle, else on the goroutine that holds the VM, which wakes this one
	// (wasmhost's RATIONALE.md, what a request costs the host).
	s := vm.OpenStream(wasmhost.StreamInfo{SourceAddr: r.RemoteAddr, DestinationAddr: localAddr(r), Protocol: r.Proto})
	defer s.DoneAsync()

	endOfStream := r.Body == nil || r.Body == http.NoBody
	// The request waits here, unsent, until the filter resumes or answers
	// it, or until the stream has been idle for stream_idle_timeout (a
	// failed module sends a paused stream nothing more).
	idle, stop := idleContext(r.Context(), gen.cfg.StreamIdleTimeout)
	st, err := s.RequestHeadersWait(idle, edgeHeaders(requestHeaders(r, path), r, gen.cfg.InternalAddresses), endOfStream)
	stop()
	if errors.Is(err, wasmhost.ErrClosed) {
		x.status, x.details = http.StatusServiceUnavailable, "wasm_vm_closed"
		replyBeforeBody(w, r)
		http.Error(w, "", http.StatusServiceUnavailable)
		return
	}
	if err != nil {
		if r.Context().Err() == nil {
			// Idle for stream_idle_timeout: the body is not waited for.
			w.Header().Set("connection", "close")
			g.streamTimeout(w, x)
			return
		}
		x.details = "downstream_remote_disconnect"
		return
	}
	switch st {
	case wasmhost.Replied:
		reply, _ := s.LocalReply()
		x.details = reply.Details
		if reply.InRequestHeaders {
			replyInHeaders(w, r)
		} else {
			replyBeforeBody(w, r)
		}
		g.writeReply(w, x, reply.Headers, reply.Body)
		return
	case wasmhost.Reset:
		x.details = "wasm_close_stream"
		panic(http.ErrAbortHandler)
	}
	g.route(w, r, gen, s, x)
}

// cors runs Envoy's CORS filter, which comes before the wasm filter
// (envoyconfig checks it), on the request, as its decodeHeaders does
// (source/extensions/filters/http/cors/cors_filter.cc): nothing for a
// request without a route to a cluster or without Origin; the origin kept
// for the response's headers when the policy allows it; a preflight
// (OPTIONS with a non-empty Access-Control-Request-Method) answered 200
// here, before the wasm filter, when the origin is allowed or
// forward_not_matching_preflights is false. It reports whether it
// answered.
func (g *gateway) cors(w http.ResponseWriter, r *http.Request, p *envoyconfig.CORSPolicy, routes []envoyconfig.Route, path string, x *exchange) bool {
	origin := r.Header.Get("origin")
	if origin == "" {
		return false
	}
	if rt, ok := matchRoute(routes, path); !ok || rt.Direct != nil {
		return false
	}
	allowed := p.Allowed(origin)
	if allowed {
		x.cors, x.corsOrigin = p, origin
	}
	method := r.Header.Get("access-control-request-method")
	if r.Method != http.MethodOptions || method == "" || (!allowed && p.ForwardNotMatchingPreflights) {
		return false
	}
	h := []wasmhost.Header{{":status", "200"}}
	if p.AllowMethods == "*" {
		h = append(h, wasmhost.Header{"access-control-allow-methods", method})
	} else if p.AllowMethods != "" {
		h = append(h, wasmhost.Header{"access-control-allow-methods", p.AllowMethods})
	}
	if p.AllowHeaders == "*" {
		h = append(h, wasmhost.Header{"access-control-allow-headers", r.Header.Get("access-control-request-headers")})
	} else if p.AllowHeaders != "" {
		h = append(h, wasmhost.Header{"access-control-allow-headers", p.AllowHeaders})
	}
	if p.MaxAge != "" {
		h = append(h, wasmhost.Header{"access-control-max-age", p.MaxAge})
	}
	if p.AllowPrivateNetworkAccess && r.Header.Get("access-control-request-private-network") == "true" {
		h = append(h, wasmhost.Header{"access-control-allow-private-network", "true"})
	}
	// Access-Control-Allow-Origin and -Credentials: writeHeaders, as the
	// filter's encodeHeaders adds them to its own answer too (with
	// Expose-Headers).
	x.details = "cors_response"
	replyInHeaders(w, r)
	g.writeHeaders(w, x, h)
	return true
}

// route runs Envoy's router (forward) on the request as the filter let it
// through, and the response, or the router's own answer, back through the
// filter.
func (g *gateway) route(w http.ResponseWriter, r *http.Request, gen *generation, s *wasmhost.Stream, x *exchange) {
	g.rqRouted.inc()
	headers := s.UpstreamHeaders()
	fw := g.forward(r, gen, gen.cfg.Routes, firstValue(headers, ":path"), headers, x)
	defer fw.done()
	if fw.resp == nil {
		if fw.status != 0 {
			replyBeforeBody(w, r)
			g.localReply(w, s, x, fw.status, fw.body, grpclocal.IsGRPC(r.Header.Get("content-type")))
		}
		return
	}
	resp := fw.resp
	rh := responseHeaders(resp, fw.start)
	idle, stop := idleContext(r.Context(), gen.cfg.StreamIdleTimeout)
	st, out, err := s.ResponseHeadersWait(idle, rh, false)
	stop()
	if err != nil {
		if r.Context().Err() == nil {
			g.streamTimeout(w, x)
		}
		return
	}
	switch st {
	case wasmhost.Replied:
		reply, _ := s.LocalReply()
		x.details = reply.Details
		g.writeReply(w, x, reply.Headers, reply.Body)
		return
	case wasmhost.Reset:
		panic(http.ErrAbortHandler)
	}
	x.details = "via_upstream"
	g.writeHeaders(w, x, out)
	if err := copyBody(w, resp.Body, resp.ContentLength); err != nil {
		// Headers are out: all Envoy can do is reset the stream.
		panic(http.ErrAbortHandler)
	}
}

// responseHeaders are an upstream response's headers as the router hands
// them to the filters: :status first, connection headers dropped, and
// x-envoy-upstream-service-time, the time since start.
func responseHeaders(resp *http.Response, start time.Time) []wasmhost.Header {
	rh := make([]wasmhost.Header, 1, len(resp.Header)+2)
	rh[0] = wasmhost.Header{":status", strconv.Itoa(resp.StatusCode)}
	for name, values := range resp.Header {
		lname := lowerName(name)
		if hopHeaders[lname] {
			continue
		}
		for _, v := range values {
			rh = append(rh, wasmhost.Header{lname, v})
		}
	}
	return append(rh, wasmhost.Header{"x-envoy-upstream-service-time", strconv.FormatInt(time.Since(start).Milliseconds(), 10)})
}

// idleContext is ctx ending after d of waiting (none for d 0, as Envoy's
// stream_idle_timeout: 0 disables it).
func idleContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// streamTimeout is Envoy's answer to a stream idle for stream_idle_timeout
// before its response began: 408 "stream timeout". (No response has begun
// while the filter holds the request or the response headers.)
func (g *gateway) streamTimeout(w http.ResponseWriter, x *exchange) {
	x.status, x.details = http.StatusRequestTimeout, "stream_idle_timeout"
	w.Header().Set("content-type", "text/plain")
	w.Header().Set("server", "envoy")
	w.WriteHeader(http.StatusRequestTimeout)
	io.WriteString(w, "stream timeout")
}

// localReply answers on the router's behalf, as Envoy does, through the
// filter's encoder path: the plugin sees the reply's headers. A gRPC
// request's is the trailers-only response Envoy makes of it (package
// grpclocal: a 404 is UNIMPLEMENTED, a 503 or 504 UNAVAILABLE).
func (g *gateway) localReply(w http.ResponseWriter, s *wasmhost.Stream, x *exchange, status int, body string, grpc bool) {
	h := localHeaders(status, body)
	if grpc {
		h, body = grpclocal.Reply(h, []byte(body), -1), ""
	}
	st, out, err := s.ResponseHeadersWait(context.Background(), h, body == "")
	if err == nil && st == wasmhost.Replied {
		reply, _ := s.LocalReply()
		g.writeReply(w, x, reply.Headers, reply.Body)
		return
	}
	g.writeReply(w, x, out, []byte(body))
}

func (g *gateway) writeReply(w http.ResponseWriter, x *exchange, headers []wasmhost.Header, body []byte) {
	g.writeHeaders(w, x, headers)
	w.Write(body)
}

func (g *gateway) writeHeaders(w http.ResponseWriter, x *exchange, headers []wasmhost.Header) {
	status := http.StatusOK
	out := w.Header()
	for _, h := range headers {
		if h[0] == ":status" {
			if n, err := strconv.Atoi(h[1]); err == nil && n >= 100 && n <= 999 {
				status = n
			}
			continue
		}
		if strings.HasPrefix(h[0], ":") || hopHeaders[h[0]] {
			continue
		}
		out.Add(h[0], h[1])
	}
	if x.corsOrigin != "" {
		// The CORS filter's encodeHeaders, on every response of a request
		// from an allowed origin, the wasm filter's and the router's local
		// replies included: Envoy sends a decoder filter's local reply
		// through every encoder filter (FilterManager::
		// sendLocalReplyViaFilterChain, encodeHeaders(nullptr, …)), and
		// the CORS filter, first in the chain, encodes last. It replaces
		// what a service set.
		out.Set("access-control-allow-origin", x.corsOrigin)
		if x.cors.AllowCredentials {
			out.Set("access-control-allow-credentials", "true")
		}
		if x.cors.ExposeHeaders != "" {
			out.Set("access-control-expose-headers", x.cors.ExposeHeaders)
		}
	}
	for _, h := range x.added {
		out.Add(h.Key, h.Value)
	}
	if out.Get("server") == "" {
		out.Set("server", "envoy")
	}
	x.status = status
	w.WriteHeader(status)
}

// copyBody streams an upstream body to the client, flushing what each read
// brought as Envoy forwards data as it arrives; once a body of known length
// is complete the handler's return sends it, without a flush of its own.
func copyBody(w http.ResponseWriter, body io.Reader, length int64) error {
	flusher, _ := w.(http.Flusher)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var sent int64
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			sent += int64(n)
			if flusher != nil && sent != length {
				flusher.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// copyBufs are copyBody's buffers, reused: a new 32 KiB buffer per request
// was half of what a request allocated.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// lowerName is strings.ToLower for a header name, without an allocation
// for the canonical names that come on most requests.
func lowerName(name string) string {
	if l, ok := commonNames[name]; ok {
		return l
	}
	return strings.ToLower(name)
}

var commonNames = func() map[string]string {
	m := map[string]string{}
	for _, n := range []string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Length", "Content-Type", "Cookie", "Date", "Etag", "Expect", "Host",
		"Keep-Alive", "Last-Modified", "Location", "Origin", "Referer", "Retry-After", "Server",
		"Set-Cookie", "Transfer-Encoding", "User-Agent", "Vary", "X-Api-Key", "X-Forwarded-For",
		"X-Forwarded-Proto", "X-Request-Id", "X-Ratelimit-Shadow", "Ratelimit-Limit", "Ratelimit-Remaining",
		"Ratelimit-Reset", "X-Ratelimit-Plan", "X-Service"} {
		m[n] = strings.ToLower(n)
	}
	return m
}()

// requestHeaders is the request as Envoy's connection manager hands it to
// the filters: pseudo-headers first, lower-case names, connection headers
// dropped, and the edge's own x-forwarded-for, x-forwarded-proto and a fresh
// x-request-id (use_remote_address: true).
func requestHeaders(r *http.Request, path string) []wasmhost.Header {
	h := make([]wasmhost.Header, 4, len(r.Header)+8)
	h[0], h[1], h[2], h[3] = wasmhost.Header{":authority", r.Host}, wasmhost.Header{":path", path}, wasmhost.Header{":method", r.Method}, wasmhost.Header{":scheme", "http"}
	var xff string
	for name, values := range r.Header {
		lname := lowerName(name)
		switch {
		case hopHeaders[lname], lname == "x-request-id", lname == "x-forwarded-proto":
			continue
		case lname == "x-forwarded-for":
			xff = strings.Join(values, ",")
			continue
		case lname == "authorization" && len(values) > 1:
			// An inline header in Envoy's full build (its oauth2 and cache
			// filters register it): repeated lines reach the filters as
			// one value joined by "," (HeaderMapImpl::insertByKey). The
			// other inline headers Envoy merges the same way are passed
			// as they came: the filter reads none of them.
			h = append(h, wasmhost.Header{lname, strings.Join(values, ",")})
			continue
		}
		for _, v := range values {
			h = append(h, wasmhost.Header{lname, v})
		}
	}
	if r.ContentLength > 0 && firstValue(h, "content-length") == "" {
		h = append(h, wasmhost.Header{"content-length", strconv.FormatInt(r.ContentLength, 10)})
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if xff != "" {
			xff += ","
		}
		xff += ip
	}
	if xff != "" {
		h = append(h, wasmhost.Header{"x-forwarded-for", xff})
	}
	return append(h, wasmhost.Header{"x-forwarded-proto", "http"}, wasmhost.Header{"x-request-id", newRequestID()})
}

// replyBeforeBody readies a reply made while the request was held, before
// its body was read (the filter's answer after its callout, the router's
// own answers), to go out at once, keeping or closing the connection as
// Envoy does. Envoy's HTTP/1 codec reads a body while the filters hold its
// request; a reply sent before the body came whole says connection: close
// and ends the connection (ConnectionManagerImpl, "response before request
// complete"), one sent after keeps it. So the gateway reads what has come
// of the body, as far as it has come (bodyArrived), and says connection:
// close when that is not all of it. Left to Go's server, a reply waited for
// the rest of a body under 256 KiB, or of a chunked one, before it went
// out: a denied client sending its body slowly, or waiting for an answer
// before sending the rest, got its 429 only once its body was in. A body
// declared longer than 256 KiB is not read at all: connection: close.
func replyBeforeBody(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Body == nil || r.Body == http.NoBody:
	case r.ContentLength >= maxDrainedBody || !bodyArrived(w, r):
		w.Header().Set("connection", "close")
	}
}

// replyInHeaders readies a reply made as the request's headers are
// decoded (by the connection manager before the filters, or by the filter
// within its proxy_on_request_headers) to go out at once, as Envoy sends
// it: its HTTP/1 codec hands the headers on before it parses any body that
// came with them, so such a reply to a request with a body is one made
// before the request was complete, and ends the connection.
func replyInHeaders(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		w.Header().Set("connection", "close")
	}
}

// bodyArrived reads and drops the rest of r's body and reports whether it
// came whole within bodyArrivalWait: what is already in the socket is read
// at once. A client still waiting for a 100 Continue has sent none of it,
// and reading would ask it for the body: not read. The read runs without a
// deadline, so that a body read to its end leaves the connection as it
// was (the server's read that follows a body's end, to see the client
// leave, would stop at a deadline left set and end the connection); a
// read still waiting when bodyArrivalWait is up is stopped by one, which
// leaves the connection unusable to Go's server, as it is then ended.
func bodyArrived(w http.ResponseWriter, r *http.Request) bool {
	if strings.EqualFold(r.Header.Get("expect"), "100-continue") {
		return false
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, r.Body, maxDrainedBody)
		done <- err
	}()
	t := time.NewTimer(bodyArrivalWait)
	defer t.Stop()
	select {
	case err := <-done:
		return err == io.EOF
	case <-t.C:
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Unix(1, 0)) != nil {
		// Not a connection Go's server made: nothing stops the read.
		return false
	}
	<-done
	return false
}

// bodyArrivalWait is how long bodyArrived waits for the rest of a body: a
// client still sending it gets its reply this much later at most, with
// connection: close.
const bodyArrivalWait = 5 * time.Millisecond

// maxDrainedBody is the most of a body read to keep the connection after a
// reply made before it (net/http's maxPostHandlerReadBytes, the most Go's
// server reads for the same purpose).
const maxDrainedBody = 256 << 10

// isUpgrade reports whether a request asks to upgrade its connection as
// Envoy sees it (Http::Utility::isUpgrade): an Upgrade header, and
// "upgrade" among the Connection header's tokens; an Upgrade: h2c is not,
// as Envoy's HTTP/1 codec removes it.
func isUpgrade(h http.Header) bool {
	up := h.Get("upgrade")
	if up == "" || strings.EqualFold(up, "h2c") {
		return false
	}
	for _, v := range h.Values("connection") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// edgeHeaders does to a request's x-envoy-* headers what Envoy's
// connection manager does on a listener with use_remote_address
// (ConnectionManagerUtility::mutateRequestHeaders): a client's
// x-envoy-internal is never kept; a request from an internal address
// (internal_address_config) without an x-forwarded-for of its own is
// marked x-envoy-internal: true and keeps the rest, so the router would
// act on its x-envoy-retry-on; any other is an edge request, which loses
// the headers that steer the router and gets x-envoy-external-address.
func edgeHeaders(h []wasmhost.Header, r *http.Request, internal []netip.Prefix) []wasmhost.Header {
	var ip netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		ip = ap.Addr().Unmap()
	}
	isInternal := false
	if _, xff := r.Header["X-Forwarded-For"]; !xff && ip.IsValid() {
		for _, p := range internal {
			if p.Contains(ip) {
				isInternal = true
				break
			}
		}
	}
	out := h[:0]
	for _, x := range h {
		switch {
		case x[0] == "x-envoy-internal":
			continue
		case !isInternal && (envoyInternalOnly[x[0]] || x[0] == "x-envoy-external-address"):
			continue
		}
		out = append(out, x)
	}
	if isInternal {
		return append(out, wasmhost.Header{"x-envoy-internal", "true"})
	}
	if ip.IsValid() {
		out = append(out, wasmhost.Header{"x-envoy-external-address", ip.String()})
	}
	return out
}

// envoyInternalOnly are the headers Envoy removes from an edge request
// (ConnectionManagerUtility::cleanInternalHeaders): those its router
// obeys (retries, timeouts, hedging), and those only Envoys set.
var envoyInternalOnly = map[string]bool{
	"x-envoy-decorator-operation": true, "x-envoy-downstream-service-cluster": true,
	"x-envoy-downstream-service-node": true, "x-envoy-retriable-status-codes": true,
	"x-envoy-retriable-header-names": true, "x-envoy-retry-on": true, "x-envoy-retry-grpc-on": true,
	"x-envoy-max-retries": true, "x-envoy-upstream-alt-stat-name": true,
	"x-envoy-upstream-rq-timeout-ms": true, "x-envoy-upstream-rq-per-try-timeout-ms": true,
	"x-envoy-upstream-rq-timeout-alt-response": true, "x-envoy-expected-rq-timeout-ms": true,
	"x-envoy-force-trace": true, "x-envoy-ip-tags": true, "x-envoy-original-url": true,
	"x-envoy-hedge-on-per-try-timeout": true,
}

// upstreamFailureBody is Envoy's local reply text when no response came.
func upstreamFailureBody(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		if op.Timeout() {
			return "upstream connect error or disconnect/reset before headers. reset reason: connection timeout"
		}
		var errno syscall.Errno
		reason := op.Err.Error()
		if errors.As(err, &errno) {
			reason = strconv.Itoa(int(errno))
		}
		return "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: " + reason
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "upstream request timeout"
	}
	return "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
}

// envoyMethods are the methods Envoy's HTTP/1 codec accepts when
// allow_custom_methods is off (its default): those of Balsa's list in
// source/common/http/http1/balsa_parser.cc, upper case only.
var envoyMethods = map[string]bool{}

func init() {
	for _, m := range strings.Fields(`ACL BIND CHECKOUT CONNECT COPY DELETE GET HEAD LINK LOCK MERGE
		MKACTIVITY MKCALENDAR MKCOL MOVE MSEARCH NOTIFY OPTIONS PATCH POST PROPFIND PROPPATCH PURGE
		PUT REBIND REPORT SEARCH SOURCE SUBSCRIBE TRACE UNBIND UNLINK UNLOCK UNSUBSCRIBE`) {
		envoyMethods[m] = true
	}
}

// requestPath is the :path Envoy's connection manager gives the filters
// and the router for r, with envoy.yaml's settings, in Envoy's order: the
// fragment dropped, escaped slashes and backslashes handled as action says
// (path_with_escaped_slashes_action), then normalize_path and merge_slashes
// (normalizePath). redirect: the path held escaped slashes and action is
// UNESCAPE_AND_REDIRECT, so Envoy answers 307 with path as location. ok
// false: Envoy answers 400.
func requestPath(r *http.Request, action envoyconfig.EscapedSlashesAction) (path string, redirect, ok bool) {
	// The request target as sent: Go's r.URL.RequestURI() escapes a
	// backslash, which normalize_path takes for a slash.
	target := r.RequestURI
	for i := 0; i < len(target); i++ {
		// Envoy's HTTP/1 codec (Balsa's isUrlValid) takes visible ASCII,
		// tab and form feed in a request target, and refuses the rest.
		if c := target[i]; (c < '!' || c > '~') && c != '\t' && c != '\f' {
			return "", false, false
		}
	}
	if !strings.HasPrefix(target, "/") {
		// The absolute form: Envoy routes on its path.
		target = r.URL.RequestURI()
	}
	target, _, _ = strings.Cut(target, "#")
	if action != envoyconfig.KeepEscapedSlashes {
		var found bool
		if target, found = unescapeSlashes(target); found {
			switch action {
			case envoyconfig.RejectEscapedSlashes:
				return "", false, false
			case envoyconfig.UnescapeAndRedirect:
				redirect = true
			}
		}
	}
	path, ok = normalizePath(target)
	return path, redirect && ok, ok
}

// unescapeSlashes is Envoy's PathUtil::unescapeSlashes: %2F and %2f become
// "/", %5C and %5c a backslash, in the path and not in the query. found
// reports whether there were any.
func unescapeSlashes(target string) (unescaped string, found bool) {
	p, query, hasQuery := strings.Cut(target, "?")
	if !strings.Contains(p, "%") {
		return target, false
	}
	u := slashUnescaper.Replace(p)
	if u == p {
		return target, false
	}
	if hasQuery {
		u += "?" + query
	}
	return u, true
}

var slashUnescaper = strings.NewReplacer("%2F", "/", "%2f", "/", "%5C", `\`, "%5c", `\`)

// normalizePath applies Envoy's normalize_path and merge_slashes to a
// request target: a backslash is a slash (normalize_path canonicalizes
// like a browser), parameters dropped from dot segments, dot segments
// resolved, repeated slashes merged, the query kept. A target that is not
// a path fails.
func normalizePath(target string) (string, bool) {
	p, query, hasQuery := strings.Cut(target, "?")
	if !strings.HasPrefix(p, "/") {
		return "", false
	}
	if strings.Contains(p, ".;") {
		// Envoy's stripParametersFromDotSegments: a "..;params" or
		// ".;params" segment is ".." or "." (a Java service reads it so).
		segs := strings.Split(p, "/")
		for i, seg := range segs {
			if strings.HasPrefix(seg, "..;") {
				segs[i] = ".."
			} else if strings.HasPrefix(seg, ".;") {
				segs[i] = "."
			}
		}
		p = strings.Join(segs, "/")
	}
	p = strings.ReplaceAll(p, `\`, "/")
	var out []string
	for _, seg := range strings.Split(p[1:], "/") {
		// Envoy's normalize_path canonicalizes like a browser: a
		// percent-encoded dot is a dot, so "%2e%2e" is a dot-dot segment.
		switch strings.ToLower(seg) {
		case "", ".", "%2e":
			continue
		case "..", ".%2e", "%2e.", "%2e%2e":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, seg)
		}
	}
	np := "/" + strings.Join(out, "/")
	if len(out) > 0 && (strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..")) {
		np += "/"
	}
	if hasQuery {
		np += "?" + query
	}
	return np, true
}

func firstValue(h []wasmhost.Header, name string) string {
	for _, x := range h {
		if x[0] == name {
			return x[1]
		}
	}
	return ""
}

func localAddr(r *http.Request) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return a.String()
	}
	return ""
}

// writeAccessLog writes one line for the request, when enabled: start
// time, request line, status, response code details, duration (ms), user
// agent, x-forwarded-for and cluster (envoy/README.md, -access-log); not
// Envoy's default format, which has more fields in another order.
func (g *gateway) writeAccessLog(r *http.Request, x *exchange) {
	if g.accessLog == nil {
		return
	}
	g.logMu.Lock()
	defer g.logMu.Unlock()
	fmt.Fprintf(g.accessLog, "[%s] %q %d %s %d %q %q %q\n", x.start.UTC().Format(time.RFC3339Nano),
		r.Method+" "+r.URL.RequestURI()+" "+r.Proto, x.status, x.details, time.Since(x.start).Milliseconds(),
		r.UserAgent(), r.Header.Get("x-forwarded-for"), x.cluster)
}
