// Command sidecarburst measures the sidecar alone, as a burst of the
// filter's callouts meets it: every -every, -senders checks written at the
// same moment on keep-alive connections of their own (raw HTTP/1.1, so
// that the client costs little), each for a new client of an unlimited
// plan, against a real Redis. It prints, over the bursts, the latency of
// every check from its write to its answer, of the first and the last
// answer of each burst, and how many were answered 503 (the sidecar's
// -redis-timeout passed before Redis answered).
//
// The first answer of a burst shows what a check costs a stack that was
// idle: on a virtual machine whose idle CPUs halt, each hop (the client to
// the sidecar, the sidecar to Redis and back, the answer) wakes a process
// on a halted CPU. The last shows what the burst's queue adds.
//
//	go run ./e2e/bench/sidecarburst [-senders 30] [-every 60ms] [-bursts 60] [-- sidecar flags]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
)

func main() {
	bin := flag.String("bin", "build", "directory with the sidecar (built there if missing)")
	senders := flag.Int("senders", 30, "checks written together in each burst, one per connection")
	every := flag.Duration("every", 60*time.Millisecond, "time between bursts: the stack idles between them")
	bursts := flag.Int("bursts", 60, "bursts measured, after as many again to warm up")
	flag.Parse()
	if err := run(*bin, *senders, *every, *bursts, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "sidecarburst:", err)
		os.Exit(1)
	}
}

func run(binDir string, senders int, every time.Duration, bursts int, sidecarArgs []string) error {
	if senders < 1 || bursts < 1 || every <= 0 {
		return fmt.Errorf("-senders, -bursts and -every must be positive")
	}
	ctx := context.Background()
	b, err := harness.Locate(ctx, binDir)
	if err != nil {
		return err
	}
	backend, err := rig.StartBackend(ctx, b, rig.OpenPlans, sidecarArgs...)
	if err != nil {
		return err
	}
	defer backend.Close()
	conns := make([]*client, senders)
	for i := range conns {
		c, err := net.Dial("tcp", backend.SidecarAddr)
		if err != nil {
			return err
		}
		defer c.Close()
		conns[i] = &client{c: c, r: bufio.NewReader(c)}
	}
	var all, first, last []time.Duration
	unavailable, other := 0, 0
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := -bursts; n < bursts; n++ { // the first half warms up
		<-tick.C
		lat, codes, err := burst(conns, n)
		if err != nil {
			return err
		}
		if n < 0 {
			continue
		}
		lo, hi := lat[0], lat[0]
		for i, d := range lat {
			lo, hi = min(lo, d), max(hi, d)
			switch codes[i] {
			case http.StatusOK:
				all = append(all, d)
			case http.StatusServiceUnavailable:
				unavailable++
			default:
				other++
			}
		}
		first, last = append(first, lo), append(last, hi)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	p := func(ds []time.Duration, q float64) string { return ms(stat.Percentile(ds, q)) }
	fmt.Printf("sidecar %s %v on redis-server %s: %d bursts of %d checks every %v\n", b.Sidecar, sidecarArgs, backend.Redis.URL(), bursts, senders, every)
	fmt.Printf("answered 200: %d, p50 %s ms, p90 %s ms, p99 %s ms; 503 (no decision by -redis-timeout): %d; other: %d\n",
		len(all), p(all, 50), p(all, 90), p(all, 99), unavailable, other)
	fmt.Printf("first answer of a burst: p50 %s ms, p90 %s ms; last answer: p50 %s ms, p90 %s ms\n",
		p(first, 50), p(first, 90), p(last, 50), p(last, 90))
	return nil
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

// burst writes one check on every connection at once and returns each
// one's latency and status.
func burst(conns []*client, n int) ([]time.Duration, []int, error) {
	lat, codes, errs := make([]time.Duration, len(conns)), make([]int, len(conns)), make([]error, len(conns))
	reqs := make([][]byte, len(conns))
	for i := range conns {
		reqs[i] = fmt.Appendf(nil, "POST /v1/check HTTP/1.1\r\nHost: sidecar\r\nx-api-key: burst-%d-%d\r\nContent-Length: 0\r\n\r\n", n, i)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			if _, err := c.c.Write(reqs[i]); err != nil {
				errs[i] = err
				return
			}
			resp, err := http.ReadResponse(c.r, nil)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			lat[i], codes[i] = time.Since(t0), resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, nil, err
		}
	}
	return lat, codes, nil
}
