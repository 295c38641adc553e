// Command memory measures the limiter's memory over long runs and prints
// what it saw:
//
//	go run ./e2e/bench/memory filter  [-requests 1000000]   filter.wasm's linear memory in the headless host
//	go run ./e2e/bench/memory sidecar [-keys 1000000]       build/sidecar's RSS across distinct API keys
//	go run ./e2e/bench/memory redis   [-clients 100000]     Redis memory while clients are active, then idle
//
// The binaries come from -bin (default $EDGELIMIT_BIN_DIR, else build/),
// built there first if missing. The filter run drives the module directly
// through package wasmhost with a scripted sidecar and a manual clock, so it
// measures the filter alone; the others start real processes on loopback
// ports (Redis from internal/redisproc) and stop them at the end.
//
// TestFilterMemoryFlat runs a short version of the filter soak as a test.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
}

const usage = `usage: memory filter|sidecar|redis [flags]; memory <command> -h lists the flags`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", usage)
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("memory "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	binDir := os.Getenv("EDGELIMIT_BIN_DIR")
	if binDir == "" {
		binDir = "build"
	}
	bin := fs.String("bin", binDir, "folder of filter.wasm, sidecar and gateway (built there if missing)")
	var requests, keys, clients, every, workers *int
	var watch *time.Duration
	var gogc *string
	switch cmd {
	case "filter":
		requests = fs.Int("requests", 1000000, "requests through the filter")
		every = fs.Int("every", 100000, "sample the memory every this many requests")
		gogc = fs.String("gogc", "", "GOGC inside the module (default: the Go default, 100)")
	case "sidecar":
		keys = fs.Int("keys", 1000000, "distinct API keys, one check each")
		every = fs.Int("every", 100000, "sample the memory every this many checks")
		workers = fs.Int("workers", 16, "concurrent clients")
	case "redis":
		clients = fs.Int("clients", 100000, "distinct clients, one check each")
		workers = fs.Int("workers", 16, "concurrent clients")
		watch = fs.Duration("watch", time.Minute, "how long to watch the keys expire")
	default:
		return fmt.Errorf("unknown command %q; %s", cmd, usage)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	if err := os.MkdirAll(*bin, 0o755); err != nil {
		return err
	}
	bins, err := harness.Locate(ctx, *bin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "edgelimit-memory-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	switch cmd {
	case "filter":
		fmt.Fprintf(stdout, "filter.wasm (%s): %d requests through one VM, mix of %d scenarios, GOGC=%q\n",
			bins.Filter, *requests, len(scenarios), *gogc)
		start := time.Now()
		res, err := soakFilter(ctx, bins.Filter, *requests, *every, *gogc)
		if err != nil {
			return err
		}
		reportFilter(stdout, res, time.Since(start))
		if res.Failed != nil {
			return fmt.Errorf("the VM failed: %v", res.Failed)
		}
	case "sidecar":
		fmt.Fprintf(stdout, "sidecar (%s): %d distinct API keys, one check each, %d clients\n", bins.Sidecar, *keys, *workers)
		res, err := soakSidecar(ctx, bins, dir, *keys, *every, *workers)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%10s %12s %14s\n", "checks", "RSS", "Go heap in use")
		for _, s := range res.Samples {
			fmt.Fprintf(stdout, "%10d %12s %14s\n", s.Checks, mib(s.RSS), mib(s.HeapUsed))
		}
		fmt.Fprintf(stdout, "statuses %v in %v (%.0f checks/s)\n", res.Statuses, res.Elapsed.Round(time.Millisecond),
			float64(*keys)/res.Elapsed.Seconds())
	case "redis":
		fmt.Fprintf(stdout, "redis: %d distinct clients checked once each, then idle (bucket TTL 11 s)\n", *clients)
		res, err := soakRedis(ctx, bins, dir, *clients, *workers, *watch)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-22s %10s %12s\n", "", "keys", "used_memory")
		fmt.Fprintf(stdout, "%-22s %10d %12s\n", "before any client", res.Baseline.Keys, mib(res.Baseline.UsedMemory))
		fmt.Fprintf(stdout, "%-22s %10d %12s\n", "all clients active", res.Active.Keys, mib(res.Active.UsedMemory))
		for _, s := range res.Samples {
			fmt.Fprintf(stdout, "%-22s %10d %12s\n", fmt.Sprintf("idle for %.2fs", s.At.Seconds()), s.Keys, mib(s.UsedMemory))
		}
		fmt.Fprintf(stdout, "statuses %v\n", res.Statuses)
		if res.EmptyAfter == 0 {
			return fmt.Errorf("keys left after watching for %v", *watch)
		}
		fmt.Fprintf(stdout, "no bucket left %.2fs after the clients went idle\n", res.EmptyAfter.Seconds())
	}
	return nil
}

func reportFilter(w io.Writer, res *filterResult, elapsed time.Duration) {
	fmt.Fprintf(w, "%10s %14s\n", "requests", "linear memory")
	for _, s := range res.Samples {
		fmt.Fprintf(w, "%10d %11d KiB\n", s.Requests, s.Bytes>>10)
	}
	names := make([]string, 0, len(res.Outcomes))
	for k := range res.Outcomes {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "  %-28s %8d\n", k, res.Outcomes[k])
	}
	names = names[:0]
	for k := range res.Counters {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprint(w, "filter counters:")
	for _, k := range names {
		if res.Counters[k] != 0 {
			fmt.Fprintf(w, " %s=%d", k, res.Counters[k])
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "callouts still pending: %d; VM failure: %v; %v\n", res.Pending, res.Failed, elapsed.Round(time.Millisecond))
}
