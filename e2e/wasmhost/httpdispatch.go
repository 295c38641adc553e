package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// HTTPCluster is an upstream cluster calls can be sent to.
type HTTPCluster struct {
	Endpoints []string // "host:port", used in turn
	// ConnectTimeout bounds connection set-up; defaults to Envoy's 5s.
	ConnectTimeout time.Duration
}

// HTTPDispatcher sends calls over HTTP/1.1 to clusters of real endpoints,
// with pooled connections, and answers failures as an Envoy cluster does:
// a connection that cannot be made, or that ends before a response, is a
// 503 local reply; a response cut short is a reset. The call's timeout is
// the host's (a 504). It is safe for concurrent use by many VMs.
type HTTPDispatcher struct {
	clusters map[string]*httpCluster
}

type httpCluster struct {
	endpoints []string
	next      atomic.Uint64
	client    *http.Client
}

// NewHTTPDispatcher returns a dispatcher for the given clusters, by name.
func NewHTTPDispatcher(clusters map[string]HTTPCluster) *HTTPDispatcher {
	d := &HTTPDispatcher{clusters: map[string]*httpCluster{}}
	for name, c := range clusters {
		timeout := c.ConnectTimeout
		if timeout <= 0 {
			timeout = 5 * time.Second
		}
		dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
		d.clusters[name] = &httpCluster{
			endpoints: append([]string(nil), c.Endpoints...),
			client: &http.Client{
				Transport: &http.Transport{
					DialContext:         dialer.DialContext,
					MaxIdleConns:        1024,
					MaxIdleConnsPerHost: 256,
					IdleConnTimeout:     60 * time.Second,
					DisableCompression:  true,
				},
				// Envoy's async client does not follow redirects.
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			},
		}
	}
	return d
}

// Cluster reports whether the cluster is configured and has an endpoint.
func (d *HTTPDispatcher) Cluster(name string) bool {
	c := d.clusters[name]
	return c != nil && len(c.endpoints) > 0
}

// Close drops the idle pooled connections.
func (d *HTTPDispatcher) Close() {
	for _, c := range d.clusters {
		c.client.CloseIdleConnections()
	}
}

// Dispatch sends the call on its own goroutine.
func (d *HTTPDispatcher) Dispatch(ctx context.Context, call Callout, respond func(CalloutResponse)) error {
	c := d.clusters[call.Cluster]
	if c == nil || len(c.endpoints) == 0 {
		return ErrNoSuchCluster
	}
	endpoint := c.endpoints[c.next.Add(1)%uint64(len(c.endpoints))]
	req, err := buildRequest(ctx, endpoint, call)
	if err != nil {
		return err
	}
	go func() {
		r, ok := c.do(ctx, req)
		if ok {
			respond(r)
		}
	}()
	return nil
}

func buildRequest(ctx context.Context, endpoint string, call Callout) (*http.Request, error) {
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
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+endpoint+path, bytes.NewReader(call.Body))
	if err != nil {
		return nil, err
	}
	req.Host = authority
	for _, h := range call.Headers {
		if strings.HasPrefix(h[0], ":") || h[0] == "content-length" || h[0] == "host" {
			continue
		}
		req.Header.Add(h[0], h[1])
	}
	req.ContentLength = int64(len(call.Body))
	return req, nil
}

// do performs the request; ok is false when the host stopped waiting.
func (c *httpCluster) do(ctx context.Context, req *http.Request) (CalloutResponse, bool) {
	resp, err := c.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return CalloutResponse{}, false
		}
		return failureResponse(err), true
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return CalloutResponse{}, false
		}
		// The response had begun: Envoy can only reset.
		return CalloutResponse{Reset: true}, true
	}
	return CalloutResponse{
		Headers:  responseHeaders(resp.StatusCode, resp.Header),
		Body:     body,
		Trailers: flatten(resp.Trailer),
	}, true
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
	return append([]Header{{":status", strconv.Itoa(status)}}, flatten(h)...)
}

func flatten(h http.Header) []Header {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []Header
	for _, name := range names {
		for _, v := range h[name] {
			out = append(out, Header{strings.ToLower(name), v})
		}
	}
	return out
}
