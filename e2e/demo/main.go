// Command demo runs the whole limiter on this machine — a real Redis, the
// sidecar, two services and the gateway loading filter.wasm from
// envoy/envoy.yaml — sends a burst from a few clients, one far above its
// plan, and prints what each client saw and what reached each service. It
// stops everything it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
)

const plans = `# The demo's plans: capacity is the burst, rate the sustained tokens/s.
default_plan: free
plans:
  free: {capacity: 10, rate: 2}
  pro:  {capacity: 50, rate: 20}
clients:
  "demo-key-alice": pro
`

// client is one API key of the demo and how hard it pushes.
type client struct {
	key, plan string
	requests  int           // sent in the burst
	spacing   time.Duration // between two requests
	bearer    bool          // send the key as Authorization: Bearer
}

var clients = []client{
	{key: "demo-key-alice", plan: "pro", requests: 40, spacing: 25 * time.Millisecond},
	{key: "demo-key-bob", plan: "free", requests: 8, spacing: 100 * time.Millisecond, bearer: true},
	{key: "demo-key-mallory", plan: "free", requests: 120, spacing: 5 * time.Millisecond},
}

type result struct {
	sent, admitted, denied, other int
	retryMin, retryMax            int
	lastRetry                     int
}

func main() {
	bin := flag.String("bin", "build", "directory with filter.wasm, sidecar and gateway (built there if missing)")
	flag.Parse()
	if err := run(*bin); err != nil {
		if errors.Is(err, context.Canceled) {
			// Stopped by a signal: what it started is stopped, its files
			// removed, and there is no error to report.
			fmt.Fprintln(os.Stderr, "demo: stopped")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(binDir string) (err error) {
	// Ctrl-C, kill, and the terminal closing (SIGHUP, also what an ssh
	// session that drops sends) all stop what the demo started and remove
	// its temporary files; left to SIGHUP's default, the demo died at once
	// and its plans file, Redis's folder and the gateway's bootstrap
	// stayed in TMPDIR.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	step := func(format string, a ...any) { fmt.Printf("• "+format+"\n", a...) }

	b, err := harness.Locate(ctx, binDir)
	if err != nil {
		return err
	}
	backend, err := rig.StartBackend(ctx, b, plans)
	if err != nil {
		return err
	}
	defer backend.Close()
	step("redis-server on %s", backend.Redis.Addr)
	step("sidecar on %s (plans: free 10 burst + 2/s, pro 50 burst + 20/s)", backend.SidecarAddr)

	orders, err := services.Start("127.0.0.1:0", services.Config{Name: "orders", Replicas: 1})
	if err != nil {
		return err
	}
	defer orders.Close()
	billing, err := services.Start("127.0.0.1:0", services.Config{Name: "billing", Replicas: 1})
	if err != nil {
		return err
	}
	defer billing.Close()
	step("services orders on %s, billing on %s", orders.Addr, billing.Addr)

	gw, err := harness.StartGateway(ctx, b, harness.GatewayConfig{
		Config:   filepath.Join(root, "envoy", "envoy.yaml"),
		Clusters: map[string]string{"orders": orders.Addr, "billing": billing.Addr, "ratelimit_sidecar": backend.SidecarAddr},
	})
	if err != nil {
		return err
	}
	defer gw.Stop(5 * time.Second)
	step("gateway on %s running envoy/envoy.yaml with %s (admin %s)", gw.Addr, filepath.Base(b.Filter), gw.Admin)

	step("burst: %s", describe())
	httpc := &http.Client{Timeout: 5 * time.Second}
	results := make([]result, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = burst(ctx, httpc, gw.Addr, c)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tplan\tsent\tadmitted\t429\tRetry-After seen\treached orders\treached billing\t")
	allMatch := true
	for i, c := range clients {
		r := results[i]
		ra := "-"
		if r.denied > 0 {
			ra = fmt.Sprintf("%d s", r.retryMin)
			if r.retryMax != r.retryMin {
				ra = fmt.Sprintf("%d–%d s", r.retryMin, r.retryMax)
			}
		}
		o, bl := orders.Stats().Client(c.key).Received, billing.Stats().Client(c.key).Received
		if int(o+bl) != r.admitted {
			allMatch = false
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t\n", strings.TrimPrefix(c.key, "demo-key-"), c.plan, r.sent, r.admitted, r.denied, ra, o, bl)
	}
	tw.Flush()
	fmt.Println()
	if allMatch {
		fmt.Println("Every admitted request reached a service, and no rejected one did.")
	} else {
		fmt.Println("MISMATCH: the services received a different number of requests than were admitted.")
	}

	// The Retry-After is a promise: wait it out, and the next request passes.
	m := results[2]
	if m.denied > 0 {
		wait := time.Duration(m.lastRetry) * time.Second
		step("mallory waits the last Retry-After (%v) and tries again", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		status, _ := get(httpc, gw.Addr, "/orders/after-wait", clients[2])
		step("after the wait: HTTP %d", status)
	}

	if stats, err := gw.Stats(); err == nil {
		c := func(name string) int64 { return stats["wasmcustom.edgelimit.requests."+name] }
		var failedOpen int64
		for n, v := range stats {
			if strings.HasPrefix(n, "wasmcustom.edgelimit.requests.failed_open.") {
				failedOpen += v
			}
		}
		fmt.Printf("\nThe filter's decisions: %d allowed by the sidecar, %d denied by it, %d denied from the filter's deny cache (no callout), %d failed open.\n",
			c("allowed"), c("denied"), c("denied_cached"), failedOpen)
		if failedOpen > 0 {
			fmt.Println("A request fails open when the sidecar cannot decide it within timeout_ms (5 ms): no answer in time (timeout), or a 503 because Redis did not answer within the sidecar's own deadline (unavailable). It goes on unlimited and is counted by reason below.")
		}
		fmt.Println("\nGateway counters (admin /stats):")
		names := make([]string, 0, len(stats))
		for n, v := range stats {
			if strings.HasPrefix(n, "wasmcustom.") && v != 0 {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Printf("  %s: %d\n", n, stats[n])
		}
	}
	if !allMatch {
		return fmt.Errorf("admitted and received counts differ")
	}
	return nil
}

func describe() string {
	var parts []string
	for _, c := range clients {
		rate := float64(time.Second) / float64(c.spacing)
		parts = append(parts, fmt.Sprintf("%s %d requests at ~%.0f/s", strings.TrimPrefix(c.key, "demo-key-"), c.requests, rate))
	}
	return strings.Join(parts, ", ")
}

func burst(ctx context.Context, httpc *http.Client, addr string, c client) result {
	r := result{retryMin: 1 << 30}
	tick := time.NewTicker(c.spacing)
	defer tick.Stop()
	for i := 0; i < c.requests && ctx.Err() == nil; i++ {
		path := "/orders/" + strconv.Itoa(i)
		if i%2 == 1 {
			path = "/billing/" + strconv.Itoa(i)
		}
		status, retry := get(httpc, addr, path, c)
		r.sent++
		switch status {
		case http.StatusOK:
			r.admitted++
		case http.StatusTooManyRequests:
			r.denied++
			r.lastRetry = retry
			r.retryMin = min(r.retryMin, retry)
			r.retryMax = max(r.retryMax, retry)
		default:
			r.other++
		}
		<-tick.C
	}
	return r
}

func get(httpc *http.Client, addr, path string, c client) (status, retryAfter int) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if c.bearer {
		req.Header.Set("authorization", "Bearer "+c.key)
	} else {
		req.Header.Set("x-api-key", c.key)
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	retryAfter, _ = strconv.Atoi(resp.Header.Get("retry-after"))
	return resp.StatusCode, retryAfter
}
