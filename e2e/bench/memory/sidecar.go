package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// processSample is a process's memory after a number of checks.
type processSample struct {
	Checks   int
	RSS      int64 // bytes, VmRSS
	HeapUsed int64 // bytes, the Go heap in use (go_memstats_heap_inuse_bytes), 0 if unknown
}

// sidecarResult is what a run of the sidecar over distinct keys saw.
type sidecarResult struct {
	Samples  []processSample
	Statuses map[int]int
	Elapsed  time.Duration
}

// runningSidecar is build/sidecar on a Redis of its own.
type runningSidecar struct {
	redis *redisproc.Server
	proc  *harness.Process
	addr  string
}

// startSidecar starts a Redis and the sidecar with plans on it.
func startSidecar(ctx context.Context, bins harness.Binaries, dir, plans string) (*runningSidecar, error) {
	r, err := redisproc.Start(ctx, redisproc.Options{Dir: filepath.Join(dir, "redis")})
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(path, []byte(plans), 0o600); err != nil {
		r.Stop()
		return nil, err
	}
	// A generous Redis deadline: this measures memory, and a check that
	// times out is not a check of a new key.
	p, addr, err := harness.StartSidecar(ctx, bins, harness.SidecarConfig{Redis: r.URL(), Plans: path,
		Extra: []string{"-redis-timeout", "1s"}})
	if err != nil {
		r.Stop()
		return nil, err
	}
	return &runningSidecar{redis: r, proc: p, addr: addr}, nil
}

func (s *runningSidecar) stop() {
	s.proc.Stop(10 * time.Second)
	s.redis.Stop()
}

// sample reads the sidecar's RSS and Go heap.
func (s *runningSidecar) sample(checks int) (processSample, error) {
	rss, err := s.proc.RSS()
	if err != nil {
		return processSample{}, err
	}
	ps := processSample{Checks: checks, RSS: rss}
	m, err := testkit.GetMetrics("http://" + s.addr + "/metrics")
	if err != nil {
		return ps, err
	}
	ps.HeapUsed = int64(m["go_memstats_heap_inuse_bytes"])
	return ps, nil
}

// checkKeys sends one check for each of keys distinct API keys
// (prefix + number, from first), from workers concurrent clients, calling
// every after each batch of that many checks.
func checkKeys(addr, prefix string, first, keys, workers, batch int, every func(done int) error) (map[int]int, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var mu sync.Mutex
	statuses := map[int]int{}
	for done := 0; done < keys; {
		n := min(batch, keys-done)
		var next atomic.Int64
		var wg sync.WaitGroup
		var firstErr atomic.Value
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				local := map[int]int{}
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						break
					}
					req, _ := http.NewRequest("POST", "http://"+addr+"/v1/check", nil)
					req.Header.Set("x-api-key", prefix+strconv.Itoa(first+done+i))
					resp, err := client.Do(req)
					if err != nil {
						firstErr.CompareAndSwap(nil, err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					local[resp.StatusCode]++
				}
				mu.Lock()
				for k, v := range local {
					statuses[k] += v
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		if err, _ := firstErr.Load().(error); err != nil {
			return statuses, err
		}
		done += n
		if err := every(done); err != nil {
			return statuses, err
		}
	}
	return statuses, nil
}

// soakSidecar sends checks for keys distinct API keys through the sidecar
// and samples its memory every sampleEvery checks. The plan refills a
// bucket in 0.1 s, so Redis lets each key go about a second after its
// check and holds only the recent ones: the run measures the sidecar, not
// Redis.
func soakSidecar(ctx context.Context, bins harness.Binaries, dir string, keys, sampleEvery, workers int) (*sidecarResult, error) {
	sc, err := startSidecar(ctx, bins, dir, "default_plan: free\nplans:\n  free: {capacity: 10, rate: 100}\n")
	if err != nil {
		return nil, err
	}
	defer sc.stop()
	res := &sidecarResult{}
	s0, err := sc.sample(0)
	if err != nil {
		return nil, err
	}
	res.Samples = append(res.Samples, s0)
	start := time.Now()
	res.Statuses, err = checkKeys(sc.addr, "memory-key-", 0, keys, workers, sampleEvery, func(done int) error {
		s, err := sc.sample(done)
		res.Samples = append(res.Samples, s)
		return err
	})
	res.Elapsed = time.Since(start)
	return res, err
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
