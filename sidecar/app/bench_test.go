package app

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/redisproc"
)

// BenchmarkCheck measures POST /v1/check end to end on a real Redis, in one
// process (50 HTTP clients, the sidecar and its batching decider), for
// profiles of the sidecar's own work. e2e/bench/sidecarbench measures it as
// separate processes.
func BenchmarkCheck(b *testing.B) {
	srv := redisproc.StartT(b, redisproc.Options{})
	s := startSidecarLog(b, srv.URL(), "default_plan: p\nplans:\n  p: {capacity: 1000000000, rate: 1000000}\n", decidesAnyway, slog.LevelInfo)
	keys := make([][]byte, 10000)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("bench-key-%06d", i))
	}
	hc := &fasthttp.HostClient{Addr: s.Addr(), MaxConns: 64}
	var next, failed atomic.Int64
	b.SetParallelism(25) // 50 clients on 2 CPUs
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + s.Addr() + "/v1/check")
		req.Header.SetMethod("POST")
		for pb.Next() {
			req.Header.SetBytesV("x-api-key", keys[next.Add(1)%int64(len(keys))])
			if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				failed.Add(1)
			}
		}
	})
	if failed.Load() > 0 {
		b.Fatalf("%d checks failed", failed.Load())
	}
}
