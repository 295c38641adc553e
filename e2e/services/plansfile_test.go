package services

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// TestPlansFromFileMatchesAsTheSidecar: the services find a client's plan
// in the sidecar's plans file exactly where the sidecar does, clients listed
// by key, by sha256: digest and, with the sidecar's -key-salt, by
// hmac-sha256: digest; and refuse a file whose digests their salt cannot
// match, as the sidecar does, rather than fall every listed client back to
// the default plan (which would make a pro client's safety limit the free
// plan's).
func TestPlansFromFileMatchesAsTheSidecar(t *testing.T) {
	salt := []byte("pepper")
	free, pro := bucket.Limit{Capacity: 10, Rate: 2}, bucket.Limit{Capacity: 200, Rate: 100}
	file := func(t *testing.T, client string) string {
		path := filepath.Join(t.TempDir(), "plans.yaml")
		body := "default_plan: free\nplans:\n  free: {capacity: 10, rate: 2}\n  pro: {capacity: 200, rate: 100}\n" +
			"clients:\n  \"" + client + "\": pro\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name, listed string
		salt         []byte
		refused      string
	}{
		{"by key", "pro-key", nil, ""},
		{"by key, salted", "pro-key", salt, ""},
		{"by sha256", keys.New(nil).Digest([]byte("pro-key")), nil, ""},
		{"by hmac-sha256", keys.New(salt).Digest([]byte("pro-key")), salt, ""},
		{"sha256 with a salt", keys.New(nil).Digest([]byte("pro-key")), salt, "clients are listed by sha256: digests but -key-salt is set"},
		{"hmac-sha256 without a salt", keys.New(salt).Digest([]byte("pro-key")), nil, "clients are listed by hmac-sha256: digests but no -key-salt is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plans, err := PlansFromFile(file(t, tc.listed), tc.salt)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("PlansFromFile = %v, want an error saying %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for client, want := range map[string]bucket.Limit{"pro-key": pro, "other-key": free} {
				if got, ok := plans(client); !ok || got != want {
					t.Errorf("plan of %s = %+v, %t; want %+v", client, got, ok, want)
				}
			}
		})
	}
}
