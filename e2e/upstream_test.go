package e2e_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
)

// TestServiceOwn429KeepsItsFields sends requests through envoy.yaml's
// gateway to a service that answers 429 itself (its safety limit, README
// "Rolling out" step 4) while the edge admitted the request with tokens to
// spare. The client must read the service's refusal: its Retry-After,
// once; its legacy ratelimit-remaining of 0, never the edge's tokens left
// on a 429 the edge did not make; and the draft's RateLimit list, with the
// service's item and the edge's beside it, each naming its policy.
func TestServiceOwn429KeepsItsFields(t *testing.T) {
	// A plan of 20 tokens: the requests below leave the edge's bucket far
	// from empty (r >= 17), so any remaining of 0 the client reads is the
	// service's.
	s := startStack(t, stackConfig{plans: "default_plan: wide\nplans:\n  wide: {capacity: 20, rate: 0.001}\n"})
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("content-type", "application/json")
		h.Set("retry-after", "7")
		if r.URL.Path == "/orders/with-fields" {
			h.Set("ratelimit-policy", `"safety";q=200;w=1`)
			h.Set("ratelimit", `"safety";r=0;t=7`)
			h.Set("ratelimit-limit", "200")
			h.Set("ratelimit-remaining", "0")
			h.Set("ratelimit-reset", "7")
		}
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":"safety_limit","retry_after":7}` + "\n"))
	}))
	t.Cleanup(svc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := harness.StartGateway(ctx, bins, harness.GatewayConfig{
		Config:   repoFile(t, "envoy/envoy.yaml"),
		Clusters: map[string]string{"orders": svc.Listener.Addr().String(), "billing": s.billing.Addr, "ratelimit_sidecar": s.scAddrs[0]},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.own(g.Process)
	s.gateways = append(s.gateways, g)
	gw := len(s.gateways) - 1

	t.Run("service sets the fields", func(t *testing.T) {
		r := s.on(t).doDecided(gw, "GET", "/orders/with-fields", "x-api-key", "own-429-a")
		t.Logf("%d %v", r.status, r.header)
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("status %d, want the service's 429", r.status)
		}
		if v := r.header.Values("retry-after"); len(v) != 1 || v[0] != "7" {
			t.Errorf("retry-after %q, want the service's [7]", v)
		}
		for name, want := range map[string]string{"ratelimit-limit": "200", "ratelimit-remaining": "0", "ratelimit-reset": "7"} {
			if v := r.header.Values(name); len(v) != 1 || v[0] != want {
				t.Errorf("%s %q, want the service's [%s]", name, v, want)
			}
		}
		rl := r.header.Values("ratelimit")
		if len(rl) != 2 || rl[0] != `"safety";r=0;t=7` || rl[1][:len(`"wide";`)] != `"wide";` {
			t.Errorf("ratelimit %q, want the service's item and then the edge's", rl)
		}
		if pol := r.header.Values("ratelimit-policy"); len(pol) != 2 || pol[0] != `"safety";q=200;w=1` {
			t.Errorf("ratelimit-policy %q, want the service's item and then the edge's", pol)
		}
	})
	t.Run("service sets none", func(t *testing.T) {
		r := s.on(t).doDecided(gw, "GET", "/orders/bare", "x-api-key", "own-429-b")
		t.Logf("%d %v", r.status, r.header)
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("status %d, want the service's 429", r.status)
		}
		if v := r.header.Values("retry-after"); len(v) != 1 || v[0] != "7" {
			t.Errorf("retry-after %q, want the service's [7]", v)
		}
		for _, name := range []string{"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} {
			if v := r.header.Values(name); len(v) != 0 {
				t.Errorf("%s %q on the service's 429: the edge's tokens left read as the limit that refused", name, v)
			}
		}
		if rl := r.header.Values("ratelimit"); len(rl) != 1 || rl[0][:len(`"wide";`)] != `"wide";` {
			t.Errorf("ratelimit %q, want the edge's item", rl)
		}
	})
}
