package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRunChecksFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "plans.yaml")
	os.WriteFile(good, []byte("default_plan: free\nplans:\n  free: {capacity: 10, rate: 2}\n"), 0o600)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("plans:\n  free: {capacity: -1, rate: 2}\n"), 0o600)
	tests := []struct {
		args []string
		want string // "" for success
	}{
		{[]string{"-check", "-plans", good, "-limiter", "enforce"}, ""},
		{[]string{"-check", "-safety", "0"}, ""},
		{[]string{"-check", "-limiter", "bogus", "-plans", good}, `-limiter: want off, enforce or observe, got "bogus"`},
		{[]string{"-check", "-limiter", "enforce"}, "-plans: required with -limiter enforce and -safety 10"},
		{[]string{"-check"}, "-plans: required with -limiter off and -safety 10"},
		{[]string{"-check", "-service", "orders"}, `invalid value "orders" for flag -service: want NAME=HOST:PORT, got "orders"`},
		{[]string{"-check", "-service", "a=1:1", "-service", "a=1:2"}, `invalid value "a=1:2" for flag -service: service "a" given twice`},
	}
	for _, tt := range tests {
		err := run(tt.args)
		if (err == nil) != (tt.want == "") || (err != nil && err.Error() != tt.want) {
			t.Errorf("run(%q): %v, want %q", tt.args, err, tt.want)
		}
	}
	if err := run([]string{"-check", "-plans", bad}); err == nil {
		t.Errorf("a plans file with capacity -1 was accepted")
	}
}
