package plans

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseValid(t *testing.T) {
	p, err := Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key      string
		ok       bool
		plan     string
		capacity float64
		rate     float64
		header   string
	}{
		{"client-key-123", true, "pro", 200, 100, "200"},
		{"client-key-456", true, "slow", 5, 0.25, "5"},
		{"spaces are fine", true, "free", 10, 1, "10"},
		{"someone-else", true, "free", 10, 1, "10"},
		// Keys are compared byte for byte: no trimming, no case folding.
		{"CLIENT-KEY-123", true, "free", 10, 1, "10"},
		{"client-key-123 ", true, "free", 10, 1, "10"},
	}
	for _, tt := range tests {
		plan, ok := p.Lookup([]byte(tt.key))
		if ok != tt.ok || plan == nil {
			t.Fatalf("Lookup(%q) ok = %v, plan %v", tt.key, ok, plan)
		}
		if plan.Name != tt.plan || plan.Capacity != tt.capacity || plan.Rate != tt.rate || plan.LimitHeader != tt.header {
			t.Errorf("Lookup(%q) = %+v, want %s {%v %v %q}", tt.key, *plan, tt.plan, tt.capacity, tt.rate, tt.header)
		}
	}
	if p.Default == nil || p.Default.Name != "free" {
		t.Errorf("Default = %+v, want free", p.Default)
	}
	if p.Clients() != 3 || len(p.ByName) != 3 {
		t.Errorf("Clients() = %d, plans = %d; want 3 and 3", p.Clients(), len(p.ByName))
	}
	if p.File != "testdata/valid.yaml" {
		t.Errorf("File = %q", p.File)
	}
}

func TestNoDefaultPlan(t *testing.T) {
	p, err := Load("testdata/anchors.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if plan, ok := p.Lookup([]byte("unknown")); ok || plan != nil {
		t.Errorf("Lookup(unknown) = %v, %v; want nil, false without default_plan", plan, ok)
	}
	plan, ok := p.Lookup([]byte("k1"))
	if !ok || plan.Name != "pro-eu" || plan.Capacity != 200 || plan.Rate != 100 {
		t.Errorf("Lookup(k1) = %+v, %v; want pro-eu 200/100 through the alias", plan, ok)
	}
}

