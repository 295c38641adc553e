package e2e_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
)

// What the edge does with requests that are more than a plain GET, through
// envoy.yaml as shipped.

// recordingService answers every request with status and keeps the
// headers of each request that reached it.
type recordingService struct {
	*httptest.Server
	mu   sync.Mutex
	seen []http.Header
}

func startRecordingService(t *testing.T, status int) *recordingService {
	t.Helper()
	s := &recordingService{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen = append(s.seen, r.Header.Clone())
		s.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *recordingService) requests() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.seen...)
}

// startGatewayTo starts a gateway on envoy.yaml as shipped whose two
// services are both svc, beside the stack's first sidecar.
func startGatewayTo(t *testing.T, s *stack, svc *httptest.Server) *harness.Gateway {
	t.Helper()
	addr := strings.TrimPrefix(svc.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := harness.StartGateway(ctx, bins, harness.GatewayConfig{
		Config:   repoFile(t, "envoy/envoy.yaml"),
		Clusters: map[string]string{"orders": addr, "billing": addr, "ratelimit_sidecar": s.scAddrs[0]},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.own(g.Process)
	return g
}

// A client cannot make the router send its request twice: the x-envoy-*
// headers Envoy's router obeys (x-envoy-retry-on, x-envoy-max-retries, …)
// are removed from every client's request, the loopback client's here
// included (envoy.yaml trusts no address as internal), so a charged POST
// the service answers 503 reaches it once, and a client's
// x-envoy-internal never reaches a service.
func TestClientCannotSteerRetries(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	svc := startRecordingService(t, http.StatusServiceUnavailable)
	g := startGatewayTo(t, s, svc.Server)

	steering := []string{
		"x-envoy-retry-on", "5xx,reset,connect-failure,retriable-status-codes",
		"x-envoy-max-retries", "3",
		"x-envoy-retriable-status-codes", "503",
		"x-envoy-upstream-rq-timeout-ms", "60000",
		"x-envoy-upstream-rq-per-try-timeout-ms", "1",
		"x-envoy-hedge-on-per-try-timeout", "true",
		"x-envoy-internal", "true",
	}
	head := "POST /billing/pay HTTP/1.1\r\nhost: shop\r\nconnection: close\r\nx-api-key: retrier\r\ncontent-length: 3\r\n"
	for i := 0; i+1 < len(steering); i += 2 {
		head += steering[i] + ": " + steering[i+1] + "\r\n"
	}
	if st, body := rawRequest(t, g.Addr, head+"\r\nabc"); st != http.StatusServiceUnavailable {
		t.Fatalf("status %d (%q), want the service's 503 passed on", st, body)
	}
	seen := svc.requests()
	if len(seen) != 1 {
		t.Fatalf("the service received the request %d times, want once", len(seen))
	}
	for i := 0; i+1 < len(steering); i += 2 {
		if v := seen[0].Values(steering[i]); len(v) > 0 {
			t.Errorf("the service received the client's %s: %q; an edge request loses it", steering[i], v)
		}
	}
	if got := seen[0].Get("x-envoy-external-address"); got != "127.0.0.1" {
		t.Errorf("x-envoy-external-address = %q, want the client's address, 127.0.0.1 (an edge request)", got)
	}
}
