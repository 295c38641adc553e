package filterwasm

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/edgelimit/edgelimit/e2e/filterwasm/wasmcost"
)

// BenchmarkGoInWasm times a few of the Go runtime's common operations (package
// wasmcost) inside wazero, exported by a module built like the filter, and
// natively, side by side: wasm/<op> against native/<op>. It is why the
// filter's hot path avoids maps and allocation (filter/RATIONALE.md, "Why
// the stream tables are not maps"), and what bounds the filter's cost in
// wasm against its native path.
func BenchmarkGoInWasm(b *testing.B) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		b.Fatal(err)
	}
	path, err := build(root, filepath.Join(b.TempDir(), "wasmcost.wasm"), "./e2e/filterwasm/testdata/wasmcost")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCloseOnContextDone(false))
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	// env.noop answers as wasmcost.Host does natively.
	if _, err := rt.NewHostModuleBuilder("env").NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, s []uint64) { s[0] = uint64(uint32(s[0]) + 1) }),
			[]api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).
		Export("noop").Instantiate(ctx); err != nil {
		b.Fatal(err)
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		b.Fatal(err)
	}
	ops := []struct {
		export string
		native func(uint32) uint32
	}{
		{"empty", wasmcost.Empty}, {"map_get", wasmcost.MapGet}, {"map_int", wasmcost.MapInt},
		{"map_ptr", wasmcost.MapPtr}, {"alloc", wasmcost.Alloc}, {"loop", wasmcost.Loop},
		{"host_calls", wasmcost.HostCalls},
	}
	for _, op := range ops {
		f := mod.ExportedFunction(op.export)
		if f == nil {
			b.Fatalf("the module has no export %s", op.export)
		}
		stack := make([]uint64, 1)
		b.Run("wasm/"+op.export, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				stack[0] = uint64(i & 1023)
				if err := f.CallWithStack(ctx, stack); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("native/"+op.export, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				op.native(uint32(i & 1023))
			}
		})
	}
}
