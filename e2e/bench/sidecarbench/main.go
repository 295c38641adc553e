// Command sidecarbench measures the sidecar against the Redis it sits on.
//
//	go run ./e2e/bench/sidecarbench [-rounds 3] [-d 3s] [-c 50] [-keys 10000] [-load wrk|go] [-rls BIN|off] [-out FILE]
//	go run ./e2e/bench/sidecarbench -checks-from FILE
//
// In one run it starts a private redis-server, the real sidecar binary and
// envoyproxy/ratelimit (RLS, built from the pinned module in e2e/bench/rls)
// on it, then, for each round:
//
//  1. runs `redis-benchmark -c 50 -P 1` of EVALSHA of the token-bucket script
//     over 10,000 keys: the raw Redis figure, one round trip per decision,
//     with Redis's CPU and commands per check and redis-benchmark's CPU;
//  2. loads the sidecar over HTTP from another process (wrk, or this one)
//     with 50 concurrent clients over 10,000 API keys, as fast as it
//     answers: checks/s, p50/p99/p99.9, and the CPU each process spent per
//     check;
//  3. loads RLS the same way over gRPC (rlsload, from e2e/bench/rls): 50
//     requests in flight over 10,000 descriptor values, with the same
//     figures. The sidecar and RLS take turns going first from round to
//     round;
//  4. loads the sidecar's two floors the same way (floor.go): its own
//     server and handler deciding at once without Redis, and the same
//     fasthttp server sending one fixed answer, so that the sidecar's CPU
//     per check is read beside what answering costs with nothing decided.
//
// The ratios are printed per round and as the median (the machine is
// shared; rounds expose its noise), with the CPU each side kept busy
// (cpubusy.go: Redis's one thread, and every process of the side on the
// machine's CPUs, which says where each side's checks/s stopped), and a
// note on what differs between the sidecar and RLS beyond the code. Then the
// sidecar is loaded at a fixed rate of half the raw Redis figure, and at
// half its own full-load figure, each request timed from when it was due
// (so a stall is not hidden by the generator waiting), for p50/p99/p99.9.
//
// With -out, the lines BENCHMARKS.md's summary gives the run (each target,
// met or not, and the comparison with RLS) are written beside the report as
// JSON, read back from the report itself; -checks-from rewrites them from a
// report saved earlier without running anything.
//
// Every plan is big enough that all checks are allowed: an allowed check is
// the script's most expensive path (it writes the bucket), and it is the same
// script and arguments redis-benchmark runs.
package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/gotool"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// The plan every benchmark key gets, and the same limit for redis-benchmark.
var benchLimit = lua.Limit{Capacity: 1_000_000_000, Rate: 1_000_000}

type config struct {
	sidecarBin  string
	loader      string
	concurrency int
	keys        int
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	redisN      int
	pipelines   int
	out         string
	rlsBin      string
	rlsLoadBin  string
	rlsConns    int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.sidecarBin, "sidecar", "", "sidecar binary; empty: $EDGELIMIT_BIN_DIR/sidecar if it exists (make bench builds it), else ./sidecar is built")
	flag.IntVar(&cfg.concurrency, "c", 50, "concurrent clients: HTTP connections, and redis-benchmark clients")
	flag.IntVar(&cfg.keys, "keys", 10000, "distinct API keys (and redis-benchmark -r)")
	flag.DurationVar(&cfg.duration, "d", 3*time.Second, "length of each measured sidecar load phase")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "load before the first measured phase, not measured")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds of redis-benchmark then the sidecar at full load; the ratio is their median")
	flag.IntVar(&cfg.redisN, "redis-n", 0, "requests redis-benchmark sends per round; 0: what the sidecar answered in the previous round (150000 in the first)")
	flag.IntVar(&cfg.pipelines, "redis-pipelines", 0, "sidecar -redis-pipelines; 0 keeps its default")
	flag.StringVar(&cfg.loader, "load", "wrk", "full-load generator: wrk (the Go generator when wrk is not installed) or go")
	flag.StringVar(&cfg.rlsBin, "rls", "", "envoyproxy/ratelimit binary, or off to leave it out; empty: $EDGELIMIT_BIN_DIR/ratelimit if it exists (make bench builds it), else built from "+rlsModuleDir)
	flag.StringVar(&cfg.rlsLoadBin, "rls-load", "", "its load generator; empty: $EDGELIMIT_BIN_DIR/rlsload if it exists, else built from "+rlsModuleDir)
	flag.IntVar(&cfg.rlsConns, "rls-conns", 2, "HTTP/2 connections the RLS load is spread over (Envoy: one per worker thread)")
	flag.StringVar(&cfg.out, "out", "", "also write the report to this file (e.g. e2e/bench/results/sidecarbench.txt), and its summary lines beside it (.checks.json)")
	checksFrom := flag.String("checks-from", "", "run nothing: rewrite the summary lines (.checks.json) of this report, written by an earlier run")
	flag.Parse()
	if *checksFrom != "" {
		if err := writeChecks(*checksFrom); err != nil {
			fmt.Fprintln(os.Stderr, "sidecarbench:", err)
			os.Exit(1)
		}
		return
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "sidecarbench:", err)
		os.Exit(2)
	}
	if cfg.loader == "wrk" {
		if _, err := exec.LookPath("wrk"); err != nil {
			fmt.Fprintln(os.Stderr, "sidecarbench: wrk not found, using the Go load generator")
			cfg.loader = "go"
		}
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "sidecarbench:", err)
		os.Exit(1)
	}
}

