//go:build !wasip1

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/edgelimit/edgelimit/internal/gotool"
)

// These tests build filter.wasm with the standard toolchain and inspect it
// the way a proxy does when it loads it. The behaviour tests run it in the
// headless host under e2e/.

var module struct {
	once sync.Once
	wasm []byte
	err  error
}

// compileCache holds the module's compiled code for every runtime of the
// package's tests, so that it is compiled once: under the race detector
// wazero's compiler takes some twenty seconds over it.
var compileCache = wazero.NewCompilationCache()

// newRuntime is a runtime with the package's compilation cache.
func newRuntime(ctx context.Context) wazero.Runtime {
	return wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(compileCache))
}

// buildModule builds filter.wasm once for all the tests of the package.
func buildModule(t *testing.T) []byte {
	t.Helper()
	module.once.Do(func() {
		dir, err := os.MkdirTemp("", "filter-wasm-")
		if err != nil {
			module.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "filter.wasm")
		if module.err = gotool.BuildWasm(context.Background(), ".", ".", out); module.err != nil {
			return
		}
		module.wasm, module.err = os.ReadFile(out)
	})
	if module.err != nil {
		t.Fatal(module.err)
	}
	t.Logf("filter.wasm: %d bytes", len(module.wasm))
	return module.wasm
}

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

type signature struct{ params, results []api.ValueType }

func sig(results int, params ...api.ValueType) signature {
	s := signature{params: params}
	for range results {
		s.results = append(s.results, i32)
	}
	return s
}

func n32(n int) []api.ValueType { return slices.Repeat([]api.ValueType{i32}, n) }

// The exports Envoy looks up, with the signatures it checks (ABI 0.2.1).
var wantExports = map[string]signature{
	"_initialize":                 sig(0),
	"proxy_abi_version_0_2_1":     sig(0),
	"proxy_on_memory_allocate":    sig(1, i32),
	"proxy_on_context_create":     sig(0, n32(2)...),
	"proxy_on_vm_start":           sig(1, n32(2)...),
	"proxy_on_configure":          sig(1, n32(2)...),
	"proxy_on_request_headers":    sig(1, n32(3)...),
	"proxy_on_response_headers":   sig(1, n32(3)...),
	"proxy_on_http_call_response": sig(0, n32(5)...),
	"proxy_on_tick":               sig(0, i32),
	"proxy_on_delete":             sig(0, i32),
}

// Exports the module must not have: malloc, which Envoy would prefer over
// proxy_on_memory_allocate, and callbacks the filter has no use for, each of
// which would be one more call into the VM per request, since Envoy skips a
// callback that is absent (filter/RATIONALE.md, "Why neither proxy_on_log
// nor proxy_on_done?").
var unwantedExports = []string{"malloc", "proxy_on_log", "proxy_on_done"}

// The host functions of ABI 0.2.1 the filter may import, with their
// signatures; every one returns a status.
var allowedProxyImports = map[string]signature{
	"proxy_log":                          sig(1, n32(3)...),
	"proxy_get_buffer_bytes":             sig(1, n32(5)...),
	"proxy_get_header_map_value":         sig(1, n32(5)...),
	"proxy_get_header_map_pairs":         sig(1, n32(3)...),
	"proxy_add_header_map_value":         sig(1, n32(5)...),
	"proxy_replace_header_map_value":     sig(1, n32(5)...),
	"proxy_remove_header_map_value":      sig(1, n32(3)...),
	"proxy_send_local_response":          sig(1, n32(8)...),
	"proxy_http_call":                    sig(1, n32(10)...),
	"proxy_continue_stream":              sig(1, i32),
	"proxy_set_effective_context":        sig(1, i32),
	"proxy_get_shared_data":              sig(1, n32(5)...),
	"proxy_set_shared_data":              sig(1, n32(5)...),
	"proxy_define_metric":                sig(1, n32(4)...),
	"proxy_increment_metric":             sig(1, i32, i64),
	"proxy_record_metric":                sig(1, i32, i64),
	"proxy_set_tick_period_milliseconds": sig(1, i32),
	"proxy_get_current_time_nanoseconds": sig(1, i32),
}

func TestModuleExportsAndImports(t *testing.T) {
	wasm := buildModule(t)
	ctx := context.Background()
	r := newRuntime(ctx)
	defer r.Close(ctx)
	mod, err := r.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}

	exports := mod.ExportedFunctions()
	for name, want := range wantExports {
		def, ok := exports[name]
		if !ok {
			t.Errorf("export %s missing", name)
			continue
		}
		if !slices.Equal(def.ParamTypes(), want.params) || !slices.Equal(def.ResultTypes(), want.results) {
			t.Errorf("export %s: signature %v -> %v, want %v -> %v", name, def.ParamTypes(), def.ResultTypes(), want.params, want.results)
		}
	}
	for _, name := range unwantedExports {
		if _, ok := exports[name]; ok {
			t.Errorf("module exports %s", name)
		}
	}
	if _, ok := mod.ExportedMemories()["memory"]; !ok {
		t.Error("memory not exported")
	}

	var wasi []string
	for _, def := range mod.ImportedFunctions() {
		module, name, _ := def.Import()
		switch module {
		case "wasi_snapshot_preview1":
			wasi = append(wasi, name)
		case "env":
			want, ok := allowedProxyImports[name]
			if !ok {
				t.Errorf("import env.%s is not a proxy-wasm 0.2.1 host function the filter should use", name)
				continue
			}
			if !slices.Equal(def.ParamTypes(), want.params) || !slices.Equal(def.ResultTypes(), want.results) {
				t.Errorf("import env.%s: signature %v -> %v, want %v -> %v", name, def.ParamTypes(), def.ResultTypes(), want.params, want.results)
			}
		default:
			t.Errorf("import %s.%s: only env.proxy_* and wasi_snapshot_preview1.* are allowed", module, name)
		}
	}
	t.Logf("WASI imports: %s", strings.Join(wasi, " "))
}

