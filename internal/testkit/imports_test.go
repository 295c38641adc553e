package testkit

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/gotool"
)

// The product — the filter, the sidecar, the Lua script — and the demo
// deployment's service are built without test support: none of them
// imports this package or the end-to-end harness, directly or not.
func TestProductDoesNotImportTestSupport(t *testing.T) {
	for _, env := range [][]string{nil, {"GOOS=wasip1", "GOARCH=wasm"}} {
		pkgs := []string{"./filter/...", "./sidecar/...", "./lua/...", "./e2e/demoservice"}
		if env != nil {
			pkgs = []string{"./filter"} // what is compiled to filter.wasm
		}
		out, err := gotool.Output(context.Background(), filepath.Join("..", ".."), env, append([]string{"list", "-deps"}, pkgs...)...)
		if err != nil {
			t.Fatalf("%v: %v", env, err)
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
