package e2e_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// A gRPC client behind the gateway gets what it acts on. Envoy answers a
// gRPC request (content-type application/grpc) that a filter replies to
// itself with a trailers-only 200 whose grpc-status says what happened;
// the filter names RESOURCE_EXHAUSTED (8) for a 429, which gRPC clients do
// not retry unless their policy says so, and carries the wait as gRPC's
// server pushback (grpc-retry-pushback-ms, gRFC A6): without it Envoy maps
// the 429 to UNAVAILABLE (14), which they retry at once. Missing and
// unknown keys are UNAUTHENTICATED (16) and PERMISSION_DENIED (7). The
// gateway speaks HTTP/1.1 only, so the calls are gRPC-shaped HTTP/1.1
// requests (POST /package.Service/Method, content-type application/grpc,
// the key in metadata, a header): what Envoy decides a gRPC reply by, the
// content-type, is the same over HTTP/2. envoy.yaml's filter configuration
// as shipped: its cost rule (a POST under /orders costs 5) matches every
// call to an orders.* service, since every gRPC call is a POST.
func TestGRPCCallsGetGRPCStatuses(t *testing.T) {
	// Two tokens, refilled at 1 per 1000 s: none comes back during the
	// test, and a denied call of cost 1 waits up to 1000 s.
	s := startStack(t, stackConfig{
		plans: "plans:\n  two: {capacity: 2, rate: 0.001}\nclients:\n" +
			"  grpc-1: two\n  grpc-2: two\n  grpc-3: two\n  huge-1: two\n  huge-2: two\n  huge-3: two\n",
	})
	call := func(path string, headers ...string) reply {
		return s.do(0, "POST", path, append([]string{"content-type", "application/grpc", "te", "trailers"}, headers...)...)
	}
	grpcStatus := func(r reply, code string) error {
		if r.status != http.StatusOK || r.header.Get("content-type") != "application/grpc" ||
			r.header.Get("grpc-status") != code || r.body != "" {
			return fmt.Errorf("reply %d %v %q, want a trailers-only 200 with grpc-status %s", r.status, r.header, r.body, code)
		}
		return nil
	}
	s.decidedRun(t, "a gRPC client over its plan", func(run int) error {
		client := "grpc-" + strconv.Itoa(run)
		for i := range 2 {
			if r := call("/billing.v1.Billing/Pay", "x-api-key", client); r.status != http.StatusOK || r.header.Get("grpc-status") != "" {
				return fmt.Errorf("call %d: %d grpc-status %q, want the service's 200", i, r.status, r.header.Get("grpc-status"))
			}
		}
		r := call("/billing.v1.Billing/Pay", "x-api-key", client)
		if err := grpcStatus(r, "8"); err != nil {
			return fmt.Errorf("third call: %w", err)
		}
		// The wait is 1000 s less what refilled since the first call:
		// 0.001 token a second, so a Retry-After of 1000 within the
		// first second, 990 after ten; the pushback is the same wait.
		if r.retryAfter < 990 || r.retryAfter > 1000 || r.header.Get(limiter.PushbackHeader) != strconv.Itoa(r.retryAfter*1000) {
			return fmt.Errorf("third call: retry-after %d, %s %q; want 990 to 1000 and the same in ms", r.retryAfter, limiter.PushbackHeader, r.header.Get(limiter.PushbackHeader))
		}
		if got := s.received(client); got != 2 {
			return fmt.Errorf("%d calls reached the services, want the 2 admitted", got)
		}
		return nil
	})
	s.decidedRun(t, "a gRPC call that can never succeed", func(run int) error {
		// Cost 5 (POST under /orders) on a plan of 2.
		r := call("/orders.v1.Orders/Get", "x-api-key", "huge-"+strconv.Itoa(run))
		if err := grpcStatus(r, "8"); err != nil {
			return err
		}
		if r.header.Get(limiter.PushbackHeader) != "-1" || r.header.Get("retry-after") != "" {
			return fmt.Errorf("retry-after %q, %s %q; want none and -1, do not retry", r.header.Get("retry-after"), limiter.PushbackHeader, r.header.Get(limiter.PushbackHeader))
		}
		return nil
	})
	if err := grpcStatus(call("/billing.v1.Billing/Pay"), "16"); err != nil {
		t.Errorf("no key: %v", err)
	}
	s.decidedRun(t, "a gRPC call with a key no plan lists", func(int) error {
		return grpcStatus(call("/billing.v1.Billing/Pay", "x-api-key", "stranger"), "7")
	})
}

