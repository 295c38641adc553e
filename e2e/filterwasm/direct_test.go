package filterwasm

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/filtertest"
)

var (
	directWasm  = flag.String("direct.wasm", "", "the module BenchmarkFilterDirect runs (default: ./filter built for the run)")
	directCache = flag.String("direct.cache", "", "a directory for BenchmarkFilterDirect's compiled code (wazero's file cache), so that a run under valgrind skips compiling the module")
)

// BenchmarkFilterDirect is BenchmarkFilterRequest's allowed request without
// the headless host: a minimal host, written for this benchmark, calls the
// module's exports one after another on the benchmark's goroutine, and its
// env.proxy_* functions do no more than the filter's allowed path needs. So it measures what an independent host measures,
// the module's own code and its host calls, and reports how many of each
// the request makes (exports/op counts proxy_on_memory_allocate too).
//
// Its instructions are deterministic, which timing on a shared machine is
// not; filter/RATIONALE.md, "What a request costs inside wasm", counts them
// with valgrind:
//
//	make build/filter.wasm && CGO_ENABLED=0 go test -c -o /tmp/fw.test ./e2e/filterwasm
//	flags="-test.run XXX -test.bench FilterDirect -direct.wasm $PWD/build/filter.wasm -direct.cache /tmp/fwcache"
//	/tmp/fw.test $flags -test.benchtime 10x
//	GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind --smc-check=all /tmp/fw.test $flags -test.benchtime 1000x
//	callgrind_annotate --threshold=100 --auto=no callgrind.out.<pid> | grep '???:' | awk '{gsub(",", "", $1); s += $1} END {print s}'
//
// and the last two again with 5000x. The module's compiled code has no
// symbols, so callgrind_annotate lists it as ???, a line for each address
// it entered at; the difference of the two runs' sums, over 4000, is its
// instructions per request. Where the CPU has RDTSCP, the runtime reads
// its clock with it, which valgrind 3.19 cannot decode (SIGILL), hence
// cpu.rdtscp=off. The cache spares valgrind the compilation, the prebuilt
// module a go build, whose exit signal callgrind (3.19) can trip over, as
// it can over the runtime's preemption signals; with more than one
// GOMAXPROCS the goroutine moves between threads and callgrind credits
// some of the module's instructions to the host's functions, a different
// share in each run.
func BenchmarkFilterDirect(b *testing.B) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		b.Fatal(err)
	}
	path := *directWasm
	if path == "" {
		if path, err = Build(root, b.TempDir()); err != nil {
			b.Fatal(err)
		}
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	rc := wazero.NewRuntimeConfig()
	if *directCache != "" {
		cache, err := wazero.NewCompilationCacheWithDir(*directCache)
		if err != nil {
			b.Fatal(err)
		}
		rc = rc.WithCompilationCache(cache)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	h := &directHost{}
	if err := h.instantiate(ctx, rt); err != nil {
		b.Fatal(err)
	}
	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		b.Fatal(err)
	}
	h.mem, h.alloc = mod.Memory(), mod.ExportedFunction("proxy_on_memory_allocate")
	h.now = uint64(Start.UnixNano())
	stack := make([]uint64, 5)
	export := func(name string) func(args ...uint64) uint64 {
		f := mod.ExportedFunction(name)
		if f == nil {
			b.Fatalf("the module has no export %s", name)
		}
		return func(args ...uint64) uint64 {
			h.exports++
			copy(stack, args)
			if err := f.CallWithStack(ctx, stack); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			return stack[0]
		}
	}
	create, vmStart, configure := export("proxy_on_context_create"), export("proxy_on_vm_start"), export("proxy_on_configure")
	reqHeaders, callResponse := export("proxy_on_request_headers"), export("proxy_on_http_call_response")
	respHeaders, del := export("proxy_on_response_headers"), export("proxy_on_delete")

	// The filter's defaults, the shipped 5 ms callout timeout among them:
	// this host has no timer, so no callout times out whatever the value.
	h.config = []byte(`{}`)
	create(1, 0)
	vmStart(1, 0)
	if configure(1, uint64(len(h.config))) != 1 {
		b.Fatal("proxy_on_configure refused the configuration")
	}
	h.answer = filtertest.SidecarAnswer("free", 100, 10, 50.5, 1)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	id := uint64(1)
	request := func(i int) {
		id++
		h.request = append(h.request[:0], [2]string{":method", "GET"}, [2]string{":path", "/orders/1"},
			[2]string{":authority", "shop"}, [2]string{"x-api-key", keys[i%len(keys)]})
		create(id, 1)
		if reqHeaders(id, uint64(len(h.request)), 1) != 1 {
			b.Fatalf("request %d was not paused for its callout", i)
		}
		callResponse(1, uint64(h.token), uint64(len(h.answer)), 0, 0)
		if !h.continued {
			b.Fatalf("request %d was not resumed", i)
		}
		h.continued = false
		h.response = append(h.response[:0], [2]string{":status", "200"})
		respHeaders(id, uint64(len(h.response)), 0)
		if len(h.response) != 6 {
			b.Fatalf("request %d: response headers %q, want the rate-limit headers", i, h.response)
		}
		del(id)
	}
	for i := range 100 {
		request(i) // warm: the streams and scratch buffers the filter reuses
	}
	h.exports, h.calls = 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		request(i)
	}
	b.StopTimer()
	b.ReportMetric(float64(h.exports)/float64(b.N), "exports/op")
	b.ReportMetric(float64(h.calls)/float64(b.N), "host-calls/op")
}

