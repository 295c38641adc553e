package filterwasm

import (
	"context"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/filtertest"
)

// BenchmarkFilterRequest is one allowed request through filter.wasm in the
// headless host: stream creation, request headers, the sidecar callout
// answered at once with the sidecar's own 200 (filtertest.SidecarAnswer, a
// bucket half full), response headers and the end of the stream. It measures
// the filter plus the host, without any network. wasm-mem-growth-B is how
// much the module's linear memory grew over the timed requests: the filter
// allocates nothing per request, so it stays 0 however many run (a filter
// that allocated would grow the Go heap, and with it the memory, until the
// collector caught up).
func BenchmarkFilterRequest(b *testing.B) {
	benchmarkFilter(b, answeringSidecar{filtertest.SidecarAnswer("free", 100, 10, 50.5, 1)}, wasmhost.Continued)
}

// BenchmarkFilterDenied is one request the sidecar denies: stream
// creation, request headers, the callout answered at once with the
// sidecar's own 429 (filtertest.SidecarAnswer), the filter's local reply and
// its response headers, the end of the stream. Every key is new to the
// deny cache, so each request makes its callout (64 keys, each denied
// for less time than the 64 requests take to come round again would
// leave cached: the plan refills a token every 10 ms; the cached path is
// BenchmarkCachedDenyPath's).
func BenchmarkFilterDenied(b *testing.B) {
	benchmarkFilter(b, answeringSidecar{filtertest.SidecarAnswer("free", 10, 100, 0, 1)}, wasmhost.Replied)
}

func benchmarkFilter(b *testing.B, sidecar wasmhost.Dispatcher, want wasmhost.State) {
	mod := filterModule(b)
	vm, err := mod.NewVM(context.Background(), wasmhost.Options{Dispatcher: sidecar, VMID: "bench",
		SharedData: wasmhost.NewSharedData(), Log: func(wasmhost.LogLevel, string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer vm.Close()
	// Not the shipped 5 ms: the sidecar answers inline, before any timer
	// could fire, and a longer timeout keeps a stalled machine from timing
	// a callout out mid-run, which would time the fail-open path instead.
	if err := vm.Configure(`{"timeout_ms": 1000}`); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	// Each request is driven as build/gateway drives one: the request
	// headers, the response headers and the end of the stream run on the
	// benchmark's goroutine, the VM being idle then. The callout's answer,
	// given inside the request headers' call, is queued and run by the
	// same goroutine once that call returns (the VM's runner goes on to
	// what queued meanwhile), so no goroutine is woken; in the gateway the
	// answer comes later from the connection's reader, which runs it and
	// wakes the handler, one handoff this benchmark does not time.
	request := func(i int) {
		s := vm.OpenStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:1", DestinationAddr: "127.0.0.1:2"})
		st, err := s.RequestHeadersWait(ctx, []wasmhost.Header{{":method", "GET"}, {":path", "/orders/1"},
			{":authority", "shop"}, {"x-api-key", keys[i%len(keys)]}}, true)
		if err != nil || st != want {
			b.Fatalf("request %d: %v (%v), want %v", i, st, err, want)
		}
		if want == wasmhost.Continued {
			if _, _, err := s.ResponseHeadersWait(ctx, []wasmhost.Header{{":status", "200"}}, false); err != nil {
				b.Fatal(err)
			}
		}
		s.DoneAsync()
	}
	for i := range 100 {
		request(i) // warm: the streams and scratch buffers the filter reuses
	}
	mem := vm.MemoryBytes()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		request(i)
	}
	b.StopTimer()
	b.ReportMetric(float64(vm.MemoryBytes()-mem), "wasm-mem-growth-B")
}

// answeringSidecar answers every check at once with its answer.
type answeringSidecar struct{ answer []filtertest.Header }

func (answeringSidecar) Cluster(string) bool { return true }

func (d answeringSidecar) Dispatch(_ context.Context, _ wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	respond(wasmhost.CalloutResponse{Headers: d.answer})
	return nil
}