// A browser's gRPC-Web client (grpc-web's JavaScript client, Connect's
// gRPC-Web transport) on a page of envoy.yaml's CORS origin reads what
// the limiter tells it. Envoy takes a gRPC-Web request for no gRPC one,
// and its plain 429 reached such a client as an HTTP error: Connect maps
// a 429 to UNAVAILABLE, which its status retry logic retries at once, and
// grpc-web's client ends the call UNKNOWN on the problem's content-type.
// The preflight allows the headers these clients send; a denied call is a
// 200 of the call's content-type whose body is a gRPC-Web trailer frame
// with grpc-status RESOURCE_EXHAUSTED (8) and the wait as
// grpc-retry-pushback-ms, which a page reads with
// Access-Control-Allow-Origin alone, beside Retry-After, which CORS
// exposes; no key and an unknown key are UNAUTHENTICATED (16) and
// PERMISSION_DENIED (7). Plan two: 2 tokens, 1 back every 1000 s.
func TestGRPCWebCallsReadTheirStatusThroughCORS(t *testing.T) {
	types := []string{"application/grpc-web", "application/grpc-web+proto", "application/grpc-web-text"}
	plans := "plans:\n  two: {capacity: 2, rate: 0.001}\nclients:\n"
	for i := range types {
		for run := 1; run <= decidedAttempts; run++ {
			plans += fmt.Sprintf("  web-%d-%d: two\n", i, run)
		}
	}
	s := startStack(t, stackConfig{plans: plans})
	const app = "https://app.example.com"
	const path = "/billing.v1.Billing/Pay"

	// The preflight of a call as grpc-web's client makes it, with the key
	// and a deadline: each header it asks for must be allowed, or the
	// browser makes no call.
	asked := []string{"content-type", "x-api-key", "x-grpc-web", "x-user-agent", "grpc-timeout"}
	pre := s.do(0, "OPTIONS", path, "origin", app, "access-control-request-method", "POST",
		"access-control-request-headers", strings.Join(asked, ","))
	allowed := strings.Split(pre.header.Get("access-control-allow-headers"), ", ")
	for _, h := range asked {
		if !slices.Contains(allowed, h) {
			t.Errorf("preflight: %d, access-control-allow-headers %q: no %s, so the browser refuses the call", pre.status, allowed, h)
		}
	}

	call := func(ct string, headers ...string) reply {
		return s.do(0, "POST", path, append([]string{"origin", app, "content-type", ct,
			"x-grpc-web", "1", "x-user-agent", "grpc-web-javascript/0.1"}, headers...)...)
	}
	// readable is what the page's client reads of a reply the limiter
	// made: the status and trailers in the body, which the browser hands
	// over with Access-Control-Allow-Origin, and the exposed headers.
	readable := func(ct string, r reply, code string) (map[string]string, error) {
		if r.status != http.StatusOK || r.header.Get("content-type") != ct {
			return nil, fmt.Errorf("reply %d, content-type %q; want a 200 of %s", r.status, r.header.Get("content-type"), ct)
		}
		if got := r.header.Get("access-control-allow-origin"); got != app {
			return nil, fmt.Errorf("access-control-allow-origin %q, want %s: the page sees a network error", got, app)
		}
		tr, err := filtertest.ParseGRPCWebTrailers(ct, []byte(r.body))
		if err != nil {
			return nil, fmt.Errorf("body %q: %w", r.body, err)
		}
		if tr["grpc-status"] != code {
			return tr, fmt.Errorf("grpc-status %q, want %s", tr["grpc-status"], code)
		}
		return tr, nil
	}
	for i, ct := range types {
		s.decidedRun(t, ct+" over its plan", func(run int) error {
			client := fmt.Sprintf("web-%d-%d", i, run)
			for n := range 2 {
				if r := call(ct, "x-api-key", client); r.status != http.StatusOK || r.header.Get("ratelimit-policy") == "" {
					return fmt.Errorf("call %d: %d, ratelimit-policy %q; want the service's 200", n, r.status, r.header.Get("ratelimit-policy"))
				}
			}
			r := call(ct, "x-api-key", client)
			tr, err := readable(ct, r, "8")
			if err != nil {
				return fmt.Errorf("third call: %w", err)
			}
			// The wait is 1000 s less what refilled since the first call:
			// a Retry-After of 990 to 1000 within ten seconds, and the
			// pushback the same wait in ms.
			if r.retryAfter < 990 || r.retryAfter > 1000 || tr[limiter.PushbackHeader] != strconv.Itoa(r.retryAfter*1000) {
				return fmt.Errorf("third call: retry-after %d, trailer %s %q; want 990 to 1000 and the same in ms", r.retryAfter, limiter.PushbackHeader, tr[limiter.PushbackHeader])
			}
			exposed := strings.Split(r.header.Get("access-control-expose-headers"), ", ")
			for _, h := range []string{"retry-after", "ratelimit", "grpc-status", "grpc-message", limiter.PushbackHeader} {
				if !slices.Contains(exposed, h) {
					return fmt.Errorf("third call: access-control-expose-headers %q: no %s", exposed, h)
				}
			}
			if got := s.received(client); got != 2 {
				return fmt.Errorf("%d calls reached the services, want the 2 admitted", got)
			}
			return nil
		})
	}
	if _, err := readable(types[1], call(types[1]), "16"); err != nil {
		t.Errorf("no key: %v", err)
	}
	s.decidedRun(t, "a gRPC-Web call with a key no plan lists", func(int) error {
		_, err := readable(types[2], call(types[2], "x-api-key", "stranger"), "7")
		return err
	})
}
