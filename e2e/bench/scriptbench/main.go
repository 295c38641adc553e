// Command scriptbench measures the token-bucket script on a real Redis: the
// sidecar's path (lua.Take through go-redis: EVALSHA and reply parsing) at
// a fixed concurrency over random keys, beside redis-benchmark running an
// EVALSHA of the same script with the same concurrency and keys, in the
// same run against the same server. The ratio shows what the Go client
// costs on top of Redis itself.
//
// It starts its own redis-server on a free loopback port and stops it at
// the end. Defaults: 50 connections, 10,000 keys, 3 rounds, each 1 s of
// go-redis followed by redis-benchmark with as many requests as go-redis
// managed in its second. Rounds alternate the sides so that a busy spell on
// a shared machine does not fall on one side only.
//
//	go run ./e2e/bench/scriptbench [-rounds 3] [-duration 1s] [-c 50] [-keys 10000] [-n 0] [-out FILE]
package main

import (
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/lua"
)

type config struct {
	duration    time.Duration
	rounds      int
	concurrency int
	keys        int
	requests    int
	limit       lua.Limit
	cost        int64
	out         string
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", time.Second, "how long the go-redis side runs per round")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs go-redis, then redis-benchmark")
	flag.IntVar(&cfg.concurrency, "c", 50, "concurrent connections, both sides")
	flag.IntVar(&cfg.keys, "keys", 10000, "distinct bucket keys, chosen at random per call")
	flag.IntVar(&cfg.requests, "n", 0, "redis-benchmark requests; 0: what go-redis did in -duration (at least 10000)")
	flag.Float64Var(&cfg.limit.Capacity, "capacity", 100, "bucket capacity")
	flag.Float64Var(&cfg.limit.Rate, "rate", 10, "bucket refill rate, tokens/s")
	flag.Int64Var(&cfg.cost, "cost", 1, "tokens per check")
	flag.StringVar(&cfg.out, "out", "", "also write the report to this file (e.g. e2e/bench/results/scriptbench.txt)")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scriptbench:", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	switch {
	case cfg.duration <= 0:
		return fmt.Errorf("-duration: must be > 0, got %v", cfg.duration)
	case cfg.rounds <= 0:
		return fmt.Errorf("-rounds: must be > 0, got %d", cfg.rounds)
	case cfg.concurrency <= 0:
		return fmt.Errorf("-c: must be > 0, got %d", cfg.concurrency)
	case cfg.keys <= 0:
		return fmt.Errorf("-keys: must be > 0, got %d", cfg.keys)
	case cfg.requests < 0:
		return fmt.Errorf("-n: must be >= 0, got %d", cfg.requests)
	case cfg.cost < 0:
		return fmt.Errorf("-cost: must be >= 0, got %d", cfg.cost)
	}
	if err := cfg.limit.Validate(); err != nil {
		return err
	}
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		return fmt.Errorf("redis-benchmark not found: run `make test`, which installs redis-tools")
	}

	m := report.StartMeter(report.Command("./e2e/bench/scriptbench", os.Args[1:]))
	ctx := context.Background()
	srv, err := redisproc.Start(ctx, redisproc.Options{})
	if err != nil {
		return err
	}
	defer srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: cfg.concurrency})
	defer c.Close()
	sha, err := c.ScriptLoad(ctx, lua.Source).Result()
	if err != nil {
		return fmt.Errorf("load script: %w", err)
	}
	if sha != lua.Script.Hash() {
		return fmt.Errorf("SCRIPT LOAD gave %s, go-redis computed %s", sha, lua.Script.Hash())
	}
	version, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}

	// The report goes to stdout and, with -out, to a file as well.
	out, closeOut, err := report.Tee(cfg.out)
	if err != nil {
		return err
	}
	defer closeOut.Close()
	fmt.Fprintf(out, "token-bucket script on redis-server %s at %s; %d CPUs\n",
		infoValue(version, "redis_version"), srv.Addr, runtime.NumCPU())
	fmt.Fprintf(out, "concurrency %d, %d random keys, capacity %v, rate %v/s, cost %d; %d rounds of %v each side\n\n",
		cfg.concurrency, cfg.keys, cfg.limit.Capacity, cfg.limit.Rate, cfg.cost, cfg.rounds, cfg.duration)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "round\tclient\tchecks\tseconds\tchecks/s\tp50 ms\tp99 ms\t")
	row := func(round, client string, n int, secs, p50, p99 float64) {
		fmt.Fprintf(w, "%s\t%s\t%d\t%.2f\t%.0f\t%.3f\t%.3f\t\n", round, client, n, secs, float64(n)/secs, p50, p99)
	}

	// The sides alternate, round by round, so that a busy spell on the
	// machine does not land on one side only.
	var goAll []time.Duration
	var goSecs, rbSecs float64
	var rbN int
	var rbP50, rbP99, ratios []float64
	for round := 1; round <= cfg.rounds; round++ {
		// Each side starts from an empty keyspace, so both see the same
		// mix of new and existing buckets.
		if err := c.FlushAll(ctx).Err(); err != nil {
			return err
		}
		g, err := runGoRedis(ctx, c, cfg)
		if err != nil {
			return err
		}
		n := cfg.requests
		if n == 0 {
			n = max(10000, int(g.rps*cfg.duration.Seconds()))
		}
		if err := c.FlushAll(ctx).Err(); err != nil {
			return err
		}
		rb, err := runRedisBenchmark(ctx, c, srv.Addr, sha, n, cfg)
		if err != nil {
			return err
		}
		r := strconv.Itoa(round)
		row(r, "go-redis lua.Take", len(g.lat), g.elapsed.Seconds(), ms(pct(g.lat, 50)), ms(pct(g.lat, 99)))
		row(r, "redis-benchmark EVALSHA", n, float64(n)/rb.rps, rb.p50, rb.p99)
		goAll = append(goAll, g.lat...)
		goSecs += g.elapsed.Seconds()
		rbN += n
		rbSecs += float64(n) / rb.rps
		rbP50, rbP99 = append(rbP50, rb.p50), append(rbP99, rb.p99)
		ratios = append(ratios, g.rps/rb.rps)
	}
	slices.Sort(goAll)
	row("all", "go-redis lua.Take", len(goAll), goSecs, ms(pct(goAll, 50)), ms(pct(goAll, 99)))
	// redis-benchmark reports percentiles only, so its overall ones are
	// the medians of the rounds'.
	row("all", "redis-benchmark EVALSHA", rbN, rbSecs, median(rbP50), median(rbP99))
	w.Flush()
	perRound := make([]string, len(ratios))
	for i, r := range ratios {
		perRound[i] = fmt.Sprintf("%.2f", r)
	}
	fmt.Fprintf(out, "\nratio go-redis/redis-benchmark, checks/s: %.2f overall; rounds %s (median %.2f)\n",
		(float64(len(goAll))/goSecs)/(float64(rbN)/rbSecs), strings.Join(perRound, " "), median(ratios))
	// How it ran, for BENCHMARKS.md's table of runs: this report has no
	// target, so its summary lines are none.
	ran := m.Stop()
	fmt.Fprintf(out, "run: %s\n", ran.Note())
	if cfg.out == "" {
		return nil
	}
	return report.SaveChecks(report.ChecksPath(cfg.out), report.Checked{Run: ran})
}

