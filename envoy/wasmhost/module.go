package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// PollMode says how the host answers WASI poll_oneoff, which differs between
// Envoy generations and decides whether a standard-Go module survives its
// first garbage collection after a runtime timer exists (see RATIONALE.md).
type PollMode int

const (
	// PollSleep implements poll_oneoff for real: it sleeps until the
	// earliest clock subscription is due and reports it. The default.
	PollSleep PollMode = iota
	// PollNoEvents answers success with zero events at once, never
	// sleeping, as proxy-wasm-cpp-host does since its WASI update of April
	// 2026 (#533), which Envoy picked up in June 2026.
	PollNoEvents
	// PollENOSYS answers ENOSYS, as Envoy did from 1.33 until that update.
	// That generation also lists fewer WASI functions (a module importing
	// another fails to link) and allows poll_oneoff neither during
	// _initialize nor during an allocation (such a call traps).
	PollENOSYS
)

func (p PollMode) String() string {
	switch p {
	case PollSleep:
		return "sleep"
	case PollNoEvents:
		return "noevents"
	case PollENOSYS:
		return "enosys"
	}
	return fmt.Sprintf("PollMode(%d)", int(p))
}

// ParsePollMode parses "sleep", "noevents" or "enosys".
func ParsePollMode(s string) (PollMode, error) {
	for _, p := range []PollMode{PollSleep, PollNoEvents, PollENOSYS} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("poll_oneoff mode: want sleep, noevents or enosys, got %q", s)
}

// ModuleOptions configure how a module is compiled and linked.
type ModuleOptions struct {
	// Poll is how WASI poll_oneoff answers; it also picks the Envoy
	// generation's WASI function set and call restrictions. Defaults to
	// PollSleep.
	Poll PollMode
	// Cache holds compiled code; defaults to one in-memory cache shared by
	// the whole process, so a module is compiled once however often it is
	// loaded.
	Cache wazero.CompilationCache
}

// sharedCache is the process-wide compilation cache.
var sharedCache = wazero.NewCompilationCache()

// Module is a compiled proxy-wasm module, ready to be instantiated as VMs.
type Module struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	poll     PollMode
	abi      string // the ABI marker export
	alloc    string // "malloc" or "proxy_on_memory_allocate"
	exports  map[string]bool
	vms      atomic.Int64
}

// Errors a module load reports, wrapped with detail.
var (
	ErrNoABIVersion = errors.New("missing or unknown Proxy-Wasm ABI version")
	ErrNoMalloc     = errors.New("wasm module is missing malloc function")
)

// LoadFile reads and compiles a module from a file.
func LoadFile(ctx context.Context, path string, o ModuleOptions) (*Module, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load wasm module: %w", err)
	}
	m, err := Load(ctx, b, o)
	if err != nil {
		return nil, fmt.Errorf("load wasm module %s: %w", path, err)
	}
	return m, nil
}

