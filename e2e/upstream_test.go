package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

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
	path := shortIdleConfig(t)
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
