package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// Before any request, the filter as envoy.yaml configures it has the
// gateway open warm_connections connections to the sidecar at once (its
// warm-up calls, POST /v1/warm), and a burst of that many requests together
// then finds them open: the sidecar accepts no new connection.
func TestGatewayWarmsItsSidecarConnections(t *testing.T) {
	filter, _ := modules(t)
	orders := newService(t, "orders", 0)
	const warm = limiter.DefaultWarmConnections
	// The fake sidecar holds each warm-up call until warm of them are in
	// at once: the filter must make them together, not one after another,
	// for the proxy to open that many connections. A check is answered at
	// once.
	var warmUps atomic.Int64
	together := make(chan struct{})
	var once sync.Once
	var conns, checks atomic.Int64
	sidecar := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/warm" {
			checks.Add(1)
			answerCheck(w, r)
			return
		}
		if warmUps.Add(1) >= warm {
			once.Do(func() { close(together) })
		}
		select {
		case <-together:
		case <-time.After(30 * time.Second):
		}
		writeAnswer(w, filtertest.WarmAnswer())
	}))
	sidecar.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	sidecar.Start()
	t.Cleanup(sidecar.Close)
	g := start(t, "-config", envoyYAML, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(), "-cluster", "billing="+testkit.RefusedAddr(t),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())

	// Two rounds of every worker's warm-up, answered: two workers, warm
	// calls each. The second round, a second after the first, tells each
	// worker the first went well, and the next comes 10 s later, so that
	// the burst below has the connections to itself.
	testkit.PollErr(t, 30*time.Second, "the warm-up calls", func() error {
		if n := stat(t, g.admin, "cluster.ratelimit_sidecar.upstream_rq_2xx"); n < 4*warm {
			return fmt.Errorf("%d answered, want two rounds' %d", n, 4*warm)
		}
		return nil
	})
	opened := conns.Load()
	if opened < warm {
		t.Fatalf("the warm-up opened %d connections to the sidecar, want at least %d", opened, warm)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range warm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1", "x-api-key", fmt.Sprintf("client-%d", i))
			if resp.StatusCode != 200 {
				t.Errorf("client-%d: status %d, want 200", i, resp.StatusCode)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := conns.Load() - opened; n != 0 {
		t.Errorf("a burst of %d requests after the warm-up opened %d new connections to the sidecar, want none", warm, n)
	}
	if n := checks.Load(); n != warm {
		t.Errorf("the sidecar got %d checks for the burst's %d requests, want one each", n, warm)
	}
}
