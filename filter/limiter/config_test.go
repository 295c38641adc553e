package limiter_test

import (
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

func TestParseRejectsEveryInvalidFixture(t *testing.T) {
	for _, c := range filtertest.InvalidConfigs {
		t.Run(c.File, func(t *testing.T) {
			cfg, err := limiter.Parse([]byte(filtertest.InvalidConfig(c.File)))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			if err.Error() != c.Error {
				t.Errorf("error\n got %s\nwant %s", err, c.Error)
			}
		})
	}
}

func TestParseDefaults(t *testing.T) {
	for _, f := range []string{"empty.json", "whitespace.json", "empty-object.json"} {
		cfg, err := limiter.Parse([]byte(filtertest.ValidConfig(f)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		want := limiter.DefaultConfig()
		if !equalConfig(cfg, want) {
			t.Errorf("%s: got %+v, want the defaults %+v", f, cfg, want)
		}
	}
	d := limiter.DefaultConfig()
	if d.SidecarCluster != "ratelimit_sidecar" || d.SidecarAuthority != "ratelimit-sidecar" || d.TimeoutMs != 5 ||
		d.APIKeyHeader != "x-api-key" || d.Mode != limiter.ModeEnforce || !d.RejectMissingKey ||
		len(d.Costs) != 0 || len(d.CanaryClients) != 0 || d.Region != "" ||
		d.Breaker != (limiter.BreakerConfig{Failures: 20, MinOpenMs: 100, MaxOpenMs: 5000}) || d.OnFailure != limiter.FailOpen ||
		d.WarmConnections != 16 {
		t.Errorf("defaults differ from the documented ones: %+v", d)
	}
}

func TestParseFull(t *testing.T) {
	cfg, err := limiter.Parse([]byte(filtertest.ValidConfig("full.json")))
	if err != nil {
		t.Fatal(err)
	}
	want := &limiter.Config{
		SidecarCluster:   "edge_ratelimit",
		SidecarAuthority: "ratelimit.internal:8080",
		TimeoutMs:        20,
		APIKeyHeader:     "x-client-key",
		Mode:             limiter.ModeEnforce,
		CanaryClients:    map[string]struct{}{"client-a": {}, "client-b": {}},
		RejectMissingKey: false,
		Costs: []limiter.CostRule{
			{Method: "POST", PathPrefix: "/v1/upload", Cost: 10},
			{PathPrefix: "/v1/search", Cost: 2},
			{Method: "DELETE", Cost: 3},
		},
		Region:          "eu-west-1",
		Breaker:         limiter.BreakerConfig{Failures: 3, MinOpenMs: 50, MaxOpenMs: 2000},
		OnFailure:       limiter.FailLocal,
		WarmConnections: 4,
	}
	if !equalConfig(cfg, want) {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
	if got := cfg.Summary(); got != "mode=enforce sidecar_cluster=edge_ratelimit sidecar_authority=ratelimit.internal:8080 "+
		"timeout_ms=20 api_key_header=x-client-key on_missing_key=allow canary_clients=2 costs=3 region=eu-west-1 "+
		"breaker_failures=3 breaker_open_ms=50-2000 warm_connections=4 on_failure=local" {
		t.Errorf("summary %q", got)
	}
	esc, err := limiter.Parse([]byte(filtertest.ValidConfig("escapes.json")))
	if err != nil || esc.Region != "eu-west" {
		t.Errorf("escapes.json: region %q, err %v", esc.Region, err)
	}
}

// A configuration over the bound is refused naming the field that makes
// it so: a canary list past the 1 MiB the bound holds (50,000 keys, the
// noisiest 5% of a million clients), and the refusal says that the list is
// what to shorten, without quoting a key.
func TestParseTooLarge(t *testing.T) {
	size := func(data []byte) string {
		return "configuration: must be at most " + strconv.Itoa(limiter.MaxConfigBytes) + " bytes, got " + strconv.Itoa(len(data))
	}
	keys := filtertest.CanaryKeys(50000, 22, 0)
	canary := []byte(filtertest.CanaryConfig(keys))
	region := []byte(`{"region": "` + strings.Repeat(" ", limiter.MaxConfigBytes) + `"}`)
	unknown := []byte(`{"mode": "shadow", "notes": [` + strings.Repeat(`1, `, limiter.MaxConfigBytes/3) + `1]}`)
	// A field is its name and its value: one whose name holds the text
	// is named, as far as a quoted value is shown, not the field of the
	// longest value (here mode's 3 bytes).
	name := []byte(`{"mode": "off", "` + strings.Repeat("n", limiter.MaxConfigBytes) + `": 1}`)
	notJSON := canary[:len(canary)-len(`]}`)] // the list never closed
	// Past 16 times the bound the text is not read at all.
	huge := []byte(`{"region": "` + strings.Repeat(" ", 16*limiter.MaxConfigBytes) + `"}`)
	for _, tt := range []struct {
		name string
		data []byte
		want string
	}{
		{"canary_clients", canary, size(canary) + ", most of it canary_clients (50000 entries)"},
		{"a string", region, size(region) + ", most of it region (a string of " + strconv.Itoa(limiter.MaxConfigBytes) + " bytes)"},
		{"an unknown field", unknown, size(unknown) + `, most of it "notes" (` + strconv.Itoa(limiter.MaxConfigBytes/3+1) + " entries)"},
		{"a name", name, size(name) + ", most of it " + strconv.Quote(strings.Repeat("n", 64)) + "..."},
		{"not JSON", notJSON, size(notJSON)},
		{"past what is read", huge, size(huge)},
	} {
		_, err := limiter.Parse(tt.data)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: got %v, want %s", tt.name, err, tt.want)
		}
		for _, k := range keys {
			if err != nil && strings.Contains(err.Error(), k) {
				t.Errorf("%s: the error quotes a canary key: %v", tt.name, err)
				break
			}
		}
	}
}

// A configuration refused for its size is read for its error without a
// copy of its strings: a VM keeps whatever reading it allocates (a wasm
// VM's memory never shrinks), and the text, up to 16 MiB, may be escapes
// throughout, in a value or in a name. Decoding them took 100 MB of
// allocations for 16 MiB of "\n", and filter.wasm's memory grew 45 MiB past
// the host's copy of the text; the error is a few hundred bytes.
func TestParseTooLargeDecodesNoString(t *testing.T) {
	n := 8*limiter.MaxConfigBytes - 16 // each escape is 2 bytes: under 16 MiB
	escapes := strings.Repeat(`\n`, n)
	for _, tt := range []struct{ name, data, most string }{
		{"in a value", `{"region": "` + escapes + `"}`, "region (a string of " + strconv.Itoa(n) + " bytes)"},
		{"in a name", `{"` + escapes + `": 1}`, strconv.Quote(strings.Repeat("\n", 64)) + "..."},
		{"in a string at the top", `"` + escapes + `"`, ""},
	} {
		data := []byte(tt.data)
		want := "configuration: must be at most " + strconv.Itoa(limiter.MaxConfigBytes) + " bytes, got " + strconv.Itoa(len(data))
		if tt.most != "" {
			want += ", most of it " + tt.most
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := limiter.Parse(data)
		runtime.ReadMemStats(&after)
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v, want %s", tt.name, err, want)
		}
		// The error is under 300 bytes; 64 KiB leaves room for whatever
		// else the process allocates meanwhile, against the 8 MiB a
		// decoded copy of the escapes takes alone.
		if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
			t.Errorf("%s: refusing %d bytes allocated %d", tt.name, len(data), got)
		}
	}
}

// The rollout's canary is the noisiest 5% of the 200,000 clients the
// sidecar's plans are sized for: 10,000 keys, here of 64 characters. The
// configuration holds them, and enforces exactly them: no other key, not
// one a character short of a listed one (the keys are kept as substrings
// of the configuration's text), nor one a character longer.
func TestParseTenThousandCanaryKeys(t *testing.T) {
	keys := filtertest.CanaryKeys(10000, 64, 0)
	data := []byte(filtertest.CanaryConfig(keys))
	if len(data) < 10000*64 {
		t.Fatalf("the configuration is %d bytes, want at least 640,000", len(data))
	}
	cfg, err := limiter.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.CanaryClients) != len(keys) {
		t.Fatalf("%d canary clients, want %d", len(cfg.CanaryClients), len(keys))
	}
	for _, k := range keys {
		if !cfg.Enforced(k) {
			t.Fatalf("listed key %.8s... not enforced", k)
		}
		if cfg.Enforced(k[:63]) || cfg.Enforced(k+"x") {
			t.Fatalf("a key one character off %.8s... is enforced", k)
		}
	}
	for _, k := range filtertest.CanaryKeys(10000, 64, 10000) {
		if cfg.Enforced(k) {
			t.Fatalf("unlisted key %.8s... enforced", k)
		}
	}
	if cfg.Enforced("") {
		t.Error("a request without a key is enforced")
	}
}

// Reading a canary list costs no allocation per key: the text is copied
// once and the keys are substrings of the copy, in a map made at its final
// size. What is left is that copy, the map (a table of 1,024 slots for
// about every 900 keys: a dozen allocations for 10,000) and a few for the
// other fields, well under one for every 100 keys.
func TestParseCanaryAllocatesPerList(t *testing.T) {
	keys := filtertest.CanaryKeys(10000, 64, 0)
	data := []byte(filtertest.CanaryConfig(keys))
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := limiter.Parse(data); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > float64(len(keys))/100 {
		t.Errorf("Parse of %d canary keys made %.0f allocations, want at most %d", len(keys), allocs, len(keys)/100)
	}
}

func TestParseLimits(t *testing.T) {
	rules := make([]string, limiter.MaxCostRules+1)
	for i := range rules {
		rules[i] = `{"path_prefix": "/p` + strconv.Itoa(i) + `/", "cost": 1}` // "/p1" would match every path "/p10" does
	}
	_, err := limiter.Parse([]byte(`{"costs": [` + strings.Join(rules, ",") + `]}`))
	if want := "costs: must have at most 256 rules, got 257"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	if _, err := limiter.Parse([]byte(`{"costs": [` + strings.Join(rules[:limiter.MaxCostRules], ",") + `]}`)); err != nil {
		t.Errorf("256 rules: %v", err)
	}
	key := strings.Repeat("k", limiter.MaxKeyLen)
	if _, err := limiter.Parse([]byte(`{"canary_clients": ["` + key + `"]}`)); err != nil {
		t.Errorf("canary key of %d bytes: %v", len(key), err)
	}
	_, err = limiter.Parse([]byte(`{"canary_clients": ["` + key + `k"]}`))
	if err == nil || strings.Contains(err.Error(), key) {
		t.Errorf("over-long canary key: got %v (must fail without quoting the key)", err)
	}
	// What a VM keeps of a canary list follows its number of keys: 20,000
	// keys of 12 characters are a text far within the bound, but one key
	// more is refused for its count.
	keys := filtertest.CanaryKeys(limiter.MaxCanaryClients+1, 12, 0)
	if _, err := limiter.Parse([]byte(filtertest.CanaryConfig(keys[:limiter.MaxCanaryClients]))); err != nil {
		t.Errorf("%d canary keys: %v", limiter.MaxCanaryClients, err)
	}
	_, err = limiter.Parse([]byte(filtertest.CanaryConfig(keys)))
	if want := "canary_clients: must have at most 20000 keys, got 20001"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	for _, ok := range []string{`{"timeout_ms": 1}`, `{"timeout_ms": 60000}`, `{"costs": [{"method": "GET", "cost": 1000000}]}`,
		`{"region": ""}`, `{"api_key_header": "X-Api-Key"}`} {
		if _, err := limiter.Parse([]byte(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

func TestParseBreaker(t *testing.T) {
	for _, c := range []struct {
		config string
		want   limiter.BreakerConfig
	}{
		{filtertest.ValidConfig("breaker-off.json"), limiter.BreakerConfig{Failures: 0, MinOpenMs: 100, MaxOpenMs: 5000}},
		// An omitted max_open_ms is raised to min_open_ms.
		{filtertest.ValidConfig("breaker-min-only.json"), limiter.BreakerConfig{Failures: 20, MinOpenMs: 10000, MaxOpenMs: 10000}},
		{`{"breaker": {}}`, limiter.BreakerConfig{Failures: 20, MinOpenMs: 100, MaxOpenMs: 5000}},
		{`{"breaker": {"failures": 1}}`, limiter.BreakerConfig{Failures: 1, MinOpenMs: 100, MaxOpenMs: 5000}},
		{`{"breaker": {"max_open_ms": 100}}`, limiter.BreakerConfig{Failures: 20, MinOpenMs: 100, MaxOpenMs: 100}},
		{`{"breaker": {"failures": 10000, "min_open_ms": 60000, "max_open_ms": 60000}}`,
			limiter.BreakerConfig{Failures: 10000, MinOpenMs: 60000, MaxOpenMs: 60000}},
		{`{"breaker": {"max_open_ms": 300, "min_open_ms": 1}}`, limiter.BreakerConfig{Failures: 20, MinOpenMs: 1, MaxOpenMs: 300}},
	} {
		cfg, err := limiter.Parse([]byte(c.config))
		if err != nil {
			t.Errorf("%s: %v", c.config, err)
			continue
		}
		if cfg.Breaker != c.want {
			t.Errorf("%s: breaker %+v, want %+v", c.config, cfg.Breaker, c.want)
		}
	}
}

func TestCost(t *testing.T) {
	cfg, err := limiter.Parse([]byte(filtertest.ValidConfig("full.json")))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path string
		want         int64
	}{
		{"POST", "/v1/upload", 10},
		{"POST", "/v1/upload/big?x=1", 10},
		{"GET", "/v1/upload", 1},
		{"GET", "/v1/search?q=go", 2},
		{"POST", "/v1/search", 2},
		{"DELETE", "/v1/upload", 3},
		{"DELETE", "/v1/search", 2},
		{"GET", "/v1/other", 1},
		{"post", "/v1/upload", 1},
		{"", "", 1},
	} {
		if got := cfg.Cost(c.method, c.path); got != c.want {
			t.Errorf("Cost(%q, %q) = %d, want %d", c.method, c.path, got, c.want)
		}
	}
}

func TestEnforced(t *testing.T) {
	for _, c := range []struct {
		config string
		key    string
		want   bool
	}{
		{`{}`, "anyone", true},
		{`{"mode": "shadow"}`, "anyone", false},
		{`{"mode": "off"}`, "anyone", false},
		{`{"canary_clients": ["vip"]}`, "vip", true},
		{`{"canary_clients": ["vip"]}`, "other", false},
		{`{"mode": "shadow", "canary_clients": ["vip"]}`, "vip", false},
	} {
		cfg, err := limiter.Parse([]byte(c.config))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Enforced(c.key); got != c.want {
			t.Errorf("%s: Enforced(%q) = %v, want %v", c.config, c.key, got, c.want)
		}
	}
}

func equalConfig(a, b *limiter.Config) bool {
	return a.SidecarCluster == b.SidecarCluster && a.SidecarAuthority == b.SidecarAuthority &&
		a.TimeoutMs == b.TimeoutMs && a.APIKeyHeader == b.APIKeyHeader && a.Mode == b.Mode &&
		maps.Equal(a.CanaryClients, b.CanaryClients) && a.RejectMissingKey == b.RejectMissingKey &&
		slices.Equal(a.Costs, b.Costs) && a.Region == b.Region && a.Breaker == b.Breaker && a.OnFailure == b.OnFailure &&
		a.WarmConnections == b.WarmConnections
}

func TestParseOnFailure(t *testing.T) {
	for _, c := range []struct {
		config  string
		want    limiter.FailureMode
		summary string
	}{
		{"", limiter.FailOpen, "on_failure=open"},
		{filtertest.ValidConfig("on-failure-open.json"), limiter.FailOpen, "on_failure=open"},
		{filtertest.ValidConfig("on-failure-local.json"), limiter.FailLocal, "on_failure=local"},
		{`{"mode": "shadow", "on_failure": "local"}`, limiter.FailLocal, "on_failure=local"},
	} {
		cfg, err := limiter.Parse([]byte(c.config))
		if err != nil {
			t.Errorf("%s: %v", c.config, err)
			continue
		}
		if cfg.OnFailure != c.want || !strings.HasSuffix(cfg.Summary(), " "+c.summary) {
			t.Errorf("%s: on_failure %v, summary %q; want %v, ending %q", c.config, cfg.OnFailure, cfg.Summary(), c.want, c.summary)
		}
	}
}

// TestParseNeverQuotesCanaryKeys: canary_clients holds API keys, so no
// error about it quotes its value, whatever shape the value has.
func TestParseNeverQuotesCanaryKeys(t *testing.T) {
	const key = "secret-canary-4711"
	for _, c := range []struct{ config, want string }{
		{`{"canary_clients": "` + key + `"}`,
			"canary_clients: must be an array of API keys, got a string of 18 bytes (not shown: API keys are never logged)"},
		{`{"canary_clients": 4711}`,
			"canary_clients: must be an array of API keys, got a number (not shown: API keys are never logged)"},
		{`{"canary_clients": ["vip", 4711]}`,
			"canary_clients[1]: must be a string, got a number (not shown: API keys are never logged)"},
		{`{"canary_clients": ["` + key + ` "]}`,
			"canary_clients[0]: must be an API key of 1 to 256 visible ASCII characters, got a string of 19 bytes (not shown: API keys are never logged)"},
		{`{"canary_clients": {"` + key + `": true}}`, "canary_clients: must be an array of API keys, got an object"},
		{`{"canary_clients": [["` + key + `"]]}`, "canary_clients[0]: must be a string, got an array"},
	} {
		_, err := limiter.Parse([]byte(c.config))
		if err == nil || err.Error() != c.want {
			t.Errorf("%s:\n got %v\nwant %s", c.config, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), key) || strings.Contains(err.Error(), "4711")) {
			t.Errorf("%s: the error quotes the key: %v", c.config, err)
		}
	}
}

// TestParseSidecarAuthority: the callout's :authority is the sidecar's Host
// header; one the sidecar answers 400 would fail every request open.
func TestParseSidecarAuthority(t *testing.T) {
	for _, ok := range []string{"ratelimit-sidecar", "rl.internal:9000", "127.0.0.1:8081", "[::1]", "[::1]:8081",
		"edgelimit-sidecar.edge.svc.cluster.local", "A.B_c~d", "a!b$c&d'e(f)g*h+i,j;k=l", strings.Repeat("a", 255)} {
		if _, err := limiter.Parse([]byte(`{"sidecar_authority": "` + ok + `"}`)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "ratelimit-sidecar/v1", "user@rl", "rl:x", "rl:", ":8081", "rl:123456", "a:b:80",
		"[::1", "[]", "[v1.x]", "[::1]x", "[::1]:", "a%41b", "side car", "rl?x", "rl#x", `rl\x`, "rl{x}", strings.Repeat("a", 256)} {
		_, err := limiter.Parse([]byte(`{"sidecar_authority": "` + strings.ReplaceAll(bad, `\`, `\\`) + `"}`))
		if err == nil || !strings.HasPrefix(err.Error(), "sidecar_authority: must be a host name") {
			t.Errorf("%q: got %v", bad, err)
		}
	}
}
