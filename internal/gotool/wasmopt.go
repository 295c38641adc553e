package gotool

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// WasmOptArgs are the options BuildWasm optimises a module with, the input
// and output aside: binaryen's -O4 (filter/RATIONALE.md, "Why the module
// goes through wasm-opt", has the measurements), the function names kept for
// profiles (-g), and exactly the features Go's wasm output uses, so that
// the optimiser cannot bring in an instruction a runtime may lack; a module
// that uses one more fails to optimise, naming it.
var WasmOptArgs = []string{
	"-O4", "-g",
	"--enable-sign-ext", "--enable-nontrapping-float-to-int",
	"--enable-bulk-memory", "--enable-mutable-globals",
}

// OptimizeWasm writes in, optimised by wasm-opt with WasmOptArgs, to out.
// The result is kept in the user's cache directory under a digest of in,
// the arguments and wasm-opt's version, so a module built again unchanged
// (by every test package that builds the filter) is optimised once. As in
// Go's build cache, a result unused for cacheUnused is removed when the
// next one is written.
func OptimizeWasm(ctx context.Context, in, out string) error {
	tool, err := exec.LookPath("wasm-opt")
	if err != nil {
		return fmt.Errorf("wasm-opt (binaryen), which optimises the filter's module, is not on the PATH: `make deps` installs it (apt package binaryen): %w", err)
	}
	version, err := exec.CommandContext(ctx, tool, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", tool, err)
	}
	module, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, part := range [][]byte{version, []byte(strings.Join(WasmOptArgs, " ")), module} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	cached := ""
	if dir, err := os.UserCacheDir(); err == nil {
		cached = filepath.Join(dir, "edgelimit", "wasm-opt", hex.EncodeToString(h.Sum(nil))+".wasm")
		if b, err := os.ReadFile(cached); err == nil {
			now := time.Now()
			os.Chtimes(cached, now, now) // used: kept for another cacheUnused
			return os.WriteFile(out, b, 0o644)
		}
	}
	args := append(append([]string(nil), WasmOptArgs...), in, "-o", out)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("wasm-opt %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	if cached != "" {
		keep(out, cached)
	}
	return nil
}

// cacheUnused is how long a cached module stays without being used.
const cacheUnused = 5 * 24 * time.Hour

// keep copies the optimised module into the cache, through a file of its
// own renamed into place, so that a reader never sees part of one, and
// removes the modules unused for cacheUnused. The cache is only a saving:
// failing to write it is no error.
func keep(out, cached string) {
	b, err := os.ReadFile(out)
	if err != nil || os.MkdirAll(filepath.Dir(cached), 0o755) != nil {
		return
	}
	if old, err := os.ReadDir(filepath.Dir(cached)); err == nil {
		for _, e := range old {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > cacheUnused {
				os.Remove(filepath.Join(filepath.Dir(cached), e.Name()))
			}
		}
	}
	f, err := os.CreateTemp(filepath.Dir(cached), "partial-*")
	if err != nil {
		return
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(f.Name(), cached)
	}
	if err != nil {
		os.Remove(f.Name())
	}
}