// TestParseInvalid checks the exact message for each invalid fixture: the
// file, the line, the field and the offending value.
func TestParseInvalid(t *testing.T) {
	tests := []struct {
		file string
		want string // with F standing for the fixture's path
	}{
		{"bad-plan-name.yaml", `F:2: plans: plan name must be 1 to 64 characters of A-Z a-z 0-9 . _ -, got 5 characters (not shown: it may be an API key)`},
		{"bad-plan-referenced.yaml", `F:3: plans.free.capacity: must be a whole number from 1 to 1000000000, got 0`},
		{"capacity-fraction.yaml", `F:2: plans.free.capacity: must be a whole number from 1 to 1000000000, got 2.5`},
		{"capacity-huge.yaml", `F:2: plans.free.capacity: must be a whole number from 1 to 1000000000, got 1000000001`},
		{"capacity-string.yaml", `F:2: plans.free.capacity: must be a number, got string "10"`},
		{"capacity-zero.yaml", `F:2: plans.free.capacity: must be a whole number from 1 to 1000000000, got 0`},
		{"client-control-char.yaml", `F:4: clients: the API key on this line is not acceptable: api key contains a control character`},
		{"client-duplicate.yaml", `F:5: clients: an API key is listed twice (first on line 4)`},
		{"client-empty-key.yaml", `F:4: clients: the API key on this line is not acceptable: empty api key`},
		{"client-long-key.yaml", `F:4: clients: the API key on this line is not acceptable: api key longer than 256 bytes`},
		{"client-digest-and-key.yaml", `F:5: clients: this client is listed twice, by API key and by its sha256: digest (first on line 4)`},
		{"client-digest-mixed.yaml", `F:5: clients: a hmac-sha256: digest in a file that lists sha256: digests (line 4); a sidecar computes one kind, list every client the same way`},
		{"client-digest-short.yaml", `F:4: clients: a sha256: digest must be followed by 64 lowercase hex digits, got 6 characters (not shown: it may be an API key)`},
		{"client-digest-upper.yaml", `F:4: clients: a sha256: digest must be followed by 64 lowercase hex digits, got "sha256:8766B9CB08E6040B704F1E3EE1E186EFCCF2635B1D2634D6525333007E6AEAE1"`},
		{"client-digest-not-hex.yaml", `F:4: clients: a sha256: digest must be followed by 64 lowercase hex digits, got 12 characters (not shown: it may be an API key)`},
		{"client-swapped.yaml", `F:4: clients: no plan named by the value on this line, whose key is the plan "free": are the key and the plan swapped? (the value is not shown: it may be an API key)`},
		{"client-unknown-plan.yaml", `F:4: clients: no plan named "gold" (plans: free)`},
		{"comment-only.yaml", `F: empty file: a plans mapping is required`},
		{"default-unknown.yaml", `F:1: default_plan: no plan named "gold" (plans: free)`},
		{"empty-plans.yaml", `F:1: plans: required: at least one plan`},
		{"empty.yaml", `F: empty file: a plans mapping is required`},
		{"hot-one-region.yaml", `F:4: clients.regions: must list 2 to 16 regions, got 1`},
		{"hot-plan-missing.yaml", `F:4: clients.plan: required`},
		{"hot-region-bad-name.yaml", `F:4: clients.regions: a region must be 1 to 64 characters of A-Z a-z 0-9 . _ -, got string "us east"`},
		{"hot-region-duplicate.yaml", `F:4: clients.regions: region "eu" is listed twice`},
		{"hot-regions-missing.yaml", `F:4: clients.regions: required: a list of 2 to 16 region names`},
		{"hot-regions-scalar.yaml", `F:4: clients.regions: must be a list of 2 to 16 region names, got string "eu"`},
		{"hot-unknown-field.yaml", `F:4: clients: unknown field on this line (known: plan, regions)`},
		// The next client's line indented under a hot client is a field of it.
		{"hot-next-client-indented.yaml", `F:7: clients: unknown field on this line (known: plan, regions)`},
		// 2 tokens split over 3 regions: no region's bucket holds one.
		{"hot-plan-smaller-than-regions.yaml", `F:4: clients.regions: plan "tiny" holds 2 tokens, fewer than the 3 regions listed: at equal shares no region's bucket could hold one token, and every request would be refused as one that can never succeed; list at most 2 regions or give the client a plan of at least 3 tokens`},
		{"hot-unknown-plan.yaml", `F:4: clients.plan: no plan named "gold" (plans: pro)`},
		{"clients-string.yaml", `F:3: clients: must be a mapping of API key to plan name, got a string (not shown: it may be an API key)`},
		{"list.yaml", `F:1: top level must be a mapping with plans, clients and default_plan, got a list`},
		{"many-errors.yaml", "F:2: plans.free.capacity: must be a whole number from 1 to 1000000000, got 0\n" +
			"F:2: plans.free.rate: must be a number of tokens per second > 0 and <= 1000000000, got 0\n" +
			"F:3: plans: the plan on this line must be a mapping {capacity: N, rate: R}, got a list\n" +
			"F:4: clients: must be a mapping of API key to plan name, got a list"},
		{"no-plans.yaml", `F:1: plans: required: at least one plan`},
		{"plan-duplicate.yaml", `F:3: plans: "free" is listed twice (first on line 2)`},
		{"plan-scalar.yaml", `F:2: plans: the plan on this line must be a mapping {capacity: N, rate: R}, got a single value (not shown: it may be an API key)`},
		// A client's line put under plans: is reported by its line only.
		{"client-line-under-plans.yaml", `F:4: plans: the plan on this line must be a mapping {capacity: N, rate: R}, got a string (not shown: it may be an API key)`},
		{"hot-client-under-plans.yaml", "F:4: plans: unknown field on this line (known: capacity, rate)\n" +
			"F:4: plans: unknown field on this line (known: capacity, rate)"},
		{"client-key-under-plans.yaml", `F:4: plans: plan name must be 1 to 64 characters of A-Z a-z 0-9 . _ -, got 12 characters (not shown: it may be an API key)`},
		{"rate-inf.yaml", `F:2: plans.free.rate: must be a finite number, got .inf`},
		{"rate-missing.yaml", `F:2: plans.free.rate: required`},
		{"rate-nan.yaml", `F:2: plans.free.rate: must be a finite number, got .nan`},
		{"rate-negative.yaml", `F:2: plans.free.rate: must be a number of tokens per second > 0 and <= 1000000000, got -1`},
		{"rate-human-huge.yaml", `F:2: plans.free.rate: must be > 0 and at most 1000000000 tokens per second, got "2G/s" (2e+09/s)`},
		{"rate-human-refill.yaml", `F:2: plans.free.rate: refilling 1000000 tokens at "1/day" takes 86400000000 s, more than the 31536000 s (365 days) allowed; raise the rate`},
		{"rate-human-zero.yaml", `F:2: plans.free.rate: must be > 0 and at most 1000000000 tokens per second, got "0/min" (0/s)`},
		{"rate-quoted-number.yaml", `F:2: plans.free.rate: must be a number of tokens per second or a rate such as "100/s", "6000/min", "2.5k/h", "1M/day" (k, M, G; s, min, h, day), got "10"`},
		{"rate-unit-unknown.yaml", `F:2: plans.free.rate: must be a number of tokens per second or a rate such as "100/s", "6000/min", "2.5k/h", "1M/day" (k, M, G; s, min, h, day), got "10/week"`},
		{"refill-absurd.yaml", `F:2: plans.free.rate: refilling 1 tokens at 1e-300/s takes 1e+300 s, more than the 31536000 s (365 days) allowed; raise the rate`},
		{"refill-too-slow.yaml", `F:2: plans.free.rate: refilling 100 tokens at 0.000001/s takes 100000000 s, more than the 31536000 s (365 days) allowed; raise the rate`},
		{"syntax.yaml", `F: yaml: line 1: did not find expected ',' or '}'`},
		// Saved as Latin-1: the line and where on it, not the bytes (a key).
		{"not-utf8.yaml", `F:4: this line is not UTF-8 (its byte 14 is not a UTF-8 sequence); a plans file must be UTF-8`},
		{"two-documents.yaml", `F:3: more than one YAML document; put everything in one`},
		{"unknown-plan-field.yaml", `F:2: plans: unknown field on this line (known: capacity, rate)`},
		{"unknown-top.yaml", `F:3: unknown top-level field on this line (known: default_plan, plans, clients)`},
		// A client's line appended without its indentation.
		{"client-line-top-level.yaml", `F:5: unknown top-level field on this line (known: default_plan, plans, clients)`},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.file] = true
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "invalid", tt.file)
			p, err := Load(path)
			if err == nil {
				t.Fatalf("Load(%s) = %+v, want an error", path, p)
			}
			// "F:" at the start of each message stands for the path.
			want := strings.ReplaceAll(tt.want, "F:", path+":")
			if got := err.Error(); got != want {
				t.Errorf("error:\n got %s\nwant %s", got, want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("error %T does not unwrap to *FieldError", err)
			}
			// Secrets from the clients section never appear in errors.
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error quotes an API key: %s", err)
			}
		})
	}
	// Every fixture is in the table, so none is silently untested.
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("fixture %s has no expected message in the table", f)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("Load(missing) = %v, want a not-exist error naming the file", err)
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, make([]byte, MaxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	want := path + ": file larger than 16777216 bytes"
	if err == nil || err.Error() != want {
		t.Fatalf("Load(big) = %v, want %q", err, want)
	}
}