// Load compiles a module and checks it the way Envoy does before starting
// it: an ABI version marker (proxy_abi_version_0_2_1 or _0_2_0), an
// allocator (malloc, else proxy_on_memory_allocate), an exported memory, and
// the signature of every proxy-wasm export it has.
func Load(ctx context.Context, wasm []byte, o ModuleOptions) (*Module, error) {
	cache := o.Cache
	if cache == nil {
		cache = sharedCache
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		WithCloseOnContextDone(false))
	m := &Module{rt: rt, poll: o.Poll, exports: map[string]bool{}}
	ok := false
	defer func() {
		if !ok {
			rt.Close(ctx)
		}
	}()
	compiled, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	m.compiled = compiled
	if err := m.checkExports(); err != nil {
		return nil, err
	}
	if err := m.checkImports(); err != nil {
		return nil, err
	}
	if err := registerHostModules(ctx, rt, o.Poll); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// Close releases the module and every VM made from it.
func (m *Module) Close(ctx context.Context) error { return m.rt.Close(ctx) }

// ABIVersion returns the ABI marker the module exports.
func (m *Module) ABIVersion() string { return m.abi }

// exportSignatures are the proxy-wasm (and WASI reactor) exports Envoy looks
// up, with the signature it requires: params then results, i for i32.
var exportSignatures = map[string]string{
	"_initialize":                             "->",
	"_start":                                  "->",
	"main":                                    "ii->i",
	"__main_void":                             "->i",
	"malloc":                                  "i->i",
	"proxy_on_memory_allocate":                "i->i",
	"proxy_on_context_create":                 "ii->",
	"proxy_on_vm_start":                       "ii->i",
	"proxy_validate_configuration":            "ii->i",
	"proxy_on_configure":                      "ii->i",
	"proxy_on_tick":                           "i->",
	"proxy_on_new_connection":                 "i->i",
	"proxy_on_downstream_data":                "iii->i",
	"proxy_on_upstream_data":                  "iii->i",
	"proxy_on_downstream_connection_close":    "ii->",
	"proxy_on_upstream_connection_close":      "ii->",
	"proxy_on_request_headers":                "iii->i",
	"proxy_on_request_body":                   "iii->i",
	"proxy_on_request_trailers":               "ii->i",
	"proxy_on_request_metadata":               "ii->i",
	"proxy_on_response_headers":               "iii->i",
	"proxy_on_response_body":                  "iii->i",
	"proxy_on_response_trailers":              "ii->i",
	"proxy_on_response_metadata":              "ii->i",
	"proxy_on_http_call_response":             "iiiii->",
	"proxy_on_grpc_receive":                   "iii->",
	"proxy_on_grpc_close":                     "iii->",
	"proxy_on_grpc_receive_initial_metadata":  "iii->",
	"proxy_on_grpc_receive_trailing_metadata": "iii->",
	"proxy_on_queue_ready":                    "ii->",
	"proxy_on_foreign_function":               "iii->",
	"proxy_on_done":                           "i->i",
	"proxy_on_log":                            "i->",
	"proxy_on_delete":                         "i->",
}

func signature(f api.FunctionDefinition) string {
	var b strings.Builder
	for _, t := range f.ParamTypes() {
		b.WriteString(typeLetter(t))
	}
	b.WriteString("->")
	for _, t := range f.ResultTypes() {
		b.WriteString(typeLetter(t))
	}
	return b.String()
}

func typeLetter(t api.ValueType) string {
	switch t {
	case api.ValueTypeI32:
		return "i"
	case api.ValueTypeI64:
		return "I"
	case api.ValueTypeF32:
		return "f"
	case api.ValueTypeF64:
		return "F"
	}
	return "?"
}

func (m *Module) checkExports() error {
	fns := m.compiled.ExportedFunctions()
	for name := range fns {
		m.exports[name] = true
	}
	switch {
	case m.exports["proxy_abi_version_0_2_1"]:
		m.abi = "proxy_abi_version_0_2_1"
	case m.exports["proxy_abi_version_0_2_0"]:
		m.abi = "proxy_abi_version_0_2_0"
	default:
		return ErrNoABIVersion
	}
	names := make([]string, 0, len(fns))
	for name := range fns {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		want, known := exportSignatures[name]
		if !known {
			continue
		}
		if got := signature(fns[name]); got != want {
			return fmt.Errorf("bad function signature for export %s: want %s, got %s", name, want, got)
		}
	}
	switch {
	case m.exports["malloc"]:
		m.alloc = "malloc"
	case m.exports["proxy_on_memory_allocate"]:
		m.alloc = "proxy_on_memory_allocate"
	default:
		return ErrNoMalloc
	}
	if _, ok := m.compiled.ExportedMemories()["memory"]; !ok {
		return errors.New("wasm module exports no memory named \"memory\"")
	}
	if !m.exports["_initialize"] && !m.exports["_start"] {
		// Envoy accepts a module with neither; nothing runs before
		// on_context_create then. Nothing to check.
		return nil
	}
	return nil
}

// checkImports reports, by name, an import this host (as the Envoy
// generation it plays) does not provide, as Envoy's link step would.
func (m *Module) checkImports() error {
	provided := hostFunctionNames(m.poll)
	for _, f := range m.compiled.ImportedFunctions() {
		mod, name, _ := f.Import()
		if !provided[mod+"."+name] {
			return fmt.Errorf("wasm module imports %s.%s, which this host (poll_oneoff mode %s) does not provide", mod, name, m.poll)
		}
	}
	return nil
}