// directHost is BenchmarkFilterDirect's proxy: one VM, one stream at a time,
// a sidecar that answers every callout with answer.
type directHost struct {
	mem      api.Memory
	alloc    api.Function
	stack    [1]uint64
	config   []byte
	request  [][2]string
	response [][2]string
	answer   [][2]string
	shared   map[string]directShared
	token    uint32
	now      uint64

	continued      bool
	exports, calls int
}

type directShared struct {
	value []byte
	cas   uint32
}

func (h *directHost) instantiate(ctx context.Context, rt wazero.Runtime) error {
	h.shared = map[string]directShared{}
	env := rt.NewHostModuleBuilder("env")
	fn := func(name string, params []api.ValueType, f func(s []uint64) abi.Status) {
		env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, s []uint64) {
			h.calls++
			s[0] = uint64(f(s))
		}), params, []api.ValueType{api.ValueTypeI32}).Export(name)
	}
	i32 := func(n int) []api.ValueType {
		t := make([]api.ValueType, n)
		for i := range t {
			t[i] = api.ValueTypeI32
		}
		return t
	}
	counter := []api.ValueType{api.ValueTypeI32, api.ValueTypeI64}
	fn("proxy_log", i32(3), func([]uint64) abi.Status { return abi.StatusOK })
	fn("proxy_get_buffer_bytes", i32(5), func(s []uint64) abi.Status {
		if abi.BufferType(s[0]) != abi.BufferPluginConfiguration {
			return abi.StatusNotFound
		}
		return h.out(h.config, s[3], s[4])
	})
	fn("proxy_get_header_map_value", i32(5), func(s []uint64) abi.Status {
		key, ok := h.str(s[1], s[2])
		if m := h.headers(s[0]); ok && m != nil {
			for _, p := range *m {
				if p[0] == key {
					return h.out([]byte(p[1]), s[3], s[4])
				}
			}
		}
		return abi.StatusNotFound
	})
	fn("proxy_get_header_map_pairs", i32(3), func(s []uint64) abi.Status {
		m := h.headers(s[0])
		if m == nil {
			return abi.StatusNotFound
		}
		return h.out(abi.EncodePairs(*m), s[1], s[2])
	})
	edit := func(s []uint64, value bool, f func(m [][2]string, k, v string) [][2]string) abi.Status {
		m := h.headers(s[0])
		k, ok := h.str(s[1], s[2])
		v := ""
		if value {
			v, ok = h.str(s[3], s[4])
		}
		if m == nil || !ok {
			return abi.StatusBadArgument
		}
		*m = f(*m, k, v)
		return abi.StatusOK
	}
	fn("proxy_add_header_map_value", i32(5), func(s []uint64) abi.Status {
		return edit(s, true, func(m [][2]string, k, v string) [][2]string { return append(m, [2]string{k, v}) })
	})
	fn("proxy_replace_header_map_value", i32(5), func(s []uint64) abi.Status {
		return edit(s, true, func(m [][2]string, k, v string) [][2]string { return append(without(m, k), [2]string{k, v}) })
	})
	fn("proxy_remove_header_map_value", i32(3), func(s []uint64) abi.Status {
		return edit(s, false, func(m [][2]string, k, _ string) [][2]string { return without(m, k) })
	})
	fn("proxy_send_local_response", i32(8), func([]uint64) abi.Status { return abi.StatusOK })
	fn("proxy_http_call", i32(10), func(s []uint64) abi.Status {
		h.token += 4
		if !h.mem.WriteUint32Le(uint32(s[9]), h.token) {
			return abi.StatusInvalidMemoryAccess
		}
		return abi.StatusOK
	})
	fn("proxy_continue_stream", i32(1), func([]uint64) abi.Status { h.continued = true; return abi.StatusOK })
	fn("proxy_set_effective_context", i32(1), func([]uint64) abi.Status { return abi.StatusOK })
	fn("proxy_get_shared_data", i32(5), func(s []uint64) abi.Status {
		key, ok := h.str(s[0], s[1])
		v, found := h.shared[key]
		if !ok || !found {
			return abi.StatusNotFound
		}
		if st := h.out(v.value, s[2], s[3]); st != abi.StatusOK {
			return st
		}
		h.mem.WriteUint32Le(uint32(s[4]), v.cas)
		return abi.StatusOK
	})
	fn("proxy_set_shared_data", i32(5), func(s []uint64) abi.Status {
		key, ok := h.str(s[0], s[1])
		v, ok2 := h.mem.Read(uint32(s[2]), uint32(s[3]))
		if !ok || !ok2 {
			return abi.StatusInvalidMemoryAccess
		}
		old := h.shared[key]
		if cas := uint32(s[4]); cas != 0 && cas != old.cas {
			return abi.StatusCASMismatch
		}
		h.shared[key] = directShared{append([]byte(nil), v...), old.cas + 1}
		return abi.StatusOK
	})
	fn("proxy_define_metric", i32(4), func(s []uint64) abi.Status {
		h.mem.WriteUint32Le(uint32(s[3]), 1)
		return abi.StatusOK
	})
	fn("proxy_increment_metric", counter, func([]uint64) abi.Status { return abi.StatusOK })
	fn("proxy_record_metric", counter, func([]uint64) abi.Status { return abi.StatusOK })
	fn("proxy_set_tick_period_milliseconds", i32(1), func([]uint64) abi.Status { return abi.StatusOK })
	fn("proxy_get_current_time_nanoseconds", i32(1), func(s []uint64) abi.Status {
		h.now += 1000
		h.mem.WriteUint64Le(uint32(s[0]), h.now)
		return abi.StatusOK
	})
	_, err := env.Instantiate(ctx)
	return err
}

