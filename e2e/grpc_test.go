package e2e_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"

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
