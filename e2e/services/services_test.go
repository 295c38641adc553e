package services

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/shadow"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// frozen is a clock that does not move: no bucket refills, so counts are
// exact.
func frozen() time.Time { return time.Unix(1_700_000_000, 0) }

func plansOf(m map[string]bucket.Limit) func(string) (bucket.Limit, bool) {
	return func(c string) (bucket.Limit, bool) { l, ok := m[c]; return l, ok }
}

func startFleet(t *testing.T, names []string, c Config) *Fleet {
	t.Helper()
	f, err := StartFleet(names, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func get(t *testing.T, addr, path, key string, hdr map[string]string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// TestIncidentArithmetic is the incident in miniature: a client spread over
// 3 services x 3 replicas, each replica with its own bucket of the client's
// plan, is admitted 9 times its burst.
func TestIncidentArithmetic(t *testing.T) {
	plan := bucket.Limit{Capacity: 5, Rate: 1}
	f := startFleet(t, []string{"orders", "billing", "accounts"}, Config{
		Limiter: LimiterEnforce, Plans: plansOf(map[string]bucket.Limit{"mallory": plan}), Clock: frozen,
	})
	admitted := 0
	for i := 0; i < 90; i++ {
		s := f.Services[i%3]
		if code, _ := get(t, s.Addr, "/x", "mallory", nil); code == http.StatusOK {
			admitted++
		}
	}
	// Every replica sees 10 requests and admits its burst of 5.
	if admitted != 45 || f.Client("mallory").OK != 45 || f.Client("mallory").LimiterDenied != 45 {
		t.Fatalf("admitted %d, fleet counts %+v; want 45 = 9 x 5", admitted, f.Client("mallory"))
	}
	for _, s := range f.Services {
		for i, r := range s.Stats().Replicas {
			if c := r.Clients["mallory"]; c.Received != 10 || c.OK != 5 {
				t.Errorf("%s replica %d: %+v, want 10 received and 5 admitted", s.Name, i, c)
			}
		}
	}
}

func TestRoundRobinAndOff(t *testing.T) {
	f := startFleet(t, []string{"orders"}, Config{Replicas: 4})
	seen := map[string]int{}
	for i := 0; i < 40; i++ {
		code, h := get(t, f.Services[0].Addr, "/orders/1", "k", nil)
		if code != http.StatusOK {
			t.Fatalf("status %d with no limiter", code)
		}
		seen[h.Get("x-replica")]++
	}
	for i := 0; i < 4; i++ {
		if n := seen["orders-"+string(rune('0'+i))]; n != 10 {
			t.Fatalf("replicas saw %v, want 10 each", seen)
		}
	}
}

func TestSafetyLimitPerReplica(t *testing.T) {
	plan := bucket.Limit{Capacity: 1, Rate: 1}
	f := startFleet(t, []string{"orders"}, Config{
		Replicas: 3, SafetyFactor: 10, Plans: plansOf(map[string]bucket.Limit{"noisy": plan}), Clock: frozen,
	})
	ok, denied := 0, 0
	for i := 0; i < 60; i++ {
		code, h := get(t, f.Services[0].Addr, "/o", "noisy", nil)
		switch code {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			denied++
			if h.Get("x-safety-limit") != "10x" {
				t.Fatalf("429 without the safety header: %v", h)
			}
		}
	}
	// 10x a burst of 1 on each of 3 replicas.
	if ok != 30 || denied != 30 || f.Client("noisy").SafetyDenied != 30 {
		t.Fatalf("ok %d denied %d, counts %+v; want 30 and 30", ok, denied, f.Client("noisy"))
	}
}

// The plain counting service (one replica, no limiter): every request is
// answered 200 and counted per client, with the shadow decision it
// carried, bearer or header key alike.
func TestCountingService(t *testing.T) {
	s, err := Start("127.0.0.1:0", Config{Name: "orders", Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range []string{"allow", "deny", "deny", "unknown", "", "bogus"} {
		hdr := map[string]string{}
		if e != "" {
			hdr[limiter.ShadowHeader] = e
		}
		if code, _ := get(t, s.Addr, "/orders/1", "k", hdr); code != http.StatusOK {
			t.Fatalf("status %d, want 200", code)
		}
	}
	get(t, s.Addr, "/orders/2", "", map[string]string{"authorization": "Bearer k"})
	get(t, s.Addr, "/orders/3", "", nil)
	// Headers as large as Envoy lets through by default (60 KiB in all)
	// reach the replica.
	if code, _ := get(t, s.Addr, "/orders/4", "k", map[string]string{"cookie": strings.Repeat("c", 59<<10)}); code != http.StatusOK {
		t.Fatalf("status %d for 59 KiB of headers, want 200", code)
	}
	c := s.Stats().Client("k")
	want := ClientStats{Received: 8, OK: 8, ShadowAllow: 1, ShadowDeny: 2, ShadowUnknown: 1, ShadowInvalid: 1}
	c.First, c.Last = time.Time{}, time.Time{}
	if c != want {
		t.Fatalf("client k: %+v, want %+v", c, want)
	}
	for e, n := range map[shadow.Edge]int64{shadow.EdgeNone: 0, shadow.EdgeAllow: 1, shadow.EdgeDeny: 2, shadow.EdgeUnknown: 1, shadow.EdgeInvalid: 1} {
		if got := c.Shadowed(e); got != n {
			t.Errorf("Shadowed(%v) = %d, want %d", e, got, n)
		}
	}
	if got := s.Stats().Client("").Received; got != 1 {
		t.Errorf("requests without a key: %d, want 1", got)
	}
	if got := s.Stats().Total().Received; got != 9 {
		t.Errorf("total received %d, want 9", got)
	}
}

func TestObserveComparesWithTheEdge(t *testing.T) {
	plan := bucket.Limit{Capacity: 2, Rate: 1}
	f := startFleet(t, []string{"orders"}, Config{
		Replicas: 1, Limiter: LimiterObserve, Plans: plansOf(map[string]bucket.Limit{"k": plan}), Clock: frozen,
	})
	addr := f.Services[0].Addr
	// The replica allows the first two (its burst) and would deny the rest.
	edge := []string{"allow", "deny", "deny", "allow", "unknown", "", "bogus"}
	for _, e := range edge {
		hdr := map[string]string{}
		if e != "" {
			hdr[limiter.ShadowHeader] = e
		}
		if code, _ := get(t, addr, "/o", "k", hdr); code != http.StatusOK {
			t.Fatalf("observe mode rejected a request: %d", code)
		}
	}
	want := shadow.Counts{Agree: 2, EdgeDenied: 1, EdgeAllowed: 1, Unknown: 1, Invalid: 1}
	if got := f.Shadow().Clients["k"]; got != want {
		t.Fatalf("shadow counts %+v, want %+v", got, want)
	}

	// The same report over HTTP.
	resp, err := http.Get("http://" + addr + "/_shadow")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Total shadow.Counts `json:"total"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || doc.Total != want {
		t.Fatalf("/_shadow total %+v (%v), want %+v", doc.Total, err, want)
	}

	// And as metrics.
	mresp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	body, _ := io.ReadAll(mresp.Body)
	for _, line := range []string{
		`service_shadow_comparisons_total{service="orders",result="agree"} 2`,
		`service_shadow_comparisons_total{service="orders",result="edge_denied_service_allowed"} 1`,
		`service_shadow_comparisons_total{service="orders",result="edge_allowed_service_denied"} 1`,
		`service_shadow_comparisons_total{service="orders",result="edge_unknown"} 1`,
		`service_requests_total{service="orders",outcome="ok"} 7`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", line, body)
		}
	}
}

func TestPoolShedsOverCapacity(t *testing.T) {
	f := startFleet(t, []string{"orders"}, Config{Replicas: 1, Workers: 1, Queue: 0, ServiceTime: time.Hour})
	addr := f.Services[0].Addr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var firstDone atomic.Bool
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/slow", nil)
		req.Header.Set("x-api-key", "a")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		firstDone.Store(true)
	}()
	testkit.Poll(t, 10*time.Second, "the first request to take the worker", func() bool {
		if p := f.Services[0].Stats().Replicas[0].Pool; p != nil && p.InFlight == 1 {
			return true
		}
		if firstDone.Load() {
			t.Fatal("the first request ended without taking the worker")
		}
		return false
	})
	code, h := get(t, addr, "/o", "b", nil)
	if code != http.StatusServiceUnavailable || h.Get("retry-after") != "1" {
		t.Fatalf("over capacity: %d, want 503 with retry-after", code)
	}
	if got := f.Client("b"); got.Shed != 1 || got.OK != 0 {
		t.Fatalf("counts %+v", got)
	}
	cancel() // the client leaves; the worker is released
}

func TestStatsEndpoint(t *testing.T) {
	f := startFleet(t, []string{"orders"}, Config{Replicas: 2})
	addr := f.Services[0].Addr
	for i := 0; i < 3; i++ {
		get(t, addr, "/o", "k", nil)
	}
	resp, err := http.Get("http://" + addr + "/_stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	c := st.Client("k")
	if st.Service != "orders" || len(st.Replicas) != 2 || c.Received != 3 || c.OK != 3 || c.Window() < 0 || c.First.IsZero() {
		t.Fatalf("stats %+v, client %+v", st, c)
	}
}

func TestConfigErrors(t *testing.T) {
	p := plansOf(nil)
	tests := []struct {
		c    Config
		want string
	}{
		{Config{}, `service "": name: required`},
		{Config{Name: "a", Replicas: -1}, `service "a": replicas: must be >= 1, got -1`},
		{Config{Name: "a", Limiter: LimiterEnforce}, `service "a": plans: required with limiter enforce and safety factor 0`},
		{Config{Name: "a", SafetyFactor: 10}, `service "a": plans: required with limiter off and safety factor 10`},
		{Config{Name: "a", Plans: p, SafetyFactor: -1}, `service "a": safety factor: must be >= 0, got -1`},
		{Config{Name: "a", Workers: -2}, `service "a": workers: must be >= 0, got -2`},
		{Config{Name: "a", Workers: 1, Queue: -1}, `service "a": queue: must be >= 0, got -1`},
		{Config{Name: "a", Limiter: Mode(7)}, `service "a": limiter: want off, enforce or observe, got Mode(7)`},
	}
	for _, tt := range tests {
		s, err := Start("127.0.0.1:0", tt.c)
		if err == nil {
			s.Close()
		}
		if err == nil || err.Error() != tt.want {
			t.Errorf("Start(%+v): %v, want %q", tt.c, err, tt.want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"off", "enforce", "observe"} {
		m, err := ParseMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("on"); err == nil || !strings.Contains(err.Error(), `got "on"`) {
		t.Errorf("ParseMode(on): %v", err)
	}
}