func (h *directHost) headers(t uint64) *[][2]string {
	switch abi.MapType(t) {
	case abi.MapRequestHeaders:
		return &h.request
	case abi.MapResponseHeaders:
		return &h.response
	case abi.MapHTTPCallResponseHeaders:
		return &h.answer
	}
	return nil
}

func (h *directHost) str(p, n uint64) (string, bool) {
	b, ok := h.mem.Read(uint32(p), uint32(n))
	return string(b), ok
}

// out hands b to the module as Envoy does: memory from
// proxy_on_memory_allocate, its address and size written to the two
// output parameters; empty data gets no memory, address 0 and size 0.
func (h *directHost) out(b []byte, ptr, size uint64) abi.Status {
	var at uint32
	if len(b) > 0 {
		h.exports++
		h.stack[0] = uint64(len(b))
		if err := h.alloc.CallWithStack(context.Background(), h.stack[:]); err != nil {
			return abi.StatusInvalidMemoryAccess
		}
		if at = uint32(h.stack[0]); at == 0 || !h.mem.Write(at, b) {
			return abi.StatusInvalidMemoryAccess
		}
	}
	if !h.mem.WriteUint32Le(uint32(ptr), at) || !h.mem.WriteUint32Le(uint32(size), uint32(len(b))) {
		return abi.StatusInvalidMemoryAccess
	}
	return abi.StatusOK
}

func without(m [][2]string, key string) [][2]string {
	out := m[:0]
	for _, p := range m {
		if p[0] != key {
			out = append(out, p)
		}
	}
	return out
}
