package filtertest

import (
	"embed"
	"strconv"
	"strings"
)

// Configuration fixtures, one file per case, shared by the limiter's parser
// tests and by Run (which feeds them to the plugin through the host).
//
//go:embed testdata/config
var configFS embed.FS

// ConfigCase is an invalid plugin configuration and the exact error the
// filter gives for it; the plugin logs it as
// "edgelimit: invalid configuration: " + Error.
type ConfigCase struct {
	File  string // under testdata/config/invalid/
	Error string
}

// InvalidConfigs lists every invalid configuration fixture.
var InvalidConfigs = []ConfigCase{
	{"unquoted-key.json", "configuration: invalid JSON at offset 1: expected a string as object key"},
	{"trailing-comma.json", "configuration: invalid JSON at offset 19: expected a string as object key"},
	{"truncated.json", "configuration: invalid JSON at offset 18: unexpected end of input in object"},
	{"two-values.json", "configuration: invalid JSON at offset 3: unexpected data after the top-level value"},
	{"bad-escape.json", `configuration: invalid JSON at offset 11: invalid escape 'q'`},
	{"lone-surrogate.json", `configuration: invalid JSON at offset 18: unpaired surrogate in \u escape`},
	{"invalid-utf8.json", "configuration: invalid JSON at offset 13: invalid UTF-8 in string"},
	{"raw-tab.json", "configuration: invalid JSON at offset 13: control character in string"},
	{"too-deep.json", "configuration: invalid JSON at offset 25: nested deeper than 16 levels"},
	{"not-an-object.json", "configuration: must be a JSON object, got an array"},
	{"null.json", "configuration: must be a JSON object, got null"},
	{"unknown-field.json", `configuration: unknown field "modee"`},
	{"duplicate-field.json", `configuration: duplicate field "mode"`},
	{"timeout-negative.json", "timeout_ms: must be > 0, got -3"},
	{"timeout-zero.json", "timeout_ms: must be > 0, got 0"},
	{"timeout-too-long.json", "timeout_ms: must be <= 60000, got 60001"},
	{"timeout-fraction.json", "timeout_ms: must be an integer, got 2.5"},
	{"timeout-exponent.json", "timeout_ms: must be an integer, got 5e1"},
	{"timeout-string.json", `timeout_ms: must be a number, got "5"`},
	{"timeout-overflow.json", "timeout_ms: must be <= 60000, got 99999999999999999999"},
	{"mode-unknown.json", `mode: must be "enforce", "shadow" or "off", got "block"`},
	{"mode-null.json", `mode: must be "enforce", "shadow" or "off", got null`},
	{"mode-case.json", `mode: must be "enforce", "shadow" or "off", got "Enforce"`},
	{"on-missing-key-unknown.json", `on_missing_key: must be "reject" or "allow", got "deny"`},
	{"cluster-empty.json", `sidecar_cluster: must be 1 to 255 visible ASCII characters, got ""`},
	{"authority-space.json", `sidecar_authority: must be a host name, an IPv4 address or an IPv6 address in brackets, then an optional :port, at most 255 characters, got "side car"`},
	{"authority-path.json", `sidecar_authority: must be a host name, an IPv4 address or an IPv6 address in brackets, then an optional :port, at most 255 characters, got "ratelimit-sidecar/v1"`},
	{"api-key-header-pseudo.json", `api_key_header: must be an HTTP header name, got ":path"`},
	{"api-key-header-space.json", `api_key_header: must be an HTTP header name, got "x api key"`},
	{"api-key-header-number.json", "api_key_header: must be a string, got 42"},
	{"api-key-header-authorization.json", `api_key_header: must not be "authorization": "authorization: Bearer <key>" is read ` +
		`whatever the header, leave api_key_header out or name another header, got "Authorization"`},
	{"api-key-header-host.json", `api_key_header: must not be "host": the proxy gives a filter the Host header as ":authority", ` +
		`so every request would be missing its key, got "Host"`},
	{"api-key-header-shadow.json", `api_key_header: must not be "x-ratelimit-shadow", the filter's own header, got "x-ratelimit-shadow"`},
	{"canary-not-array.json", "canary_clients: must be an array of API keys, got a string of 3 bytes (not shown: API keys are never logged)"},
	{"canary-bad-key.json", "canary_clients[1]: must be an API key of 1 to 256 visible ASCII characters, " +
		"got a string of 9 bytes (not shown: API keys are never logged)"},
	{"canary-number.json", "canary_clients[0]: must be a string, got a number (not shown: API keys are never logged)"},
	{"costs-not-array.json", "costs: must be an array of rules, got an object"},
	{"costs-rule-string.json", `costs[0]: must be an object, got "POST /upload"`},
	{"costs-rule-matches-all.json", `costs[0]: must set "method" or "path_prefix" or both`},
	{"costs-missing-cost.json", `costs[0]: missing field "cost"`},
	{"costs-zero.json", "costs[0].cost: must be > 0, got 0"},
	{"costs-too-big.json", "costs[0].cost: must be <= 1000000, got 1000001"},
	{"costs-lower-case-method.json", `costs[0].method: must be an upper-case HTTP method such as "POST", got "post"`},
	{"costs-relative-path.json", `costs[1].path_prefix: must be a path starting with "/" of at most 1024 visible ASCII characters, got "v1/upload"`},
	{"costs-unknown-field.json", `costs[0]: unknown field "prefix"`},
	{"costs-duplicate-field.json", `costs[0]: duplicate field "cost"`},
	{"costs-rule-shadowed.json", "costs[1]: never matches: costs[0] matches every request it does, and the first matching rule wins; put the narrower rule first"},
	{"costs-rule-shadowed-by-method.json", "costs[2]: never matches: costs[0] matches every request it does, and the first matching rule wins; put the narrower rule first"},
	{"region-too-long.json", `region: must be at most 64 characters of A-Z a-z 0-9 . _ -, got "` + strings.Repeat("a", 64) + `"...`},
	{"region-space.json", `region: must be at most 64 characters of A-Z a-z 0-9 . _ -, got "eu west"`},
	{"region-slash.json", `region: must be at most 64 characters of A-Z a-z 0-9 . _ -, got "eu/west"`},
	{"breaker-not-object.json", "breaker: must be an object, got 5"},
	{"breaker-null.json", "breaker: must be an object, got null"},
	{"breaker-unknown-field.json", `breaker: unknown field "threshold"`},
	{"breaker-duplicate-field.json", `breaker: duplicate field "failures"`},
	{"breaker-failures-negative.json", "breaker.failures: must be >= 0, got -1"},
	{"breaker-failures-too-many.json", "breaker.failures: must be <= 10000, got 10001"},
	{"breaker-failures-fraction.json", "breaker.failures: must be an integer, got 2.5"},
	{"breaker-failures-string.json", `breaker.failures: must be a number, got "5"`},
	{"breaker-min-open-zero.json", "breaker.min_open_ms: must be > 0, got 0"},
	{"breaker-min-open-too-long.json", "breaker.min_open_ms: must be <= 60000, got 60001"},
	{"breaker-max-open-too-long.json", "breaker.max_open_ms: must be <= 60000, got 60001"},
	{"breaker-max-below-min.json", "breaker.max_open_ms: must be >= min_open_ms (500), got 200"},
	{"breaker-max-below-default-min.json", "breaker.max_open_ms: must be >= min_open_ms (100), got 50"},
	{"on-failure-unknown.json", `on_failure: must be "open" or "local", got "closed"`},
	{"on-failure-case.json", `on_failure: must be "open" or "local", got "Local"`},
	{"on-failure-bool.json", `on_failure: must be "open" or "local", got true`},
	{"on-failure-null.json", `on_failure: must be "open" or "local", got null`},
	{"on-failure-duplicate.json", `configuration: duplicate field "on_failure"`},
	{"warm-connections-negative.json", "warm_connections: must be >= 0, got -1"},
	{"warm-connections-too-many.json", "warm_connections: must be <= 64, got 65"},
	{"warm-connections-string.json", `warm_connections: must be a number, got "16"`},
	{"warm-connections-fraction.json", "warm_connections: must be an integer, got 1.5"},
}