type goResult struct {
	lat     []time.Duration // sorted
	elapsed time.Duration
	rps     float64
}

// runGoRedis calls lua.Take from cfg.concurrency goroutines on random keys
// until cfg.duration has passed.
func runGoRedis(ctx context.Context, c *redis.Client, cfg config) (goResult, error) {
	// Open every connection first, so the timed part does not dial.
	var wg sync.WaitGroup
	errs := make([]error, cfg.concurrency)
	for i := range cfg.concurrency {
		wg.Go(func() { errs[i] = c.Ping(ctx).Err() })
	}
	wg.Wait()

	lat := make([][]time.Duration, cfg.concurrency)
	start := time.Now()
	deadline := start.Add(cfg.duration)
	for i := range cfg.concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			for time.Now().Before(deadline) {
				key := fmt.Sprintf("key:%012d", rng.IntN(cfg.keys))
				t0 := time.Now()
				_, err := lua.Take(ctx, c, key, cfg.limit, cfg.cost)
				lat[i] = append(lat[i], time.Since(t0))
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return goResult{}, fmt.Errorf("go-redis: %w", err)
		}
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return goResult{}, fmt.Errorf("go-redis: no call finished in %v", cfg.duration)
	}
	slices.Sort(all)
	return goResult{lat: all, elapsed: elapsed, rps: float64(len(all)) / elapsed.Seconds()}, nil
}

