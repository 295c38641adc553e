package gotool

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// tinyReactor writes a main package of one go:wasmexport function in a
// module of its own and returns its directory.
func tinyReactor(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{
		"go.mod":  "module tiny\n\ngo 1.26\n",
		"main.go": "package main\n\n//go:wasmexport add\nfunc add(a, b int32) int32 { return a + b }\n\nfunc main() {}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestBuildWasmOptimises: BuildWasm's module is wasm-opt's output of what
// go build makes, not that output itself; it keeps the function names (a
// profile needs them), runs (wazero compiles it and its export answers),
// and a second build of the same code is the same module, the first
// build's, taken from the cache, which drops what went unused for
// cacheUnused.
func TestBuildWasmOptimises(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	cache := filepath.Join(os.Getenv("XDG_CACHE_HOME"), "edgelimit", "wasm-opt")
	// Two modules of earlier builds: one unused for longer than
	// cacheUnused, which writing a new one removes, and one used since.
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	stale, recent := filepath.Join(cache, "stale.wasm"), filepath.Join(cache, "recent.wasm")
	for _, f := range []string{stale, recent} {
		if err := os.WriteFile(f, []byte("\x00asm"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unused := time.Now().Add(-cacheUnused - time.Hour)
	if err := os.Chtimes(stale, unused, unused); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src := tinyReactor(t)
	out := t.TempDir()
	plain := filepath.Join(out, "plain.wasm")
	if err := GoBuildWasm(ctx, src, ".", plain); err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(out, "first.wasm")
	if err := BuildWasm(ctx, src, ".", first); err != nil {
		t.Fatal(err)
	}
	built, err := os.ReadFile(plain)
	if err != nil {
		t.Fatal(err)
	}
	optimised, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(built, optimised) {
		t.Fatal("BuildWasm wrote go build's module unchanged")
	}
	if _, err := os.Stat(first + ".go"); !os.IsNotExist(err) {
		t.Errorf("go build's module was left beside the output: %v", err)
	}

	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	var compiled [2]wazero.CompiledModule
	var names [2]string // of the export's function, from each module's name section
	for i, m := range [][]byte{built, optimised} {
		if compiled[i], err = rt.CompileModule(ctx, m); err != nil {
			t.Fatal(err)
		}
		names[i] = compiled[i].ExportedFunctions()["add"].Name()
	}
	if names[1] == "" || names[1] != names[0] {
		t.Errorf("the export's function is named %q in go build's module and %q in BuildWasm's: the names were dropped", names[0], names[1])
	}
	mod, err := rt.InstantiateModule(ctx, compiled[1], wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := mod.ExportedFunction("add").Call(ctx, 2, 40); err != nil || len(res) != 1 || res[0] != 42 {
		t.Fatalf("add(2, 40) = %v, %v; want 42", res, err)
	}

	// The cache holds the optimised module besides; a build of the same
	// code copies it out rather than running wasm-opt again, so a module
	// put in its place is what the next build writes.
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a module unused for longer than %v is still cached (%v)", cacheUnused, err)
	}
	if err := os.Remove(recent); err != nil {
		t.Errorf("a module used recently is no longer cached: %v", err)
	}
	cached, err := filepath.Glob(filepath.Join(cache, "*"))
	if err != nil || len(cached) != 1 {
		t.Fatalf("cache holds %v (%v), want one module", cached, err)
	}
	if b, err := os.ReadFile(cached[0]); err != nil || !bytes.Equal(b, optimised) {
		t.Fatalf("the cached module is not the optimised one (%v)", err)
	}
	marked := append(append([]byte(nil), optimised...), 0, 4, 'm', 'a', 'r', 'k')
	if err := os.WriteFile(cached[0], marked, 0o644); err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(out, "second.wasm")
	if err := BuildWasm(ctx, src, ".", second); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(second); err != nil || !bytes.Equal(b, marked) {
		t.Errorf("a second build of the same code did not take the cached module (%v)", err)
	}
}

// TestBuildWasmNeedsWasmOpt: without wasm-opt on the PATH the build fails
// and says what installs it, rather than shipping an unoptimised module.
func TestBuildWasmNeedsWasmOpt(t *testing.T) {
	// A PATH with the go tool on it and nothing else, for a test built
	// without a GOROOT (goCommand).
	goTool, err := exec.LookPath(goCommand(runtime.GOROOT()))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(goTool, filepath.Join(bin, "go")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	out := filepath.Join(t.TempDir(), "tiny.wasm")
	err = BuildWasm(context.Background(), tinyReactor(t), ".", out)
	if err == nil || !strings.Contains(err.Error(), "make deps") || !strings.Contains(err.Error(), "binaryen") {
		t.Fatalf("BuildWasm without wasm-opt: %v, want an error naming binaryen and make deps", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a module was written anyway: %v", err)
	}
}
