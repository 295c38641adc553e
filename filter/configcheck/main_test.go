package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	for file, content := range map[string]string{good: `{"mode": "shadow", "timeout_ms": 10}`, bad: `{"timeout_ms": -3}`} {
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		file, want string
		ok         bool
	}{
		{good, good + ": ok: mode=shadow sidecar_cluster=ratelimit_sidecar sidecar_authority=ratelimit-sidecar " +
			"timeout_ms=10 api_key_header=x-api-key on_missing_key=reject canary_clients=0 costs=0 region= " +
			"breaker_failures=5 breaker_open_ms=100-5000 warm_connections=16 on_failure=open", true},
		{bad, bad + ": invalid: timeout_ms: must be > 0, got -3", false},
		{filepath.Join(dir, "missing.json"), filepath.Join(dir, "missing.json") + ": open " + filepath.Join(dir, "missing.json") + ": no such file or directory", false},
	} {
		line, ok := check(c.file)
		if line != c.want || ok != c.ok {
			t.Errorf("check(%s) = %q, %v; want %q, %v", c.file, line, ok, c.want, c.ok)
		}
	}
}
