package testkit

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The product — the filter, the sidecar, the Lua script — and the demo
// deployment's service are built without test support: none of them
// imports this package or the end-to-end harness, directly or not.
func TestProductDoesNotImportTestSupport(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, env := range [][]string{nil, {"GOOS=wasip1", "GOARCH=wasm"}} {
		pkgs := []string{"./filter/...", "./sidecar/...", "./lua/...", "./e2e/demoservice"}
		if env != nil {
			pkgs = []string{"./filter"} // what is compiled to filter.wasm
		}
		cmd := exec.Command(goBin, append([]string{"list", "-deps"}, pkgs...)...)
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(cmd.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %v (%v): %v", pkgs, env, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list %v listed only %v", pkgs, deps)
		}
		for _, d := range deps {
			if d == "github.com/edgelimit/edgelimit/internal/testkit" || d == "github.com/edgelimit/edgelimit/e2e/harness" {
				t.Errorf("%v (%v) depends on %s", pkgs, env, d)
			}
		}
	}
}
