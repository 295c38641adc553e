package wasmhost

import (
	"context"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// hostFunc is one host function a module may import.
type hostFunc struct {
	module, name string
	params       []api.ValueType
	results      []api.ValueType
	fn           func(vm *VM, s []uint64)
}

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// ints returns n i32 value types.
func ints(n int) []api.ValueType {
	t := make([]api.ValueType, n)
	for i := range t {
		t[i] = i32
	}
	return t
}

func types(t ...api.ValueType) []api.ValueType { return t }

// hostFunctions returns every function this host provides, as the Envoy
// generation that poll plays.
func hostFunctions(poll PollMode) []hostFunc {
	fs := envFunctions()
	fs = append(fs, wasiFunctions(poll, "wasi_snapshot_preview1")...)
	fs = append(fs, wasiFunctions(poll, "wasi_unstable")...)
	return fs
}

func hostFunctionNames(poll PollMode) map[string]bool {
	names := map[string]bool{}
	for _, f := range hostFunctions(poll) {
		names[f.module+"."+f.name] = true
	}
	return names
}

func registerHostModules(ctx context.Context, rt wazero.Runtime, poll PollMode) error {
	builders := map[string]wazero.HostModuleBuilder{}
	var order []string
	for _, f := range hostFunctions(poll) {
		b, ok := builders[f.module]
		if !ok {
			b = rt.NewHostModuleBuilder(f.module)
			builders[f.module] = b
			order = append(order, f.module)
		}
		b.NewFunctionBuilder().
			WithGoModuleFunction(guard(f), f.params, f.results).
			Export(f.name)
	}
	for _, name := range order {
		if _, err := builders[name].Instantiate(ctx); err != nil {
			return err
		}
	}
	return nil
}

// guard wraps a host function with Envoy's restricted-callback check: while
// the VM initializes or allocates, only the listed calls may run; any other
// traps the module.
func guard(f hostFunc) api.GoModuleFunc {
	full := f.module + "." + f.name
	return func(ctx context.Context, _ api.Module, stack []uint64) {
		vm := ctx.(*vmCtx).vm
		if vm.allowed != nil && !vm.allowed[full] {
			panic(trap{"restricted_callback: " + full})
		}
		f.fn(vm, stack)
	}
}

func set(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// wasiBoth lists a WASI function under both module names Envoy registers.
func wasiBoth(names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, "wasi_unstable."+n, "wasi_snapshot_preview1."+n)
	}
	return out
}

// The calls Envoy allows while a module initializes (_initialize, main) and
// while it allocates, by Envoy generation (proxy-wasm-cpp-host before and
// after its April 2026 WASI update).
var (
	initAllowedCurrent = set(append([]string{"env.emscripten_notify_memory_growth", "env.proxy_log"},
		wasiBoth("fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
			"clock_time_get", "clock_res_get", "random_get", "poll_oneoff", "fd_fdstat_get",
			"fd_fdstat_set_flags", "fd_advise", "fd_allocate", "fd_datasync", "fd_fdstat_set_rights",
			"fd_filestat_get", "fd_filestat_set_size", "fd_filestat_set_times", "fd_pread",
			"fd_prestat_dir_name", "fd_prestat_get", "fd_pwrite", "fd_readdir", "fd_renumber",
			"fd_sync", "fd_tell", "path_create_directory", "path_filestat_get",
			"path_filestat_set_times", "path_link", "path_readlink", "path_remove_directory",
			"path_rename", "path_symlink", "path_unlink_file", "sock_accept", "sock_recv",
			"sock_send", "sock_shutdown")...)...)
	initAllowedLegacy = set(append([]string{"env.emscripten_notify_memory_growth", "env.proxy_log"},
		wasiBoth("fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
			"fd_prestat_get", "fd_prestat_dir_name", "clock_time_get", "random_get",
			"fd_fdstat_get", "fd_fdstat_set_flags")...)...)
	mallocAllowedCurrent = set(append([]string{"env.proxy_log"},
		wasiBoth("fd_write", "clock_time_get", "poll_oneoff")...)...)
	mallocAllowedLegacy = set(append([]string{"env.proxy_log"},
		wasiBoth("fd_write", "clock_time_get")...)...)
)

func initAllowed(p PollMode) map[string]bool {
	if p == PollENOSYS {
		return initAllowedLegacy
	}
	return initAllowedCurrent
}

func mallocAllowed(p PollMode) map[string]bool {
	if p == PollENOSYS {
		return mallocAllowedLegacy
	}
	return mallocAllowedCurrent
}