// check names the first flag whose value cannot make a run.
func (c config) check() error {
	switch {
	case c.rounds < 1:
		return fmt.Errorf("-rounds: must be >= 1, got %d", c.rounds)
	case c.concurrency < 1:
		return fmt.Errorf("-c: must be >= 1, got %d", c.concurrency)
	case c.keys < 1:
		return fmt.Errorf("-keys: must be >= 1, got %d", c.keys)
	case c.duration <= 0:
		return fmt.Errorf("-d: must be > 0, got %v", c.duration)
	case c.warmup < 0:
		return fmt.Errorf("-warmup: must be >= 0, got %v", c.warmup)
	case c.redisN < 0:
		return fmt.Errorf("-redis-n: must be >= 0, got %d", c.redisN)
	case c.pipelines < 0:
		return fmt.Errorf("-redis-pipelines: must be >= 0, got %d", c.pipelines)
	case c.loader != "wrk" && c.loader != "go":
		return fmt.Errorf("-load: must be wrk or go, got %q", c.loader)
	case c.rlsConns < 1:
		return fmt.Errorf("-rls-conns: must be >= 1, got %d", c.rlsConns)
	}
	return nil
}

func run(cfg config) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "sidecarbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	out, closeOut, err := report.Tee(cfg.out)
	if err != nil {
		return err
	}
	defer closeOut.Close()

	if cfg.sidecarBin == "" {
		if dir := os.Getenv("EDGELIMIT_BIN_DIR"); dir != "" {
			if _, err := os.Stat(filepath.Join(dir, "sidecar")); err == nil {
				cfg.sidecarBin = filepath.Join(dir, "sidecar")
			}
		}
	}
	if cfg.sidecarBin == "" {
		cfg.sidecarBin = filepath.Join(tmp, "sidecar")
		if err := goBuild(cfg.sidecarBin, "", "./sidecar"); err != nil {
			return err
		}
	}

	srv, err := redisproc.Start(ctx, redisproc.Options{})
	if err != nil {
		return err
	}
	defer srv.Stop()
	plansFile, err := writePlans(tmp)
	if err != nil {
		return err
	}
	sc, err := startSidecar(cfg.sidecarBin, plansFile, srv.URL(), cfg.pipelines)
	if err != nil {
		return err
	}
	defer sc.stop()
	floors, err := startFloors(tmp, plansFile)
	if err != nil {
		return err
	}
	defer floors.stop()
	var rls *rlsService
	if cfg.rlsBin != "off" {
		if cfg.rlsBin, cfg.rlsLoadBin, err = locateRLS(cfg.rlsBin, cfg.rlsLoadBin, tmp); err != nil {
			return err
		}
		if rls, err = startRLS(cfg.rlsBin, tmp, "default", srv.Addr, nil); err != nil {
			return err
		}
		defer rls.stop()
	}
	load, _ := os.ReadFile("/proc/loadavg")
	m := report.StartMeter(report.Command("./e2e/bench/sidecarbench", os.Args[1:]))
	fmt.Fprintf(out, "sidecar %s on redis-server %s; %d clients, %d API keys; %d CPUs, load average %s\n",
		cfg.sidecarBin, srv.Addr, cfg.concurrency, cfg.keys, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "))
	if rls != nil {
		fmt.Fprintf(out, "beside it envoyproxy/ratelimit %s (%s) on the same Redis, loaded by rlsload over %d HTTP/2 connections\n",
			rlsVersion(cfg.rlsBin), cfg.rlsBin, cfg.rlsConns)
	}
	fmt.Fprintf(out, "every check is allowed (the script's writing path); redis-benchmark runs the same script and arguments\n\n")

	keys := make([][]byte, cfg.keys)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("bench-key-%06d", i))
	}
	// One loadgen per server, so that each phase finds the connections
	// of the phase before it open.
	lgs := map[string]*loadgen{}
	for _, addr := range []string{sc.addr, floors.decided.addr, floors.fixed.addr} {
		lgs[addr] = newLoadgen(addr, keys, cfg.concurrency)
		defer lgs[addr].close()
	}
	lg := lgs[sc.addr]
	// fullLoadOn loads the server at addr as fast as it answers.
	fullLoadOn := func(addr string) func(time.Duration) (figures, error) {
		if cfg.loader == "wrk" {
			return func(d time.Duration) (figures, error) { return wrk(tmp, addr, cfg.concurrency, cfg.keys, d) }
		}
		return lgs[addr].closed
	}
	fullLoad := fullLoadOn(sc.addr)
	for _, addr := range []string{sc.addr, floors.decided.addr, floors.fixed.addr} {
		if _, err := fullLoadOn(addr)(cfg.warmup); err != nil {
			return err
		}
	}
	var rlsFull func(time.Duration) (figures, error)
	if rls != nil {
		rlsFull = func(d time.Duration) (figures, error) {
			return rlsLoad(cfg.rlsLoadBin, rls.grpcAddr, cfg.concurrency, cfg.rlsConns, cfg.keys, d)
		}
		if _, err := rlsFull(cfg.warmup); err != nil {
			return err
		}
	}

	// measure runs one full-load phase against the process pid, with the
	// CPU every process spent and the commands Redis ran during it.
	measure := func(pid int, load func(time.Duration) (figures, error)) (figures, perCheck, error) {
		c0, err := cpuNow(ctx, pid, srv)
		if err != nil {
			return figures{}, perCheck{}, err
		}
		f, err := load(cfg.duration)
		if err != nil {
			return figures{}, perCheck{}, err
		}
		c1, err := cpuNow(ctx, pid, srv)
		if err != nil {
			return figures{}, perCheck{}, err
		}
		return f, c1.sub(c0).per(f.decisions + f.errors), nil
	}

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "round\tside\tchecks/s\tp50\tp99\tp99.9\tnot decided\tmean batch\tRedis cmds/check\tCPU µs/check: service\tredis\tload gen\t")
	row := func(r int, side string, f figures, batch string, pc perCheck) {
		fmt.Fprintf(w, "%d\t%s\t%.0f\t%s\t%s\t%s\t%d\t%s\t%.2f\t%.1f\t%.1f\t%.1f\t\n", r, side,
			f.rps, ms(f.p50), ms(f.p99), ms(f.p999), f.errors, batch, pc.redisCmds, pc.service, pc.redis, pc.loadgen)
	}
	var ratios, rawRates, sidecarRates, rawRedisCPU, sidecarRedisCPU, undecided []float64
	var beside floorFigures
	busy := cpuBusy{ncpu: runtime.NumCPU()}
	var vsRLS rlsRatios
	var lastFull, lastRLS figures
	n := cfg.redisN
	if n == 0 {
		n = 150000
	}
	for r := 1; r <= cfg.rounds; r++ {
		// Redis's CPU and commands per check under redis-benchmark, and
		// redis-benchmark's own CPU (a child that has finished by the
		// second reading): the figures the sidecar's rows are read against.
		c0, err := cpuNow(ctx, os.Getpid(), srv)
		if err != nil {
			return err
		}
		raw, err := redisBenchmark(ctx, srv, cfg.concurrency, cfg.keys, n)
		if err != nil {
			return err
		}
		c1, err := cpuNow(ctx, os.Getpid(), srv)
		if err != nil {
			return err
		}
		rawCPU := c1.sub(c0).per(int64(n))
		fmt.Fprintf(w, "%d\tredis-benchmark EVALSHA -P 1\t%.0f\t%s\t%s\t-\t-\t1\t%.2f\t-\t%.1f\t%.1f\t\n", r, raw.rps, ms(raw.p50), ms(raw.p99),
			rawCPU.redisCmds, rawCPU.redis, rawCPU.loadgen)
		rawRedisCPU = append(rawRedisCPU, rawCPU.redis)

		var full, rf figures
		var fullCPU, rlsCPU perCheck
		sidecarPhase := func() error {
			m0, err := sc.scrape()
			if err != nil {
				return err
			}
			if full, fullCPU, err = measure(sc.cmd.Process.Pid, fullLoad); err != nil {
				return err
			}
			m1, err := sc.scrape()
			if err != nil {
				return err
			}
			row(r, fmt.Sprintf("sidecar over HTTP (%s)", cfg.loader), full, fmt.Sprintf("%.1f", meanBatch(m0, m1)), fullCPU)
			return nil
		}
		rlsPhase := func() error {
			if rls == nil {
				return nil
			}
			if rf, rlsCPU, err = measure(rls.pid(), rlsFull); err != nil {
				return err
			}
			row(r, "envoyproxy/ratelimit over gRPC", rf, "-", rlsCPU)
			return nil
		}
		// The two take turns going first, so that neither always runs on
		// the machine the other has just warmed (or heated).
		phases := []func() error{sidecarPhase, rlsPhase}
		if r%2 == 0 {
			phases[0], phases[1] = phases[1], phases[0]
		}
		for _, ph := range phases {
			if err := ph(); err != nil {
				return err
			}
		}
		// The floors after both, in the same order every round: they are
		// read against the sidecar's CPU per check, not its throughput.
		dec, decCPU, err := measure(floors.decided.cmd.Process.Pid, fullLoadOn(floors.decided.addr))
		if err != nil {
			return err
		}
		row(r, fmt.Sprintf("sidecar deciding at once, no Redis (%s)", cfg.loader), dec, "-", decCPU)
		fix, fixCPU, err := measure(floors.fixed.cmd.Process.Pid, fullLoadOn(floors.fixed.addr))
		if err != nil {
			return err
		}
		row(r, fmt.Sprintf("fasthttp, one fixed answer (%s)", cfg.loader), fix, "-", fixCPU)
		beside.add(fullCPU.service, dec, decCPU, fix, fixCPU)
		busy.add(raw, rawCPU, full, fullCPU)
		ratios = append(ratios, full.rps/raw.rps)
		undecided = append(undecided, 100*float64(full.errors)/float64(full.decisions+full.errors))
		rawRates = append(rawRates, raw.rps)
		sidecarRates = append(sidecarRates, full.rps)
		sidecarRedisCPU = append(sidecarRedisCPU, fullCPU.redis)
		if rls != nil {
			vsRLS.add(full, rf, fullCPU, rlsCPU)
		}
		lastFull, lastRLS = full, rf
		if cfg.redisN == 0 {
			n = max(10000, int(full.decisions))
		}
	}
	w.Flush()

	// openAt loads the sidecar open loop at rate for the phase's length,
	// after a warm-up at the same rate, and reads the sidecar's own
	// decision p99 over the measured part from its histogram.
	openAt := func(rate float64) (figures, string, error) {
		if _, err := lg.open(cfg.warmup, rate); err != nil {
			return figures{}, "", err
		}
		before, err := sc.scrape()
		if err != nil {
			return figures{}, "", err
		}
		f, err := lg.open(cfg.duration, rate)
		if err != nil {
			return figures{}, "", err
		}
		after, err := sc.scrape()
		if err != nil {
			return figures{}, "", err
		}
		return f, decisionP99(before, after), nil
	}
	// Half of the raw Redis figure (its median over the rounds), open loop:
	// the target's load. Then half of what the sidecar itself answered at
	// full load, a load the sidecar sets and not the machine: where the
	// sidecar answers well below Redis, half Redis's rate is most of its
	// capacity, and the queue that forms there sets the first figure.
	half := stat.Median(rawRates) / 2
	open, openDecision, err := openAt(half)
	if err != nil {
		return err
	}
	ownHalf := stat.Median(sidecarRates) / 2
	own, ownDecision, err := openAt(ownHalf)
	if err != nil {
		return err
	}

	fmt.Fprintf(out, "\nratio sidecar / redis-benchmark, checks/s: median %.2f over %d rounds (%s); target >= %.2f\n",
		stat.Median(ratios), len(ratios), stat.Join(ratios, 2, ", "), targetRatio)
	fmt.Fprintf(out, "not decided at full load, share of the sidecar's answers: median %.1f%% over %d rounds (%s); 503 at its %v deadline, checks the filter fails open, which the sidecar's checks/s leave out\n",
		stat.Median(undecided), len(undecided), stat.Join(undecided, 1, ", "), server.DefaultTimeout)
	fmt.Fprintf(out, "Redis's CPU per check, median of the rounds: %.1f µs under the sidecar's pipelines, %.1f µs under redis-benchmark -P 1\n",
		stat.Median(sidecarRedisCPU), stat.Median(rawRedisCPU))
	busy.print(out, cfg.loader)
	beside.print(out)
	if rls != nil {
		vsRLS.print(out)
	}
	fmt.Fprintf(out, "\nat half the raw Redis rate, %.0f checks/s offered (open loop, timed from when each was due):\n", half)
	// Half of Redis's rate is the sidecar's half load only where the
	// sidecar keeps up with Redis: where it does not, the same offer is
	// most of what the sidecar can answer at all, and its queue, not its
	// path, sets the tail. Said beside the figures, so they are read for
	// what they are.
	fmt.Fprintf(out, "  the offer is %.0f%% of the %.0f checks/s the sidecar answered at full load in this run (median of the rounds)\n",
		100*half/stat.Median(sidecarRates), stat.Median(sidecarRates))
	fmt.Fprintf(out, "  answered %.0f/s; p50 %s, p99 %s, p99.9 %s; not decided %d; target p99 < %g ms\n",
		open.rps, ms(open.p50), ms(open.p99), ms(open.p999), open.errors, targetHalfP99)
	fmt.Fprintf(out, "  the sidecar's own decision latency (its histogram), p99 %s; the load generator's lateness in sending, p99 %s\n",
		openDecision, ms(open.lateP99))
	fmt.Fprintf(out, "\nat half the sidecar's own full-load rate, %.0f checks/s offered (open loop, timed from when each was due; no target):\n", ownHalf)
	fmt.Fprintf(out, "  answered %.0f/s; p50 %s, p99 %s, p99.9 %s; not decided %d\n",
		own.rps, ms(own.p50), ms(own.p99), ms(own.p999), own.errors)
	fmt.Fprintf(out, "  the sidecar's own decision latency (its histogram), p99 %s; the load generator's lateness in sending, p99 %s\n",
		ownDecision, ms(own.lateP99))
	// Each target decided on the figure as measured, not as printed above
	// (0.795 prints as 0.80): BENCHMARKS.md's summary reads this line.
	fmt.Fprintf(out, "\ntargets, on the unrounded figures: ratio %g >= %g %s; sidecar CPU per check %g µs <= %g %s; p99 at half the raw rate %g ms < %g %s\n",
		stat.Median(ratios), targetRatio, report.Met(stat.Median(ratios) >= targetRatio),
		stat.Median(beside.sidecar), targetCPUus, report.Met(stat.Median(beside.sidecar) <= targetCPUus),
		stat.Ms(open.p99), targetHalfP99, report.Met(stat.Ms(open.p99) < targetHalfP99))
	for _, f := range []struct {
		name string
		f    figures
	}{{"full load (last round)", lastFull}, {"RLS, full load (last round)", lastRLS}, {"half rate", open}, {"half its own rate", own}} {
		if f.f.errors > 0 {
			fmt.Fprintf(out, "%s: %d of %d checks not decided, first: %s\n", f.name, f.f.errors, f.f.decisions+f.f.errors, f.f.firstErr)
		}
	}
	ran := m.Stop()
	if ran.Steal != nil {
		fmt.Fprintf(out, "over the run, the hypervisor took %.1f%% of the machine's CPU time (steal): time none of the processes above had\n", 100**ran.Steal)
	}
	if ran.Stalls != nil {
		fmt.Fprintf(out, "over the run, a vCPU stood still for %s or more: %s (a real-time thread pinned to each CPU woke that late)\n", report.BreaksACallout, ran.Stalls)
	} else if ran.Unwatched != "" {
		fmt.Fprintf(out, "over the run, the vCPUs were not watched: %s\n", ran.Unwatched)
	}
	fmt.Fprintf(out, "run: started %s, took %s, load average %.2f at the start, %.2f at the end: %s\n",
		ran.Started.UTC().Format(time.RFC3339), ran.Took.Round(time.Second), ran.Load[0], ran.Load[1], ran.Command)
	if rls != nil {
		fmt.Fprintf(out, "\n%s\n", rlsNote(cfg))
	}
	if cfg.out != "" {
		// The summary lines BENCHMARKS.md shows, next to the report.
		return writeChecks(cfg.out)
	}
	return nil
}

