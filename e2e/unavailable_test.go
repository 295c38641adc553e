package e2e_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// A 503 to the filter's check comes from the sidecar when Redis is down or
// late, and from the proxy itself when the sidecar is not there to answer
// (Envoy's local reply for a refused connection). Both fail open and count
// as failed_open.unavailable; the gateway's log says which it was, since a
// dead sidecar takes its own metrics with it.
func TestUnavailableLogNamesWhoAnswered(t *testing.T) {
	const (
		line        = "edgelimit: failing open (unavailable): "
		fromSidecar = line + "sidecar answered 503: redis "
		fromProxy   = line + "the proxy answered 503 for the sidecar (not reachable: upstream connect error or disconnect/reset before headers."
	)
	plans := "default_plan: tiny\nplans:\n  tiny: {capacity: 2, rate: 0.001}\n"
	// until sends requests, each as a new client (a denied one would be
	// answered from the deny cache), until the gateway's log holds want;
	// each must pass (fail open).
	until := func(t *testing.T, s *stack, what, want string) {
		t.Helper()
		n := 0
		testkit.Poll(t, 30*time.Second, what, func() bool {
			n++
			if r := s.do(0, "GET", "/orders/1", "x-api-key", "who-"+what+"-"+strconv.Itoa(n)); r.status != http.StatusOK {
				t.Fatalf("%s: status %d, want 200 (fail open)", what, r.status)
			}
			return strings.Contains(s.gateways[0].Output(), want)
		})
		for _, l := range strings.Split(s.gateways[0].Output(), "\n") {
			if strings.Contains(l, line) {
				t.Log(l)
			}
		}
	}

	t.Run("redis down", func(t *testing.T) {
		s := startStack(t, stackConfig{plans: plans})
		if err := s.redis.Kill(); err != nil {
			t.Fatal(err)
		}
		until(t, s, "redis-down", fromSidecar)
		if out := s.gateways[0].Output(); strings.Contains(out, "the proxy answered 503") {
			t.Errorf("with the sidecar up and Redis down, the gateway's log blames the proxy:\n%s", out)
		}
	})

	t.Run("sidecar not running", func(t *testing.T) {
		s := startStack(t, stackConfig{plans: plans})
		s.sidecars[0].Kill()
		until(t, s, "sidecar-down", fromProxy)
		if out := s.gateways[0].Output(); strings.Contains(out, "sidecar answered 503") {
			t.Errorf("with the sidecar not running, the gateway's log blames the sidecar:\n%s", out)
		}
		if s.stat(counter("failed_open.unavailable")) < 1 {
			t.Error("failed_open.unavailable did not count the proxy's 503")
		}
	})
}
