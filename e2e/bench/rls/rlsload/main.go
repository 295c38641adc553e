// Command rlsload loads envoyproxy/ratelimit's gRPC service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) as fast as
// it answers, for sidecarbench: the counterpart of wrk for the sidecar.
//
//	rlsload -addr 127.0.0.1:8081 [-c 50] [-conns 2] [-keys 10000] [-d 3s] [-domain bench] [-key client]
//
// -c requests are in flight at all times, spread over -conns HTTP/2
// connections (Envoy keeps one to the rate limit service per worker
// thread and multiplexes its calls on it). Each request carries one
// descriptor, key=value with the value one of -keys distinct client names
// (bench-key-000000 ...), picked at random per request. At the end it prints
// one line:
//
//	RLSLOAD <decided> <not decided> <elapsed µs> <p50 µs> <p99 µs> <p99.9 µs>
//
// decided: answers OK or OVER_LIMIT; not decided: any other code or a gRPC
// error (the first is printed as "RLSLOAD first error: ..." on stderr).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "the rate limit service's gRPC address")
	concurrency := flag.Int("c", 50, "requests in flight")
	conns := flag.Int("conns", 2, "HTTP/2 connections the requests are spread over")
	nkeys := flag.Int("keys", 10000, "distinct descriptor values")
	d := flag.Duration("d", 3*time.Second, "how long to load")
	domain := flag.String("domain", "bench", "rate limit domain")
	key := flag.String("key", "client", "descriptor key")
	flag.Parse()
	if *concurrency < 1 || *conns < 1 || *nkeys < 1 {
		fmt.Fprintln(os.Stderr, "rlsload: -c, -conns and -keys must be >= 1")
		os.Exit(2)
	}
	if err := run(*addr, *concurrency, *conns, *nkeys, *d, *domain, *key); err != nil {
		fmt.Fprintln(os.Stderr, "rlsload:", err)
		os.Exit(1)
	}
}

func run(addr string, concurrency, nconns, nkeys int, d time.Duration, domain, key string) error {
	clients := make([]rlspb.RateLimitServiceClient, nconns)
	for i := range clients {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		cc.Connect()
		clients[i] = rlspb.NewRateLimitServiceClient(cc)
	}
	// Requests are built once: per request only the pick differs.
	reqs := make([]*rlspb.RateLimitRequest, nkeys)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{
			Domain: domain,
			Descriptors: []*rlcommon.RateLimitDescriptor{{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: fmt.Sprintf("bench-key-%06d", i)}},
			}},
			HitsAddend: 1,
		}
	}
	var (
		wg       sync.WaitGroup
		errs     atomic.Int64
		firstErr atomic.Value
		lat      = make([][]time.Duration, concurrency)
	)
	ctx := context.Background()
	start := time.Now()
	end := start.Add(d)
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			c := clients[w%len(clients)]
			samples := make([]time.Duration, 0, 1<<16)
			for {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				resp, err := c.ShouldRateLimit(ctx, reqs[rng.IntN(len(reqs))])
				samples = append(samples, time.Since(t0))
				if err == nil && resp.GetOverallCode() != rlspb.RateLimitResponse_OK && resp.GetOverallCode() != rlspb.RateLimitResponse_OVER_LIMIT {
					err = fmt.Errorf("overall code %v", resp.GetOverallCode())
				}
				if err != nil && errs.Add(1) == 1 {
					firstErr.Store(err.Error())
				}
			}
			lat[w] = samples
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, s := range lat {
		all = append(all, s...)
	}
	if len(all) == 0 {
		return fmt.Errorf("no request completed in %v", d)
	}
	slices.Sort(all)
	pct := func(p float64) int64 { return all[min(len(all)-1, int(p*float64(len(all))))].Microseconds() }
	if v, ok := firstErr.Load().(string); ok {
		fmt.Fprintln(os.Stderr, "RLSLOAD first error:", v)
	}
	fmt.Printf("RLSLOAD %d %d %d %d %d %d\n", int64(len(all))-errs.Load(), errs.Load(), elapsed.Microseconds(), pct(0.50), pct(0.99), pct(0.999))
	return nil
}