func meanBatch(a, b scrape) float64 {
	return (b.batchSum - a.batchSum) / max(1, b.batchCount-a.batchCount)
}

type cpuTimes struct {
	service, redis, loadgen time.Duration
	redisCmds               int64 // commands Redis processed
}

func (c cpuTimes) sub(o cpuTimes) cpuTimes {
	return cpuTimes{c.service - o.service, c.redis - o.redis, c.loadgen - o.loadgen, c.redisCmds - o.redisCmds}
}

// perCheck is what one check cost, in CPU µs per process and in Redis
// commands.
type perCheck struct{ service, redis, loadgen, redisCmds float64 }

func (c cpuTimes) per(checks int64) perCheck {
	n := float64(max(checks, 1))
	us := func(d time.Duration) float64 { return d.Seconds() * 1e6 / n }
	return perCheck{us(c.service), us(c.redis), us(c.loadgen), float64(c.redisCmds) / n}
}

// cpuNow reads the CPU time (user + system) used so far by the service
// process pid (/proc), by redis-server (INFO cpu) and by this process and
// its finished children (the load generators), and the commands Redis has
// processed (INFO stats).
func cpuNow(ctx context.Context, pid int, srv *redisproc.Server) (cpuTimes, error) {
	var c cpuTimes
	var err error
	if c.service, err = harness.CPUTimeOf(pid); err != nil {
		return c, err
	}
	if c.redis, err = srv.CPUTime(ctx); err != nil {
		return c, err
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	info, err := rc.Info(ctx, "stats").Result()
	if err != nil {
		return c, err
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			c.redisCmds, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	// The load generator: this process, plus finished children (wrk; also
	// redis-benchmark, which ended before the first reading).
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			return c, err
		}
		c.loadgen += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return c, nil
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

type figures struct {
	rps            float64 // decisions (200 or 429) per second
	p50, p99, p999 time.Duration
	decisions      int64
	errors         int64 // answers other than 200/429, and transport errors
	firstErr       string
	// lateP99 (open loop only) is the 99th percentile of how late the load
	// generator itself sent a request: large values mean the machine, not
	// the sidecar, held requests back.
	lateP99 time.Duration
}

// redisBenchmark runs redis-benchmark's EVALSHA of the bucket script with
// the arguments the sidecar sends, on keys shaped like the sidecar's.
func redisBenchmark(ctx context.Context, srv *redisproc.Server, clients, nkeys, n int) (figures, error) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	sha, err := c.ScriptLoad(ctx, lua.Source).Result()
	if err != nil {
		return figures{}, fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	host, port, _ := strings.Cut(srv.Addr, ":")
	args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(clients), "-P", "1", "-n", strconv.Itoa(n),
		"-r", strconv.Itoa(nkeys), "--csv", "EVALSHA", sha, "1", "rl:{__rand_int__}"}
	for _, a := range lua.Args(benchLimit, 1) {
		args = append(args, fmt.Sprint(a))
	}
	out, err := exec.CommandContext(ctx, "redis-benchmark", args...).Output()
	if err != nil {
		return figures{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	// --csv: a header, then "test","rps","avg_latency_ms","min_latency_ms",
	// "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms".
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(rows) < 2 || len(rows[1]) < 7 {
		return figures{}, fmt.Errorf("redis-benchmark output not understood: %v\n%s", err, out)
	}
	num := func(i int) float64 { f, _ := strconv.ParseFloat(rows[1][i], 64); return f }
	msDur := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	if num(1) <= 0 {
		return figures{}, fmt.Errorf("redis-benchmark reported no throughput:\n%s", out)
	}
	return figures{rps: num(1), p50: msDur(num(4)), p99: msDur(num(6))}, nil
}

type sidecar struct {
	cmd  *exec.Cmd
	addr string
	done chan error
}

// goBuild builds pkg into bin, in the module at dir ("" for the
// repository's own; a dir is relative to the repository's root).
func goBuild(bin, dir, pkg string) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	return gotool.Run(context.Background(), filepath.Join(root, dir), nil, "build", "-trimpath", "-o", bin, pkg)
}

// writePlans writes the plans file every benchmark key is in (benchLimit,
// as the default plan) to dir.
func writePlans(dir string) (string, error) {
	plans := filepath.Join(dir, "plans.yaml")
	content := fmt.Sprintf("default_plan: bench\nplans:\n  bench: {capacity: %d, rate: %d}\n", int64(benchLimit.Capacity), int64(benchLimit.Rate))
	return plans, os.WriteFile(plans, []byte(content), 0o600)
}

func startSidecar(bin, plans, redisURL string, pipelines int) (*sidecar, error) {
	args := []string{"-listen", "127.0.0.1:0", "-redis", redisURL, "-plans", plans}
	if pipelines > 0 {
		args = append(args, "-redis-pipelines", strconv.Itoa(pipelines))
	}
	return startServer("sidecar", bin, args...)
}

// startServer starts bin, a sidecar or a floor, with args, and waits for
// the start-up log line that gives its address (it listens on port 0: a
// free one); what names it in its messages.
func startServer(what, bin string, args ...string) (*sidecar, error) {
	cmd := exec.Command(bin, args...)
	testkit.DieWithParent(cmd)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &sidecar{cmd: cmd, done: make(chan error, 1)}
	addrRE := regexp.MustCompile(`msg="` + what + ` listening" addr=([0-9.:]+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			} else if strings.Contains(sc.Text(), "level=ERROR") || strings.Contains(sc.Text(), "level=WARN") {
				fmt.Fprintln(os.Stderr, what+":", sc.Text())
			}
		}
		s.done <- cmd.Wait()
	}()
	select {
	case s.addr = <-found:
	case err := <-s.done:
		return nil, fmt.Errorf("%s exited at start: %v", what, err)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start in 30s", what)
	}
	return s, nil
}

func (s *sidecar) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// scrape is what the benchmark reads from the sidecar's /metrics.
type scrape struct {
	batchSum, batchCount float64            // sidecar_pipeline_batch_size
	buckets              map[string]float64 // sidecar_decision_duration_seconds, le → cumulative count
}

// decisionP99 returns the upper bound of the sidecar's own decision latency
// histogram bucket holding the 99th percentile of the decisions made between
// two scrapes: the sidecar's view, without the network and load generator.
func decisionP99(a, b scrape) string {
	total := b.buckets["+Inf"] - a.buckets["+Inf"]
	if total <= 0 {
		return "-"
	}
	var les []float64
	for le := range b.buckets {
		if f, err := strconv.ParseFloat(le, 64); err == nil {
			les = append(les, f)
		}
	}
	slices.Sort(les)
	for _, le := range les {
		k := strconv.FormatFloat(le, 'g', -1, 64)
		if b.buckets[k]-a.buckets[k] >= 0.99*total {
			return "<= " + ms(time.Duration(le*float64(time.Second)))
		}
	}
	return "> " + ms(time.Duration(les[len(les)-1]*float64(time.Second)))
}

// scrape reads /metrics.
func (s *sidecar) scrape() (scrape, error) {
	m, err := testkit.GetMetrics("http://" + s.addr + "/metrics")
	if err != nil {
		return scrape{}, err
	}
	h := scrape{buckets: map[string]float64{},
		batchSum: m["sidecar_pipeline_batch_size_sum"], batchCount: m["sidecar_pipeline_batch_size_count"]}
	for k, v := range m {
		if le, ok := strings.CutPrefix(k, `sidecar_decision_duration_seconds_bucket{le="`); ok {
			h.buckets[strings.TrimSuffix(le, `"}`)] = v
		}
	}
	return h, nil
}

// wrkScript makes wrk send POST /v1/check with a random one of nkeys API
// keys per request and print its figures on one line. A key's request is
// formatted the first time it is drawn and kept, not all of them in init:
// wrk starts its first thread before it runs the second's init, and
// counts its duration only from when every init has run, so the
// requests the first thread sent meanwhile went into checks/s as if sent
// within the run: with 1,000,000 keys formatted in init, a "3 s" run took
// 17 s and counted 597,874 requests against fasthttp's fixed answer,
// where 10,000 keys gave some 250,000, and the sidecar's side looked
// busier than two CPUs can be; with 100,000 keys, 286,124. Each thread
// seeds its own random numbers (setup numbers the threads): unseeded,
// LuaJIT starts every thread's math.random at the same seed, and the two
// threads drew the same keys in the same order.
const wrkScript = `
local n = %d
local reqs = {}
local head, tail
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_number", threads)
end
function init(args)
  math.randomseed(thread_number)
  local r = wrk.format("POST", "/v1/check", {["x-api-key"] = "\0"})
  local at = r:find("\0", 1, true)
  head, tail = r:sub(1, at - 1), r:sub(at + 1)
end
function request()
  local i = math.random(n)
  local r = reqs[i]
  if r == nil then
    r = head .. string.format("bench-key-%%06d", i - 1) .. tail
    reqs[i] = r
  end
  return r
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKRESULT %%d %%d %%d %%d %%d %%d\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout + e.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
`

// wrk runs wrk for d with concurrency connections on 2 threads.
func wrk(dir, addr string, concurrency, nkeys int, d time.Duration) (figures, error) {
	script := filepath.Join(dir, "check.lua")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(wrkScript, nkeys)), 0o600); err != nil {
		return figures{}, err
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	out, err := exec.Command("wrk", "-t2", "-c"+strconv.Itoa(concurrency), "-d"+strconv.Itoa(secs)+"s",
		"-s", script, "http://"+addr+"/").CombinedOutput()
	if err != nil {
		return figures{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`WRKRESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		return figures{}, fmt.Errorf("wrk output not understood:\n%s", out)
	}
	v := make([]int64, 7)
	for i := 1; i <= 6; i++ {
		v[i], _ = strconv.ParseInt(m[i], 10, 64)
	}
	requests, micros, errs := v[1], v[2], v[3]
	us := func(x int64) time.Duration { return time.Duration(x) * time.Microsecond }
	f := figures{rps: float64(requests-errs) / (float64(micros) / 1e6), p50: us(v[4]), p99: us(v[5]), p999: us(v[6]),
		decisions: requests - errs, errors: errs}
	if errs > 0 {
		f.firstErr = "wrk counted errors or non-2xx answers"
	}
	return f, nil
}

// loadgen sends POST /v1/check over keep-alive connections. Its
// connections outlive a phase: the warm-up opens them and the measured
// phase that follows uses them, as a proxy's pool to its sidecar is open
// before traffic is measured. A client made per phase opened all of them
// in the measured phase's first milliseconds instead: with 100 clients at
// 15,000 checks/s, the requests due in its first 50 ms took up to 25 ms
// (0.2% to 0.8% of the phase's, in p99.9 and close to p99).
type loadgen struct {
	keys        [][]byte
	concurrency int
	hc          *fasthttp.HostClient
}

func newLoadgen(addr string, keys [][]byte, concurrency int) *loadgen {
	return &loadgen{keys: keys, concurrency: concurrency, hc: &fasthttp.HostClient{Addr: addr,
		MaxConns: concurrency, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}}
}

// close closes the idle connections.
func (l *loadgen) close() { l.hc.CloseIdleConnections() }

// closed runs concurrency clients back to back for d: the most the sidecar
// answers.
func (l *loadgen) closed(d time.Duration) (figures, error) {
	return l.load(d, 0)
}

// open sends rate checks per second for d, spread over the clients, and
// times each from when it was due.
func (l *loadgen) open(d time.Duration, rate float64) (figures, error) {
	return l.load(d, rate)
}

func (l *loadgen) load(d time.Duration, rate float64) (figures, error) {
	hc := l.hc
	var (
		wg       sync.WaitGroup
		errs     atomic.Int64
		firstErr atomic.Value
		lat      = make([][]time.Duration, l.concurrency)
		late     = make([][]time.Duration, l.concurrency)
	)
	start := time.Now()
	end := start.Add(d)
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(l.concurrency) / rate * float64(time.Second))
	}
	for w := range l.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + l.hc.Addr + "/v1/check")
			req.Header.SetMethod("POST")
			samples := make([]time.Duration, 0, 1<<16)
			var lateness []time.Duration
			// Open loop: each client owns every concurrency-th slot of the
			// schedule, offset so the clients interleave.
			due := start.Add(time.Duration(w) * interval / time.Duration(l.concurrency))
			for {
				var t0 time.Time
				if interval > 0 {
					if due.After(end) {
						break
					}
					if wait := time.Until(due); wait > 0 {
						time.Sleep(wait)
					}
					t0 = due
					due = due.Add(interval)
				} else {
					t0 = time.Now()
					if t0.After(end) {
						break
					}
				}
				req.Header.SetBytesV("x-api-key", l.keys[rng.IntN(len(l.keys))])
				if interval > 0 {
					lateness = append(lateness, time.Since(t0))
				}
				err := hc.Do(req, resp)
				samples = append(samples, time.Since(t0))
				if err == nil && resp.StatusCode() != 200 && resp.StatusCode() != 429 {
					err = fmt.Errorf("status %d: %q", resp.StatusCode(), resp.Body())
				}
				if err != nil {
					if errs.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
				}
			}
			lat[w], late[w] = samples, lateness
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, s := range lat {
		all = append(all, s...)
	}
	if len(all) == 0 {
		return figures{}, errors.New("no requests completed")
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	decided := int64(len(all)) - errs.Load()
	f := figures{rps: float64(decided) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99), p999: pct(0.999), decisions: decided, errors: errs.Load()}
	if v, ok := firstErr.Load().(string); ok {
		f.firstErr = v
	}
	var lates []time.Duration
	for _, s := range late {
		lates = append(lates, s...)
	}
	if len(lates) > 0 {
		slices.Sort(lates)
		f.lateP99 = lates[min(len(lates)-1, int(0.99*float64(len(lates))))]
	}
	return f, nil
}
