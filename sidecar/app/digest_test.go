package app

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// digestPlans lists its clients by the digests d computes, so no API key is
// in the file, and states rates in human units.
func digestPlans(d *keys.Digester) string {
	return `
plans:
  pro:  {capacity: 200, rate: "6000/min"}
  tiny: {capacity: 2, rate: "1/day"}
clients:
  "` + d.Digest([]byte("client-key-123")) + `": pro
  "` + d.Digest([]byte("client-tiny")) + `": tiny
`
}

// TestDigestOnlyPlans: a plans file with digests only, through /v1/check on
// real Redis, without and with a salt; a file of the other kind is refused.
func TestDigestOnlyPlans(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	for _, salt := range []string{"", "pepper"} {
		t.Run("salt="+salt, func(t *testing.T) {
			d := keys.New([]byte(salt))
			// At debug level the sidecar logs every check.
			s := startSidecarWith(t, srv.URL(), digestPlans(d), decidesAnyway, slog.LevelDebug, func(c *Config) { c.KeySalt = []byte(salt) })
			r := s.check(t, "client-key-123")
			if r.status != 200 || r.h("x-ratelimit-plan") != "pro" || r.h("ratelimit-limit") != "200" {
				t.Fatalf("client-key-123: %d plan %q limit %q", r.status, r.h("x-ratelimit-plan"), r.h("ratelimit-limit"))
			}
			for i, want := range []int{200, 200, 429} {
				if r := s.check(t, "client-tiny"); r.status != want || r.h("x-ratelimit-plan") != "tiny" {
					t.Fatalf("client-tiny check %d: %d plan %q, want %d tiny", i+1, r.status, r.h("x-ratelimit-plan"), want)
				}
			}
			// 1/day: the wait for one token is close to a day.
			if r := s.check(t, "client-tiny"); r.status != 429 || num(t, r, "retry-after") < 86000 {
				t.Fatalf("client-tiny retry-after %q, want about 86400", r.h("retry-after"))
			}
			// No default plan: an unlisted key is refused.
			if r := s.check(t, "someone-else"); r.status != 403 {
				t.Fatalf("unlisted key: %d, want 403", r.status)
			}
			// Nothing the sidecar wrote, in Redis or in its log, holds a
			// key it was sent.
			written, err := srv.Client(t).Keys(t.Context(), "*").Result()
			if err != nil || len(written) == 0 {
				t.Fatalf("KEYS *: %q, %v", written, err)
			}
			// The log has the checks in it (named by their digests), so
			// that a key missing from it is one the log left out.
			_, digits, _ := strings.Cut(d.Digest([]byte("client-tiny")), ":")
			if id := keys.LogID("rl:{" + digits + "}"); id == "" || !strings.Contains(s.logs.String(), "client="+id) {
				t.Fatalf("the debug log has no decision for client-tiny (client=%s):\n%s", id, s.logs)
			}
			for _, key := range []string{"client-key-123", "client-tiny", "someone-else"} {
				for _, k := range written {
					if strings.Contains(k, key) {
						t.Errorf("Redis key %q holds the API key %q", k, key)
					}
				}
				if strings.Contains(s.logs.String(), key) {
					t.Errorf("the log holds the API key %q", key)
				}
			}
			// The bucket is named by the same digits as the plans file.
			if n, err := srv.Client(t).Exists(t.Context(), "rl:{"+digits+"}").Result(); err != nil || n != 1 {
				t.Fatalf("bucket rl:{%s}: exists %d, %v", digits, n, err)
			}
		})
	}

	// A file of sha256: digests read by a salted sidecar matches nobody:
	// refused at start, naming the problem.
	cfg := Config{Listen: "127.0.0.1:0", Redis: mustSpec(t, srv.URL()), KeySalt: []byte("pepper")}
	cfg.PlansPath = writePlans(t, digestPlans(keys.New(nil)))
	if a, err := Start(cfg, slog.New(slog.DiscardHandler)); err == nil {
		a.Shutdown(t.Context())
		t.Fatal("a salted sidecar started on sha256: digests")
	} else if !strings.Contains(err.Error(), "clients: clients are listed by sha256: digests but -key-salt is set") {
		t.Fatalf("Start: %v", err)
	}
}

func writePlans(t testing.TB, plansYAML string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(path, []byte(plansYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
