package main

import (
	"bytes"
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
			"breaker_failures=20 breaker_open_ms=100-5000 warm_connections=16 on_failure=open", true},
		{bad, bad + ": invalid: timeout_ms: must be > 0, got -3", false},
		{filepath.Join(dir, "missing.json"), filepath.Join(dir, "missing.json") + ": open " + filepath.Join(dir, "missing.json") + ": no such file or directory", false},
	} {
		line, ok := check(c.file)
		if line != c.want || ok != c.ok {
			t.Errorf("check(%s) = %q, %v; want %q, %v", c.file, line, ok, c.want, c.ok)
		}
	}
}

// TestHelp: -h prints the usage and succeeds; it names no file to open.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var out, errOut bytes.Buffer
		if code := run([]string{arg}, &out, &errOut); code != 0 || !bytes.HasPrefix(out.Bytes(), []byte("usage: configcheck FILE...")) || errOut.Len() != 0 {
			t.Errorf("configcheck %s: exit %d, stdout %q, stderr %q; want exit 0 and the usage", arg, code, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 || !bytes.HasPrefix(errOut.Bytes(), []byte("usage: configcheck FILE...")) {
		t.Errorf("configcheck with no file: exit %d, stderr %q; want exit 2 and the usage", code, errOut.String())
	}
}
