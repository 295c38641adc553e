package app

import (
	"log/slog"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/redisconn"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// TestAdminListener: the admin listener answers /healthz, /readyz and
// /metrics (Redis up, then down), never /v1/check; the check listener keeps
// serving all of them.
func TestAdminListener(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	start := time.Now()
	s := startSidecarWith(t, srv.URL(), contractPlans, decidesAnyway, slog.LevelInfo, func(c *Config) {
		c.AdminListen = "127.0.0.1:0"
	})
	admin := s.AdminAddr()
	if admin == "" || admin == s.Addr() {
		t.Fatalf("AdminAddr() = %q, check listener %q", admin, s.Addr())
	}

	if r := s.doAt(t, admin, "GET", "/healthz"); r.status != 200 || r.body != "ok\n" {
		t.Errorf("admin /healthz: %d %q", r.status, r.body)
	}
	testkit.Poll(t, 30*time.Second, "admin /readyz to report ready", func() bool { return s.doAt(t, admin, "GET", "/readyz").status == 200 })
	if r := s.check(t, "client-key-123"); r.status != 200 {
		t.Fatalf("check: %d %q", r.status, r.body)
	}
	if r := s.doAt(t, admin, "POST", "/v1/check", "x-api-key", "client-key-123"); r.status != 404 {
		t.Errorf("admin POST /v1/check: %d %q, want 404", r.status, r.body)
	}
	if r := s.doAt(t, admin, "POST", "/v1/warm"); r.status != 404 {
		t.Errorf("admin POST /v1/warm: %d %q, want 404", r.status, r.body)
	}
	if r := s.doAt(t, admin, "POST", "/readyz"); r.status != 405 || r.h("allow") != "GET, HEAD" {
		t.Errorf("admin POST /readyz: %d allow %q, want 405 GET, HEAD", r.status, r.h("allow"))
	}

	m := s.doAt(t, admin, "GET", "/metrics")
	if m.status != 200 || !strings.HasPrefix(m.h("content-type"), "text/plain; version=0.0.4") {
		t.Fatalf("admin /metrics: %d %q", m.status, m.h("content-type"))
	}
	for _, want := range []string{
		`sidecar_decisions_total{result="allowed"} 1` + "\n",
		`sidecar_build_info{version=` + strconv.Quote(stats.BuildVersion()) + `,goversion=` + strconv.Quote(runtime.Version()) + `} 1` + "\n",
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("admin /metrics lacks %q", want)
		}
	}
	loaded := regexp.MustCompile(`(?m)^sidecar_plans_last_reload_success_timestamp_seconds (\S+)$`).FindStringSubmatch(m.body)
	if loaded == nil {
		t.Fatalf("admin /metrics lacks sidecar_plans_last_reload_success_timestamp_seconds")
	}
	if at, err := strconv.ParseFloat(loaded[1], 64); err != nil || at < float64(start.Unix()) || at > float64(time.Now().Unix()+1) {
		t.Errorf("last reload %s, want the start time (%d)", loaded[1], start.Unix())
	}

	// The check listener still serves health, for configurations that
	// probe it there.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := s.do(t, "GET", path); r.status != 200 {
			t.Errorf("check listener %s: %d", path, r.status)
		}
	}

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	var down reply
	testkit.Poll(t, 30*time.Second, "admin /readyz to report Redis down", func() bool {
		down = s.doAt(t, admin, "GET", "/readyz")
		return down.status == 503
	})
	if !strings.HasPrefix(down.body, "not ready: redis: ") {
		t.Errorf("admin /readyz with Redis down: %q", down.body)
	}
	if r := s.doAt(t, admin, "GET", "/healthz"); r.status != 200 {
		t.Errorf("admin /healthz with Redis down: %d, want 200", r.status)
	}
	if r := s.doAt(t, admin, "GET", "/metrics"); r.status != 200 {
		t.Errorf("admin /metrics with Redis down: %d, want 200", r.status)
	}
}

// TestAdminListenBusy: an admin address that cannot be bound fails Start,
// naming the flag and the address.
func TestAdminListenBusy(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	s := startSidecar(t, srv.URL(), contractPlans, 0)
	cfg := Config{Listen: "127.0.0.1:0", AdminListen: s.Addr(), Redis: mustSpec(t, srv.URL()), PlansPath: s.plansPath}
	a, err := Start(cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		a.Shutdown(t.Context())
		t.Fatal("Start with a busy admin address succeeded")
	}
	if want := "-admin-listen (SIDECAR_ADMIN_LISTEN): listen tcp " + s.Addr() + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Start: %v, want it to start with %q", err, want)
	}
}

func mustSpec(t testing.TB, url string) *redisconn.Spec {
	t.Helper()
	spec, err := redisconn.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}