type benchResult struct{ rps, p50, p99 float64 }

// runRedisBenchmark runs redis-benchmark's EVALSHA with random keys: -r
// makes it replace __rand_int__ with a 12-digit number below -keys, the
// same keys the go-redis side uses.
func runRedisBenchmark(ctx context.Context, c *redis.Client, addr, sha string, n int, cfg config) (benchResult, error) {
	before, err := evalshaStats(ctx, c)
	if err != nil {
		return benchResult{}, err
	}
	host, port, _ := strings.Cut(addr, ":")
	args := []string{
		"-h", host, "-p", port,
		"-c", strconv.Itoa(cfg.concurrency), "-P", "1",
		"-n", strconv.Itoa(n), "-r", strconv.Itoa(cfg.keys), "--csv",
		"EVALSHA", sha, "1", "key:__rand_int__",
	}
	// The same ARGV strings lua.Take sends.
	for _, a := range lua.Args(cfg.limit, cfg.cost) {
		args = append(args, fmt.Sprint(a))
	}
	out, err := exec.CommandContext(ctx, "redis-benchmark", args...).Output()
	if err != nil {
		return benchResult{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	// CSV: a header, then "test","rps","avg_latency_ms","min_latency_ms",
	// "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms".
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(rows) != 2 {
		return benchResult{}, fmt.Errorf("redis-benchmark: unexpected output %q", out)
	}
	col := map[string]float64{}
	for i, name := range rows[0] {
		if i < len(rows[1]) {
			col[name], _ = strconv.ParseFloat(rows[1][i], 64)
		}
	}
	r := benchResult{rps: col["rps"], p50: col["p50_latency_ms"], p99: col["p99_latency_ms"]}
	if r.rps <= 0 {
		return r, fmt.Errorf("redis-benchmark: no rps in %q", out)
	}
	// redis-benchmark counts error replies as successes; Redis's own
	// counters say whether every call ran the script.
	after, err := evalshaStats(ctx, c)
	if err != nil {
		return r, err
	}
	if calls, failed := after.calls-before.calls, after.failed-before.failed; calls < int64(n) || failed != 0 {
		return r, fmt.Errorf("redis-benchmark: Redis counted %d EVALSHA calls (%d failed), want %d and 0", calls, failed, n)
	}
	return r, nil
}

type cmdStats struct{ calls, failed int64 }

// evalshaStats reads Redis's counters for EVALSHA.
func evalshaStats(ctx context.Context, c *redis.Client) (cmdStats, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return cmdStats{}, err
	}
	var s cmdStats
	// cmdstat_evalsha:calls=20000,usec=263107,usec_per_call=13.16,rejected_calls=0,failed_calls=0
	for kv := range strings.SplitSeq(infoValue(info, "cmdstat_evalsha"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "calls":
			s.calls, _ = strconv.ParseInt(v, 10, 64)
		case "failed_calls":
			s.failed, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return s, nil
}

func infoValue(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is the p-th percentile of sorted latencies.
func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
