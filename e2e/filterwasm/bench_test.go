package filterwasm

import (
	"context"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/e2e/wasmhost"
)

// BenchmarkFilterRequest is one allowed request through filter.wasm in the
// headless host: stream creation, request headers, the sidecar callout
// answered at once, response headers and the end of the stream. It measures
// the filter plus the host, without any network. wasm-mem-growth-B is how
// much the module's linear memory grew over the timed requests: the filter
// allocates nothing per request, so it stays 0 however many run (a filter
// that allocated would grow the Go heap, and with it the memory, until the
// collector caught up).
func BenchmarkFilterRequest(b *testing.B) {
	mod := filterModule(b)
	vm, err := mod.NewVM(context.Background(), wasmhost.Options{Dispatcher: instantSidecar{}, VMID: "bench",
		SharedData: wasmhost.NewSharedData(), Log: func(wasmhost.LogLevel, string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer vm.Close()
	if err := vm.Configure(`{"timeout_ms": 1000}`); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	request := func(i int) {
		s, err := vm.NewStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:1", DestinationAddr: "127.0.0.1:2"})
		if err != nil {
			b.Fatal(err)
		}
		s.RequestHeaders([]wasmhost.Header{{":method", "GET"}, {":path", "/orders/1"}, {":authority", "shop"},
			{"x-api-key", keys[i%len(keys)]}}, true)
		if st, _ := s.Wait(ctx); st != wasmhost.Continued {
			b.Fatalf("request %d: %v", i, st)
		}
		s.ResponseHeaders([]wasmhost.Header{{":status", "200"}}, false)
		s.Done()
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

// instantSidecar answers every check "allowed" at once.
type instantSidecar struct{}

func (instantSidecar) Cluster(string) bool { return true }

func (instantSidecar) Dispatch(_ context.Context, _ wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	respond(wasmhost.CalloutResponse{Headers: []wasmhost.Header{{":status", "200"}, {"ratelimit-limit", "100"},
		{"ratelimit-remaining", "99"}, {"ratelimit-reset", "1"}, {"x-ratelimit-plan", "free"}, {"x-ratelimit-tokens", "99.5"}}})
	return nil
}
