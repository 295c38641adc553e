// Command cluster measures the sidecar on Redis Cluster against one Redis in
// the same run, and a hot client's throughput with and without its bucket
// split by region.
//
//	go run ./e2e/bench/cluster [-duration 5s] [-workers 64]
//
// It starts one redis-server, a 3-master Redis Cluster, and in-process
// sidecars on each, then drives closed-loop checks (each worker sends its
// next check when the last is answered) and prints checks/s. Every Redis is
// on this machine, so the numbers compare set-ups, not a deployment.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/sidecar/app"
	"github.com/edgelimit/edgelimit/sidecar/redisconn"
)

const plansYAML = `
default_plan: big
plans:
  big: {capacity: 1000000000, rate: 1000000000}
  hot: {capacity: 1000, rate: 1000}
clients:
  "hot-client": {plan: hot, regions: [eu, us, ap]}
`

func main() {
	duration := flag.Duration("duration", 5*time.Second, "how long each measurement runs")
	workers := flag.Int("workers", 64, "concurrent closed-loop clients")
	flag.Parse()
	if err := run(*duration, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "cluster bench:", err)
		os.Exit(1)
	}
}

func run(d time.Duration, workers int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "cluster-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	plans := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(plans, []byte(plansYAML), 0o600); err != nil {
		return err
	}
	single, err := redisproc.Start(ctx, redisproc.Options{})
	if err != nil {
		return err
	}
	defer single.Stop()
	cl, err := redisproc.StartCluster(ctx, 3, 0)
	if err != nil {
		return err
	}
	defer cl.Stop()
	clusterURL := "redis+cluster://" + strings.Join(cl.Addrs, ",")

	fmt.Printf("%-44s %12s %10s\n", "set-up", "checks/s", "allowed")
	type row struct {
		name, url string
		noShard   bool
		key       func(w, i int) string
	}
	many := func(w, i int) string { return "client-" + strconv.Itoa((w*7919+i)%10000) }
	hot := func(int, int) string { return "hot-client" }
	for _, r := range []row{
		{"one redis, 10k clients", single.URL(), false, many},
		{"cluster (3 masters), 10k clients", clusterURL, false, many},
		{"cluster, hot client, one bucket", clusterURL, true, hot},
		{"cluster, hot client, split by region", clusterURL, false, hot},
	} {
		rate, allowed, err := measure(r.url, plans, r.noShard, d, workers, r.key)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		fmt.Printf("%-44s %12.0f %10.0f\n", r.name, rate, allowed)
	}
	return nil
}

// measure runs one sidecar on url and returns checks/s and allowed checks/s.
func measure(url, plans string, noShard bool, d time.Duration, workers int, key func(w, i int) string) (float64, float64, error) {
	spec, err := redisconn.Parse(url)
	if err != nil {
		return 0, 0, err
	}
	a, err := app.Start(app.Config{
		Listen: "127.0.0.1:0", Redis: spec, PlansPath: plans,
		RedisTimeout: 100 * time.Millisecond, NoHotSharding: noShard,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return 0, 0, err
	}
	defer a.Shutdown(context.Background())
	client := &fasthttp.Client{MaxConnsPerHost: workers}
	regions := []string{"eu", "us", "ap", "eu", "eu", "eu", "eu", "us", "eu", "ap"} // 70/20/10
	var done, allowed, failed atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for i := 0; time.Now().Before(stop); i++ {
				req.Reset()
				req.SetRequestURI("http://" + a.Addr() + "/v1/check")
				req.Header.SetMethod("POST")
				req.Header.Set("x-api-key", key(w, i))
				req.Header.Set("x-ratelimit-region", regions[(w+i)%len(regions)])
				if err := client.DoTimeout(req, resp, 5*time.Second); err != nil {
					failed.Add(1)
					continue
				}
				switch resp.StatusCode() {
				case 200:
					allowed.Add(1)
					done.Add(1)
				case 429:
					done.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > done.Load()/100 {
		return 0, 0, fmt.Errorf("%d of %d checks failed", n, n+done.Load())
	}
	secs := d.Seconds()
	return float64(done.Load()) / secs, float64(allowed.Load()) / secs, nil
}
