package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
		if len(rl) != 2 || rl[0] != `"safety";r=0;t=7` || !strings.HasPrefix(rl[1], `"wide";`) {
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
		if rl := r.header.Values("ratelimit"); len(rl) != 1 || !strings.HasPrefix(rl[0], `"wide";`) {
			t.Errorf("ratelimit %q, want the edge's item", rl)
		}
	})
}

// TestServiceSilentPastStreamIdleTimeout: a service that says nothing for
// longer than envoy.yaml's stream_idle_timeout ends the stream as Envoy's
// connection manager ends it, before the route's 15 s timeout: a 408
// "stream timeout" when its response has not begun (passed through the
// filter, which adds its fields: the request was admitted and charged),
// a reset once it has; a service that keeps sending, however long, is
// never cut. This gateway's stream_idle_timeout is 0.5 s, not 10 s, so
// that the test waits it out in under a second; the behaviour is the same.
func TestServiceSilentPastStreamIdleTimeout(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	const idle = 500 * time.Millisecond
	release := make(chan struct{})
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/orders/silent":
		case "/orders/stalls":
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "part")
			w.(http.Flusher).Flush()
		case "/orders/trickle":
			// 20 chunks idle/10 apart: 1 s in all, twice the idle
			// timeout, with 450 ms to spare between any two chunks.
			w.WriteHeader(http.StatusOK)
			for i := 0; i < 20; i++ {
				io.WriteString(w, "data: x\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(idle / 10)
			}
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(svc.Close)
	t.Cleanup(func() { close(release) })
	raw, err := os.ReadFile(repoFile(t, "envoy/envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(raw), "stream_idle_timeout: 10s", "stream_idle_timeout: 0.5s", 1)
	if cfg == string(raw) {
		t.Fatal("envoy.yaml has no stream_idle_timeout: 10s to shorten")
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGatewayOn(t, s, svc, path)
	// The answer is due idle after the request; hangBound (2 s) is a wide
	// margin for a loaded machine. The old gateway waited for the service
	// (here: until the test ends) or the route's 15 s.
	client := &http.Client{Timeout: idle + hangBound}
	get := func(t *testing.T, path, key string) (*http.Response, error) {
		req, err := http.NewRequest("GET", "http://"+g.Addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-api-key", key)
		return client.Do(req)
	}

	t.Run("silent before its response", func(t *testing.T) {
		before, start := s.failedOpen(), time.Now()
		resp, err := get(t, "/orders/silent", "idle-silent")
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("%d after %v: %q %v", resp.StatusCode, time.Since(start), body, resp.Header)
		if resp.StatusCode != http.StatusRequestTimeout || string(body) != "stream timeout" {
			t.Fatalf("%d %q, want Envoy's 408 \"stream timeout\"", resp.StatusCode, body)
		}
		// A check that missed its 5 ms on a loaded machine failed open and
		// added no fields: only a decided request is held to them.
		if got := resp.Header.Get("ratelimit-remaining"); got != "1" && s.failedOpen() == before {
			t.Errorf("ratelimit-remaining %q, want 1: the request was admitted and charged", got)
		}
	})
	t.Run("silent after its response began", func(t *testing.T) {
		resp, err := get(t, "/orders/stalls", "idle-stalls")
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want the service's 200", resp.StatusCode)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
			t.Fatalf("body %q, %v: want the stream reset after %v of silence", body, err, idle)
		}
	})
	t.Run("a slow stream that keeps sending", func(t *testing.T) {
		resp, err := get(t, "/orders/trickle", "idle-trickle")
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || strings.Count(string(body), "data: x\n\n") != 20 {
			t.Fatalf("%d: %d bytes, %v; want all 20 events", resp.StatusCode, len(body), err)
		}
	})
}
