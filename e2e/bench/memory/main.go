// Command memory measures the limiter's memory over long runs and prints
// what it saw:
//
//	go run ./e2e/bench/memory filter  [-requests 1000000]   filter.wasm's linear memory in the headless host
//	go run ./e2e/bench/memory sidecar [-keys 1000000]       build/sidecar's RSS across distinct API keys
//	go run ./e2e/bench/memory redis   [-clients 100000]     Redis memory while clients are active, then idle
//	go run ./e2e/bench/memory all     [-out FILE]           the three in turn, at sizes that take well under a minute
//
// `make bench` runs `all -out e2e/bench/results/memory.txt`, the file
// SECURITY.md cites. Every command takes -out (also write the report to
// that file) and -bin.
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
	"path/filepath"
	"sort"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/harness"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
}

const usage = `usage: memory filter|sidecar|redis|all [flags]; memory <command> -h lists the flags`

// The sizes of `all`: each run long enough to show where memory settles
// (the filter's linear memory by 100,000 requests, the sidecar's RSS by
// 100,000 keys, Redis's per-bucket cost at any count), the three together
// well under a minute on 2 cores.
const (
	allRequests = 200000
	allKeys     = 150000
	allClients  = 50000
)

func run(args []string, stderr io.Writer) error {
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
	out := fs.String("out", "", "also write the report to this file (e.g. e2e/bench/results/memory.txt)")
	requests, keys, clients := allRequests, allKeys, allClients
	filterEvery, sidecarEvery := allRequests/10, allKeys/6
	workers, gogc, watch := 16, "", time.Minute
	switch cmd {
	case "filter":
		fs.IntVar(&requests, "requests", 1000000, "requests through the filter")
		fs.IntVar(&filterEvery, "every", 100000, "sample the memory every this many requests")
		fs.StringVar(&gogc, "gogc", "", "GOGC inside the module (default: the Go default, 100)")
	case "sidecar":
		fs.IntVar(&keys, "keys", 1000000, "distinct API keys, one check each")
		fs.IntVar(&sidecarEvery, "every", 100000, "sample the memory every this many checks")
		fs.IntVar(&workers, "workers", 16, "concurrent clients")
	case "redis":
		fs.IntVar(&clients, "clients", 100000, "distinct clients, one check each")
		fs.IntVar(&workers, "workers", 16, "concurrent clients")
		fs.DurationVar(&watch, "watch", time.Minute, "how long to watch the keys expire")
	case "all":
	default:
		return fmt.Errorf("unknown command %q; %s", cmd, usage)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; %s", fs.Args(), usage)
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
	stdout, closeOut, err := report.Tee(*out)
	if err != nil {
		return err
	}
	defer closeOut.Close()

	m := report.StartMeter(report.Command("./e2e/bench/memory", append([]string{cmd}, args...)))
	if cmd == "all" {
		fmt.Fprintf(stdout, "memory of the filter, the sidecar and Redis: go run ./e2e/bench/memory all, %s (load average %.1f)\n\n",
			time.Now().UTC().Format("2006-01-02 15:04 UTC"), report.LoadAverage())
	}
	if cmd == "filter" || cmd == "all" {
		if err := runFilter(ctx, stdout, bins, requests, filterEvery, gogc); err != nil {
			return err
		}
	}
	if cmd == "sidecar" || cmd == "all" {
		if cmd == "all" {
			fmt.Fprintln(stdout)
		}
		if err := runSidecar(ctx, stdout, bins, filepath.Join(dir, "sidecar"), keys, sidecarEvery, workers); err != nil {
			return err
		}
	}
	if cmd == "redis" || cmd == "all" {
		if cmd == "all" {
			fmt.Fprintln(stdout)
		}
		if err := runRedis(ctx, stdout, bins, filepath.Join(dir, "redis"), clients, workers, watch); err != nil {
			return err
		}
	}
	// How it ran, for BENCHMARKS.md's table of runs: this report has no
	// target, so its summary lines are none.
	ran := m.Stop()
	fmt.Fprintf(stdout, "\nrun: %s\n", ran.Note())
	if *out == "" || cmd != "all" {
		return nil
	}
	return report.SaveChecks(report.ChecksPath(*out), report.Checked{Run: ran})
}

func runFilter(ctx context.Context, w io.Writer, bins harness.Binaries, requests, every int, gogc string) error {
	fmt.Fprintf(w, "filter.wasm (%s): %d requests through one VM, mix of %d scenarios, GOGC=%q\n",
		bins.Filter, requests, len(scenarios), gogc)
	start := time.Now()
	res, err := soakFilter(ctx, bins.Filter, requests, every, gogc)
	if err != nil {
		return err
	}
	reportFilter(w, res, time.Since(start))
	if res.Failed != nil {
		return fmt.Errorf("the VM failed: %v", res.Failed)
	}
	return nil
}

func runSidecar(ctx context.Context, w io.Writer, bins harness.Binaries, dir string, keys, every, workers int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(w, "sidecar (%s): %d distinct API keys, one check each, %d clients\n", bins.Sidecar, keys, workers)
	res, err := soakSidecar(ctx, bins, dir, keys, every, workers)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%10s %12s %14s\n", "checks", "RSS", "Go heap in use")
	for _, s := range res.Samples {
		fmt.Fprintf(w, "%10d %12s %14s\n", s.Checks, mib(s.RSS), mib(s.HeapUsed))
	}
	fmt.Fprintf(w, "statuses %v in %v (%.0f checks/s)\n", res.Statuses, res.Elapsed.Round(time.Millisecond),
		float64(keys)/res.Elapsed.Seconds())
	return nil
}

func runRedis(ctx context.Context, w io.Writer, bins harness.Binaries, dir string, clients, workers int, watch time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(w, "redis: %d distinct clients checked once each, then idle (bucket TTL 11 s)\n", clients)
	res, err := soakRedis(ctx, bins, dir, clients, workers, watch)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%-22s %10s %12s\n", "", "keys", "used_memory")
	fmt.Fprintf(w, "%-22s %10d %12s\n", "before any client", res.Baseline.Keys, mib(res.Baseline.UsedMemory))
	fmt.Fprintf(w, "%-22s %10d %12s\n", "all clients active", res.Active.Keys, mib(res.Active.UsedMemory))
	for _, s := range res.Samples {
		fmt.Fprintf(w, "%-22s %10d %12s\n", fmt.Sprintf("idle for %.2fs", s.At.Seconds()), s.Keys, mib(s.UsedMemory))
	}
	fmt.Fprintf(w, "statuses %v\n", res.Statuses)
	if res.Active.Keys > 0 {
		fmt.Fprintf(w, "per active bucket: %.0f bytes of used_memory ((all clients active - before any client) / %d keys)\n",
			float64(res.Active.UsedMemory-res.Baseline.UsedMemory)/float64(res.Active.Keys), res.Active.Keys)
	}
	if res.EmptyAfter == 0 {
		return fmt.Errorf("keys left after watching for %v", watch)
	}
	fmt.Fprintf(w, "no bucket left %.2fs after the clients went idle\n", res.EmptyAfter.Seconds())
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