func TestHotClients(t *testing.T) {
	p, err := Parse("hot.yaml", []byte(`
plans:
  pro: {capacity: 100, rate: 50}
clients:
  "k-plain": pro
  "k-hot": {plan: pro, regions: [eu, us, ap]}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key     string
		regions []string // nil: not hot
	}{
		{"k-plain", nil},
		{"k-hot", []string{"eu", "us", "ap"}},
		{"k-unknown", nil},
	}
	for _, tt := range tests {
		h := p.HotClient([]byte(tt.key))
		switch {
		case tt.regions == nil && h != nil:
			t.Errorf("HotClient(%q) = %v, want nil", tt.key, h.Regions)
		case tt.regions != nil && (h == nil || strings.Join(h.Regions, ",") != strings.Join(tt.regions, ",")):
			t.Errorf("HotClient(%q) = %v, want regions %v", tt.key, h, tt.regions)
		}
	}
	if plan, ok := p.Lookup([]byte("k-hot")); !ok || plan.Name != "pro" {
		t.Errorf("Lookup(k-hot) = %v, %v; want pro", plan, ok)
	}
	if p.HotClients() != 1 || p.Clients() != 2 {
		t.Errorf("HotClients() = %d, Clients() = %d; want 1 and 2", p.HotClients(), p.Clients())
	}
}

// A hot client's plan must hold a token for each of its regions: at equal
// shares each region's bucket holds capacity/k, and below one token every
// check would be answered that it can never succeed. k tokens are enough.
func TestHotClientPlanHoldsATokenPerRegion(t *testing.T) {
	const file = `plans:
  p: {capacity: %d, rate: 1000}
clients:
  "k-hot": {plan: p, regions: [eu, us, ap]}
`
	if _, err := Parse("F", []byte(fmt.Sprintf(file, 3))); err != nil {
		t.Errorf("3 tokens over 3 regions: %v, want accepted", err)
	}
	_, err := Parse("F", []byte(fmt.Sprintf(file, 2)))
	if err == nil || !strings.Contains(err.Error(), `F:4: clients.regions: plan "p" holds 2 tokens, fewer than the 3 regions listed`) {
		t.Errorf("2 tokens over 3 regions: %v, want refused on line 4", err)
	}
}
