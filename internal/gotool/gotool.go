// Package gotool runs the go tool of the toolchain the running program was
// built with, for the tests and tools that build the project's binaries and
// wasm modules: every such build then uses the same Go as the test that
// asked for it, whatever go comes first on the PATH (a program built with
// -trimpath does not know its toolchain: goCommand), and the filter's
// module is built the one way the Makefile builds build/filter.wasm: go
// build, then binaryen's wasm-opt (wasmopt.go).
package gotool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Run runs go with args in dir, env added to the environment; a failure
// carries what the command printed.
func Run(ctx context.Context, dir string, env []string, args ...string) error {
	_, err := Output(ctx, dir, env, args...)
	return err
}

// Output runs go as Run does and returns what it printed on its standard
// output (all of it, on failure too); a failure carries that and its
// standard error.
func Output(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, goCommand(runtime.GOROOT()), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("go %s: %v\n%s%s", strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// goCommand is the go tool under root, the GOROOT the running program was
// built with. A program built with -trimpath records none (root is ""):
// then the go on the PATH, which go test and go generate put first for the
// programs they run, and which the Makefile's $(GO) is unless told
// otherwise.
func goCommand(root string) string {
	if root == "" {
		return "go"
	}
	return filepath.Join(root, "bin", "go")
}

// BuildWasm builds pkg, a wasip1 reactor (a main package of go:wasmexport
// functions), in dir to out as the Makefile builds build/filter.wasm:
// GoBuildWasm, then OptimizeWasm.
func BuildWasm(ctx context.Context, dir, pkg, out string, flags ...string) error {
	built := out + ".go"
	defer os.Remove(built)
	if err := GoBuildWasm(ctx, dir, pkg, built, flags...); err != nil {
		return err
	}
	return OptimizeWasm(ctx, built, out)
}

// GoBuildWasm is BuildWasm's first step alone: GOOS=wasip1 GOARCH=wasm go
// build -buildmode=c-shared -trimpath, with flags (build tags, linker
// flags) before pkg. For the modules that only exercise a host (the probe
// of envoy/wasmhost's tests), where the optimiser's time would buy nothing.
func GoBuildWasm(ctx context.Context, dir, pkg, out string, flags ...string) error {
	args := append([]string{"build", "-buildmode=c-shared", "-trimpath", "-o", out}, flags...)
	return Run(ctx, dir, []string{"GOOS=wasip1", "GOARCH=wasm"}, append(args, pkg)...)
}