// stubHost provides every env import of the module. Calls are recorded; the
// few the test drives do what Envoy does, everything else answers OK. An i32
// argument is the low half of its stack slot (wazero leaves the high half
// undefined), hence the uint32 conversions.
type stubHost struct {
	calls  []string
	logs   []string
	config []byte
}

func (h *stubHost) instantiate(ctx context.Context, t *testing.T, r wazero.Runtime, mod wazero.CompiledModule) {
	b := r.NewHostModuleBuilder("env")
	for _, def := range mod.ImportedFunctions() {
		module, name, _ := def.Import()
		if module != "env" {
			continue
		}
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
			h.calls = append(h.calls, name)
			stack[0] = h.call(ctx, t, m, name, stack)
		}), def.ParamTypes(), def.ResultTypes()).Export(name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
}

func (h *stubHost) call(ctx context.Context, t *testing.T, m api.Module, name string, stack []uint64) uint64 {
	mem := m.Memory()
	switch name {
	case "proxy_log":
		msg, _ := mem.Read(uint32(stack[1]), uint32(stack[2]))
		h.logs = append(h.logs, string(msg))
	case "proxy_get_buffer_bytes":
		// Plugin configuration only, copied into memory the module gives.
		if uint32(stack[0]) != 7 {
			return 1
		}
		res, err := m.ExportedFunction("proxy_on_memory_allocate").Call(ctx, uint64(len(h.config)))
		if err != nil || res[0] == 0 {
			t.Errorf("proxy_on_memory_allocate(%d): %v %v", len(h.config), res, err)
			return 10
		}
		mem.Write(uint32(res[0]), h.config)
		mem.WriteUint32Le(uint32(stack[3]), uint32(res[0]))
		mem.WriteUint32Le(uint32(stack[4]), uint32(len(h.config)))
	case "proxy_define_metric":
		mem.WriteUint32Le(uint32(stack[3]), uint32(len(h.calls)))
	}
	return 0
}

// TestModuleStartsAndConfigures loads the module as Envoy does: _initialize
// (during which only proxy_log and WASI may be called), then the root
// context, vm start and configure, and checks the plugin configuration
// crosses the memory handshake intact.
func TestModuleStartsAndConfigures(t *testing.T) {
	wasm := buildModule(t)
	ctx := context.Background()
	r := newRuntime(ctx)
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	h := &stubHost{}
	h.instantiate(ctx, t, r, compiled)
	var stderr bytes.Buffer
	m, err := r.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().
		WithStartFunctions("_initialize").WithStderr(&stderr).WithStdout(&stderr))
	if err != nil {
		t.Fatalf("instantiate: %v\n%s", err, stderr.String())
	}
	for _, c := range h.calls {
		if c != "proxy_log" {
			t.Errorf("_initialize called %s; Envoy traps every proxy_* call but proxy_log then", c)
		}
	}

	call := func(name string, args ...uint64) []uint64 {
		t.Helper()
		res, err := m.ExportedFunction(name).Call(ctx, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, stderr.String())
		}
		return res
	}
	call("proxy_on_context_create", 1, 0)
	if got := call("proxy_on_vm_start", 1, 0); got[0] != 1 {
		t.Fatalf("proxy_on_vm_start = %d, want 1", got[0])
	}

	h.config = []byte(`{"timeout_ms": -3}`)
	if got := call("proxy_on_configure", 1, uint64(len(h.config))); got[0] != 0 {
		t.Errorf("proxy_on_configure(invalid) = %d, want 0", got[0])
	}
	want := "edgelimit: invalid configuration: timeout_ms: must be > 0, got -3"
	if !slices.Contains(h.logs, want) {
		t.Errorf("logs %q do not contain %q", h.logs, want)
	}

	h.config = []byte(`{"mode": "shadow", "region": "eu-west-1"}`)
	if got := call("proxy_on_configure", 1, uint64(len(h.config))); got[0] != 1 {
		t.Errorf("proxy_on_configure(valid) = %d, want 1; logs %q", got[0], h.logs)
	}
	if !slices.ContainsFunc(h.logs, func(l string) bool {
		return strings.HasPrefix(l, "edgelimit: configured: mode=shadow ") && strings.Contains(l, " region=eu-west-1 ")
	}) {
		t.Errorf("no configured line in logs %q", h.logs)
	}
}