// ValidConfigs lists the valid configuration fixtures under
// testdata/config/valid/.
var ValidConfigs = []string{
	"empty.json", "whitespace.json", "empty-object.json", "full.json", "shadow.json", "off.json", "escapes.json",
	"breaker-off.json", "breaker-min-only.json", "on-failure-open.json", "on-failure-local.json",
	"warm-connections-off.json", "costs-narrower-first.json",
}

// InvalidConfig returns the content of an invalid configuration fixture.
func InvalidConfig(file string) string { return fixture("invalid/" + file) }

// ValidConfig returns the content of a valid configuration fixture.
func ValidConfig(file string) string { return fixture("valid/" + file) }

func fixture(path string) string {
	b, err := configFS.ReadFile("testdata/config/" + path)
	if err != nil {
		panic("filtertest: missing fixture " + path)
	}
	return string(b)
}

// ConfigFixtures lists every fixture file under testdata/config, as
// "invalid/<file>" or "valid/<file>", so that a test can check each one has
// an entry in the tables above.
func ConfigFixtures() []string {
	var files []string
	for _, dir := range []string{"invalid", "valid"} {
		entries, err := configFS.ReadDir("testdata/config/" + dir)
		if err != nil {
			panic(err)
		}
		for _, e := range entries {
			files = append(files, dir+"/"+e.Name())
		}
	}
	return files
}

// CanaryKeys returns n distinct API keys of length visible ASCII
// characters (length at least 6), numbered from from on: keys numbered
// apart never meet. A canary list of the rollout's size is
// CanaryKeys(10000, 64, 0): the noisiest 5% of the 200,000 clients the
// sidecar's plans are sized for.
func CanaryKeys(n, length, from int) []string {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~"
	keys := make([]string, n)
	for i := range keys {
		k := []byte(strconv.Itoa(from+i) + "/")
		for len(k) < length {
			k = append(k, chars[(len(k)*7+i)%len(chars)])
		}
		keys[i] = string(k[:length])
	}
	return keys
}

// CanaryConfig is a plugin configuration whose canary_clients are keys.
func CanaryConfig(keys []string) string {
	return `{"mode": "enforce", "canary_clients": ["` + strings.Join(keys, `", "`) + `"]}`
}
