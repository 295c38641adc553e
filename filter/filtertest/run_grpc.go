package filtertest

import (
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// grpcCall is a gRPC call as a client sends it to the gateway: POST to
// /package.Service/Method, content-type application/grpc (or with a +proto
// or +json suffix), the API key in its metadata, which is a header.
func grpcCall(path, key, contentType string, extra ...Header) []Header {
	return request("POST", path, key, append([]Header{{"content-type", contentType}, {"te", "trailers"}}, extra...)...)
}

// grpcReply requires what a gRPC client gets for a reply the filter made
// itself: Envoy's trailers-only response (a 200, content-type
// application/grpc, no body) with grpc-status code, and the problem body as
// grpc-message, percent-encoded. It returns the reply and the decoded
// message.
func grpcReply(t *testing.T, s Stream, code string) (Reply, string) {
	t.Helper()
	r := reply(t, s, 200)
	if len(r.Body) != 0 {
		t.Errorf("gRPC reply with a body %q: a trailers-only response has none", r.Body)
	}
	if ct := header(t, r.Headers, "content-type"); ct != "application/grpc" {
		t.Errorf("gRPC reply: content-type %q, want application/grpc", ct)
	}
	if got := header(t, r.Headers, "grpc-status"); got != code {
		t.Errorf("gRPC reply: grpc-status %q, want %s", got, code)
	}
	msg, err := url.PathUnescape(header(t, r.Headers, "grpc-message"))
	if err != nil {
		t.Errorf("gRPC reply: grpc-message: %v", err)
	}
	return r, msg
}

// goldDenialHeaders are the headers of the filter's 429 to the sidecar's
// answer SidecarAnswer("gold", 100, 1, 0.25, 1): 0.25 tokens at 1/s, cost
// 1 back in 0.75 s, so a wait of 1 s, whatever form the reply takes.
var goldDenialHeaders = map[string]string{
	"retry-after":         "1",
	"ratelimit-policy":    `"gold";q=100;w=100;edgelimit-rate="1"`,
	"ratelimit":           `"gold";r=0;t=1`,
	"ratelimit-limit":     "100",
	"ratelimit-remaining": "0",
	"ratelimit-reset":     "100",
}

// grpcReplies: a gRPC call the filter answers itself gets what gRPC
// clients act on. Envoy answers a gRPC request's local reply with a
// trailers-only 200 whose grpc-status is the plugin's, or the HTTP status
// mapped when it names none: 429 as UNAVAILABLE (14), which gRPC clients
// and retry policies retry at once. A rate limiter's is RESOURCE_EXHAUSTED
// (8), as Envoy's own ratelimit filter answers with
// rate_limited_as_resource_exhausted, and the wait goes in gRPC's server
// pushback, grpc-retry-pushback-ms (gRFC A6): the Retry-After in
// milliseconds, or -1 (do not retry) for a call that can never succeed.
// Missing and unknown keys are UNAUTHENTICATED (16) and PERMISSION_DENIED
// (7). Cost rules and keys work on gRPC paths and metadata.
func (r runner) grpcReplies(t *testing.T) {
	h := r.host(t, `{"costs": [{"path_prefix": "/orders.v1.Orders/Create", "cost": 5}, {"path_prefix": "/orders.v1.Orders/Huge", "cost": 500}]}`)

	// The sidecar's 429: 0.25 tokens at 1/s, cost 1 back in 0.75 s.
	s, c := waiting(t, h, grpcCall("/orders.v1.Orders/Get", "key-1", "application/grpc"))
	if got := header(t, c.Headers, "x-ratelimit-cost"); got != "1" {
		t.Errorf("Get: cost %q, want 1", got)
	}
	s.RespondCallout(SidecarAnswer("gold", 100, 1, 0.25, 1), nil)
	rep, msg := grpcReply(t, s, "8")
	for name, want := range goldDenialHeaders {
		if got := header(t, rep.Headers, name); got != want {
			t.Errorf("gRPC 429: %s %q, want %q", name, got, want)
		}
	}
	if got := header(t, rep.Headers, limiter.PushbackHeader); got != "1000" {
		t.Errorf("gRPC 429: %s %q, want 1000", limiter.PushbackHeader, got)
	}
	if !strings.Contains(msg, `"status":429`) || !strings.Contains(msg, `"error":"rate_limited"`) {
		t.Errorf("gRPC 429: grpc-message %q, want the problem body", msg)
	}
	s.Done()
	counters(t, h, map[string]int64{limiter.MetricDenied: 1})

	// The deny cache's answer to the next call is the same.
	s, _ = send(h, grpcCall("/orders.v1.Orders/Get", "key-1", "application/grpc+proto"))
	rep, _ = grpcReply(t, s, "8")
	if got := header(t, rep.Headers, limiter.PushbackHeader); got != "1000" {
		t.Errorf("cached gRPC 429: %s %q, want 1000", limiter.PushbackHeader, got)
	}
	s.Done()

	// A cost above the capacity can never succeed: pushback -1, do not
	// retry, and no retry-after. The cost rule matched the gRPC path.
	s, c = waiting(t, h, grpcCall("/orders.v1.Orders/Huge", "key-2", "application/grpc"))
	if got := header(t, c.Headers, "x-ratelimit-cost"); got != "500" {
		t.Errorf("Huge: cost %q, want 500", got)
	}
	s.RespondCallout(SidecarAnswer("pro", 200, 100, 200, 500), nil)
	rep, _ = grpcReply(t, s, "8")
	if got := header(t, rep.Headers, limiter.PushbackHeader); got != "-1" {
		t.Errorf("never: %s %q, want -1", limiter.PushbackHeader, got)
	}
	absent(t, rep.Headers, "retry-after")
	s.Done()

	// The key in metadata, as authorization: Bearer; the Create rule.
	s, c = waiting(t, h, grpcCall("/orders.v1.Orders/Create", "", "application/grpc", Header{"authorization", "Bearer key-3"}))
	if got, cost := header(t, c.Headers, "x-api-key"), header(t, c.Headers, "x-ratelimit-cost"); got != "key-3" || cost != "5" {
		t.Errorf("Create with a bearer key: key %q cost %q, want key-3 and 5", got, cost)
	}
	s.RespondCallout(SidecarAnswer("pro", 200, 100, 100, 5), nil)
	wentOn(t, s)
	s.Done()

	// No key: UNAUTHENTICATED; a key no plan lists: PERMISSION_DENIED.
	s, _ = send(h, grpcCall("/orders.v1.Orders/Get", "", "application/grpc"))
	if _, msg := grpcReply(t, s, "16"); !strings.Contains(msg, "missing_api_key") {
		t.Errorf("no key: grpc-message %q", msg)
	}
	s.Done()
	s, _ = waiting(t, h, grpcCall("/orders.v1.Orders/Get", "stranger", "application/grpc"))
	s.RespondCallout([]Header{{":status", "403"}}, nil)
	if _, msg := grpcReply(t, s, "7"); !strings.Contains(msg, "unknown_api_key") {
		t.Errorf("unknown key: grpc-message %q", msg)
	}
	s.Done()

	// A gRPC-Web call is the next row's (grpcWebReplies): no pushback
	// header, no grpc-status header.
	s, _ = waiting(t, h, grpcCall("/orders.v1.Orders/Get", "key-4", "application/grpc-web"))
	s.RespondCallout(SidecarAnswer("gold", 100, 1, 0.25, 1), nil)
	rep = reply(t, s, 200)
	absent(t, rep.Headers, limiter.PushbackHeader, "grpc-status")
	s.Done()
}

// grpcWebCall is a gRPC-Web call as a browser's client sends it: POST to
// /package.Service/Method with a gRPC-Web content-type and x-grpc-web, the
// key in its metadata, a header.
func grpcWebCall(path, key, contentType string, extra ...Header) []Header {
	return request("POST", path, key, append([]Header{{"content-type", contentType}, {"x-grpc-web", "1"}}, extra...)...)
}

// grpcWebReply requires what a gRPC-Web client gets for a reply the filter
// made itself: a 200 of the request's content-type whose body is one
// trailer frame (base64 for -text) with grpc-status code, and no
// grpc-status among the headers, which grpc-web's JavaScript client would
// report a second time. It returns the reply and the trailers, with
// grpc-message decoded.
func grpcWebReply(t *testing.T, s Stream, contentType, code string) (Reply, map[string]string) {
	t.Helper()
	r := reply(t, s, 200)
	if ct := header(t, r.Headers, "content-type"); ct != contentType {
		t.Errorf("gRPC-Web reply: content-type %q, want the request's %q", ct, contentType)
	}
	absent(t, r.Headers, "grpc-status", "grpc-message", limiter.PushbackHeader)
	tr, err := ParseGRPCWebTrailers(contentType, r.Body)
	if err != nil {
		t.Errorf("gRPC-Web reply body %q: %v", r.Body, err)
		return r, map[string]string{}
	}
	if got := tr["grpc-status"]; got != code {
		t.Errorf("gRPC-Web reply: grpc-status %q, want %s", got, code)
	}
	return r, tr
}

// grpcWebReplies: a gRPC-Web call (a browser's: grpc-web's JavaScript
// client, Connect's gRPC-Web transport) the filter answers itself gets
// gRPC-Web's answer. Envoy takes no such request for gRPC, so its plain
// 429 would reach the client as an HTTP error, which Connect maps to
// UNAVAILABLE, the status retry logic retries at once, with the wait in
// headers a browser hides unless CORS exposes them. The filter answers a 200 of the request's
// content-type whose body is a trailer frame: the status, the problem as
// grpc-message and, for a 429, the wait as grpc-retry-pushback-ms; the
// rate-limit headers and Retry-After stay headers. For each gRPC-Web
// content-type: the sidecar's 429, the deny cache's, one that can never
// succeed, no key, and a key no plan lists.
func (r runner) grpcWebReplies(t *testing.T) {
	h := r.host(t, `{"costs": [{"path_prefix": "/orders.v1.Orders/Huge", "cost": 500}]}`)
	for i, ct := range []string{"application/grpc-web", "application/grpc-web+proto", "application/grpc-web-text", "application/grpc-web-text+proto"} {
		key := "web-" + strconv.Itoa(i)
		// The sidecar's 429: 0.25 tokens at 1/s, cost 1 back in 0.75 s.
		s, _ := waiting(t, h, grpcWebCall("/orders.v1.Orders/Get", key, ct))
		s.RespondCallout(SidecarAnswer("gold", 100, 1, 0.25, 1), nil)
		rep, tr := grpcWebReply(t, s, ct, "8")
		for name, want := range goldDenialHeaders {
			if got := header(t, rep.Headers, name); got != want {
				t.Errorf("%s 429: %s %q, want %q", ct, name, got, want)
			}
		}
		if got := tr[limiter.PushbackHeader]; got != "1000" {
			t.Errorf("%s 429: trailer %s %q, want 1000", ct, limiter.PushbackHeader, got)
		}
		if msg := tr["grpc-message"]; !strings.Contains(msg, `"status":429`) || !strings.Contains(msg, `"error":"rate_limited"`) {
			t.Errorf("%s 429: grpc-message %q, want the problem body", ct, msg)
		}
		s.Done()

		// The deny cache's answer to the next call is the same.
		s, _ = send(h, grpcWebCall("/orders.v1.Orders/Get", key, ct))
		if _, tr = grpcWebReply(t, s, ct, "8"); tr[limiter.PushbackHeader] != "1000" {
			t.Errorf("%s cached 429: trailer %s %q, want 1000", ct, limiter.PushbackHeader, tr[limiter.PushbackHeader])
		}
		s.Done()

		// A cost above the capacity: pushback -1, no retry-after.
		s, _ = waiting(t, h, grpcWebCall("/orders.v1.Orders/Huge", "huge-"+strconv.Itoa(i), ct))
		s.RespondCallout(SidecarAnswer("pro", 200, 100, 200, 500), nil)
		rep, tr = grpcWebReply(t, s, ct, "8")
		if got := tr[limiter.PushbackHeader]; got != "-1" {
			t.Errorf("%s never: trailer %s %q, want -1", ct, limiter.PushbackHeader, got)
		}
		absent(t, rep.Headers, "retry-after")
		s.Done()

		// No key: UNAUTHENTICATED; a key no plan lists: PERMISSION_DENIED.
		// Neither has a wait to push back with.
		s, _ = send(h, grpcWebCall("/orders.v1.Orders/Get", "", ct))
		rep, tr = grpcWebReply(t, s, ct, "16")
		if !strings.Contains(tr["grpc-message"], "missing_api_key") || header(t, rep.Headers, "www-authenticate") != "Bearer" {
			t.Errorf("%s no key: grpc-message %q, headers %q", ct, tr["grpc-message"], rep.Headers)
		}
		if _, ok := tr[limiter.PushbackHeader]; ok {
			t.Errorf("%s no key: trailer %s, want none", ct, limiter.PushbackHeader)
		}
		s.Done()
		s, _ = waiting(t, h, grpcWebCall("/orders.v1.Orders/Get", "stranger-"+strconv.Itoa(i), ct))
		s.RespondCallout([]Header{{":status", "403"}}, nil)
		if _, tr = grpcWebReply(t, s, ct, "7"); !strings.Contains(tr["grpc-message"], "unknown_api_key") {
			t.Errorf("%s unknown key: grpc-message %q", ct, tr["grpc-message"])
		}
		s.Done()
	}
	counters(t, h, map[string]int64{limiter.MetricDenied: 8, limiter.MetricDeniedCached: 4, limiter.MetricMissingKey: 4, limiter.MetricUnknownKey: 4})
}
