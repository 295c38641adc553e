package plans

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/sidecar/keys"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"100/s", 100},
		{"6000/min", 100},
		{"1M/day", 1e6 / 86400},
		{"2.5k/h", 2500.0 / 3600},
		{"1G/s", 1e9},
		{"0.5/s", 0.5},
		{"3/h", 3.0 / 3600},
	}
	for _, tt := range tests {
		if got, err := ParseRate(tt.in); err != nil || got != tt.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "100", "100/sec", "100 /s", "1m/s", "-1/s", "1e3/s", ".5/s", "5./s", "1K/s", "1/S", "100/s ", "1/0s"} {
		if got, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) = %v, want an error", bad, got)
		}
	}
}

func TestDigestClients(t *testing.T) {
	p, err := Load("testdata/digests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.DigestKind != keys.KindSHA256 || p.Clients() != 3 || p.HotClients() != 1 {
		t.Fatalf("kind %q, %d clients, %d hot", p.DigestKind, p.Clients(), p.HotClients())
	}
	d := keys.New(nil)
	tests := []struct {
		key     string
		plan    string
		rate    float64
		regions string
	}{
		{"client-key-123", "pro", 100, ""},
		{"client-key-456", "daily", 1e6 / 86400, ""},
		{"hot-client", "hourly", 2500.0 / 3600, "eu,us"},
		{"someone-else", "free", 1, ""},
	}
	for _, tt := range tests {
		plan, hot, ok := p.LookupSum([]byte(tt.key), d.Sum([]byte(tt.key)))
		if !ok || plan.Name != tt.plan || plan.Rate != tt.rate {
			t.Errorf("LookupSum(%q) = %+v, %v; want %s at %v/s", tt.key, plan, ok, tt.plan, tt.rate)
			continue
		}
		if got := ""; hot != nil {
			got = strings.Join(hot.Regions, ",")
			if got != tt.regions {
				t.Errorf("LookupSum(%q) regions %q, want %q", tt.key, got, tt.regions)
			}
		} else if tt.regions != "" {
			t.Errorf("LookupSum(%q) is not hot, want regions %q", tt.key, tt.regions)
		}
		// Lookup, without a Digester, finds sha256: digests too.
		if plan, ok := p.Lookup([]byte(tt.key)); !ok || plan.Name != tt.plan {
			t.Errorf("Lookup(%q) = %+v, %v; want %s", tt.key, plan, ok, tt.plan)
		}
	}
	// The digest of another salt finds nobody listed.
	salted := keys.New([]byte("pepper"))
	if plan, _, _ := p.LookupSum([]byte("client-key-123"), salted.Sum([]byte("client-key-123"))); plan.Name != "free" {
		t.Errorf("salted digest found plan %s, want the default", plan.Name)
	}

	if err := p.CheckDigests(keys.KindSHA256); err != nil {
		t.Errorf("CheckDigests(sha256): %v", err)
	}
	want := `testdata/digests.yaml: clients: clients are listed by sha256: digests but -key-salt is set, so the sidecar computes hmac-sha256: digests; list them as "sidecar digest" prints them with this sidecar's salt`
	if err := p.CheckDigests(keys.KindHMACSHA256); err == nil || err.Error() != want {
		t.Errorf("CheckDigests(hmac-sha256) = %v\nwant %s", err, want)
	}
}

func TestHMACDigestClients(t *testing.T) {
	salted := keys.New([]byte("pepper"))
	p, err := Parse("salted.yaml", []byte("plans:\n  pro: {capacity: 5, rate: \"10/s\"}\nclients:\n  \""+salted.Digest([]byte("k1"))+"\": pro\n"))
	if err != nil {
		t.Fatal(err)
	}
	if plan, _, ok := p.LookupSum([]byte("k1"), salted.Sum([]byte("k1"))); !ok || plan.Name != "pro" {
		t.Errorf("LookupSum(k1) = %v, %v; want pro", plan, ok)
	}
	// Without the salt nobody is found, and there is no default plan.
	if _, ok := p.Lookup([]byte("k1")); ok {
		t.Errorf("Lookup(k1) without the salt found a plan")
	}
	if _, _, ok := p.LookupSum([]byte("k1"), sha256.Sum256([]byte("k1"))); ok {
		t.Errorf("LookupSum(k1) with the unsalted digest found a plan")
	}
	want := `salted.yaml: clients: clients are listed by hmac-sha256: digests but no -key-salt is set, so the sidecar computes sha256: digests; list them as "sidecar digest" prints them with this sidecar's salt`
	if err := p.CheckDigests(keys.KindSHA256); err == nil || err.Error() != want {
		t.Errorf("CheckDigests(sha256) = %v\nwant %s", err, want)
	}
}
