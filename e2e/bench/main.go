// Command bench replays the claims behind the edge limiter (README.md,
// "Why: one client at nine times its contract") and its targets against
// the real parts — redis-server, the sidecar, the gateway running
// filter.wasm, and services with the old per-service limiters — with the
// old design and the new one side by side in the same run. Each scenario prints a progress
// line and its tables, writes a PNG chart, its tables in markdown and its
// results as JSON into -out, and `all` (the default) then writes
// BENCHMARKS.md at the repository root from those results.
//
//	go run ./e2e/bench [flags] [all|incident|noisy|latency|throughput|failopen|burst|report]
//
// The default run is short enough for a 2-core machine shared with other
// work (a few minutes); -scale stretches every phase and -runs repeats
// more. `report` rebuilds BENCHMARKS.md from the saved results without
// running anything: the same results give the same file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/vcpustall"
)

// env is what every scenario gets.
type env struct {
	bin     harness.Binaries
	out     string  // results directory
	runs    int     // repetitions whose median is reported
	scale   float64 // multiplies every phase's duration
	command string  // how this run was started, for the reports
	prog    *progress
	// vcpus watches the vCPUs over the scenario running (report.Meter);
	// nil where it could not start.
	vcpus *vcpustall.Watch
}

// dur scales a phase's duration.
func (e *env) dur(d time.Duration) time.Duration { return time.Duration(float64(d) * e.scale) }

// scenario is one benchmark.
type scenario struct {
	name string
	run  func(ctx context.Context, e *env) (*report.Scenario, error)
	// claim is what the scenario tests. It is the code's, not the run's: a
	// report built from saved results states the claim as the code does.
	claim string
	// derived, when set, returns checks read from the scenario's tables;
	// they are added to a run's checks and to saved results that lack them.
	derived func(*report.Scenario) []report.Check
}

var scenarios = []scenario{
	{"incident", runIncident, incidentClaim, nil},
	{"noisy", runNoisy, noisyClaim, noisyDerived},
	{"latency", runLatency, latencyClaim, nil},
	{"throughput", runThroughput, throughputClaim, nil},
	{"failopen", runFailOpen, failOpenClaim, nil},
	{"burst", runBurst, burstClaim, nil},
	{"atonce", runAtOnce, atOnceClaim, nil},
	{"flapping", runFlapping, flappingClaim, nil},
}

// complete sets a scenario's claim from the code and adds the derived
// checks it does not have yet.
func (s scenario) complete(r *report.Scenario) {
	r.Claim = s.claim
	if s.derived == nil {
		return
	}
	for _, c := range s.derived(r) {
		if !slices.ContainsFunc(r.Checks, func(o report.Check) bool { return o.Claim == c.Claim }) {
			r.Checks = append(r.Checks, c)
		}
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	binDir := fs.String("bin", filepath.Join(root, "build"), "directory with filter.wasm, sidecar and gateway (built there if missing)")
	out := fs.String("out", filepath.Join(root, "e2e", "bench", "results"), "where charts, markdown and JSON results go")
	md := fs.String("md", filepath.Join(root, "BENCHMARKS.md"), "`file` the all and report commands write the markdown report to; empty for none")
	runs := fs.Int("runs", 3, "repetitions of each measurement; tables report medians")
	scale := fs.Float64("scale", 1, "multiplies the duration of every phase (e.g. 5 for a longer, steadier run)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./e2e/bench [flags] [all|%s|report]\n", strings.Join(names(), "|"))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	what := "all"
	switch fs.NArg() {
	case 0:
	case 1:
		what = fs.Arg(0)
	default:
		return fmt.Errorf("one scenario at a time, got %q", fs.Args())
	}
	if *runs < 1 {
		return fmt.Errorf("-runs: must be >= 1, got %d", *runs)
	}
	if !(*scale > 0) || *scale > 1000 {
		return fmt.Errorf("-scale: must be > 0 and <= 1000, got %v", *scale)
	}
	var chosen []scenario
	switch what {
	case "all":
		chosen = scenarios
	case "report":
	default:
		i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == what })
		if i < 0 {
			return fmt.Errorf("unknown scenario %q: want all, %s or report", what, strings.Join(names(), ", "))
		}
		chosen = scenarios[i : i+1]
	}

	e := &env{out: *out, runs: *runs, scale: *scale, prog: newProgress(os.Stderr),
		command: report.Command("./e2e/bench", args)}
	if len(chosen) > 0 {
		if err := os.MkdirAll(e.out, 0o755); err != nil {
			return err
		}
		e.prog.Printf("building or locating the binaries in %s", *binDir)
		if e.bin, err = harness.Locate(ctx, *binDir); err != nil {
			return err
		}
		e.prog.Done()
	}
	for _, s := range chosen {
		m := report.StartMeter(e.command)
		e.vcpus = m.Watch()
		res, err := s.run(ctx, e)
		run := m.Stop()
		e.prog.Done()
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		res.Name, res.Run = s.name, run
		s.complete(res)
		if err := res.Save(e.out); err != nil {
			return err
		}
		printScenario(res)
	}
	if (what == "all" || what == "report") && *md != "" {
		if err := writeBenchmarks(root, *md, e); err != nil {
			return err
		}
		fmt.Printf("wrote %s\n", *md)
	}
	return nil
}

func names() []string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.name)
	}
	return n
}

func printScenario(s *report.Scenario) {
	fmt.Printf("\n== %s (%s, load average %.1f → %.1f)\n\n", s.Title, s.Took.Round(time.Second), s.Load[0], s.Load[1])
	for _, t := range s.Tables {
		t.WriteText(os.Stdout)
		fmt.Println()
	}
	for _, c := range s.Checks {
		mark := "HOLDS"
		switch {
		case c.Info:
			mark = "MEASURED" // no target to hold
		case !c.Holds:
			mark = "DOES NOT HOLD"
		}
		fmt.Printf("  %-13s %s: %s (target %s)\n", mark, c.Claim, c.Measured, c.Target)
	}
}

// method is the Method section of BENCHMARKS.md.
var method = []string{
	"Every scenario runs the real parts on this machine: redis-server, the sidecar (build/sidecar), the gateway (build/gateway, the headless proxy-wasm host playing Envoy) loading build/filter.wasm, and upstream services from e2e/services, each a listener in front of 3 replicas taken round-robin, each replica with its own state.",
	"The old design (ADR-001 in the README: a token bucket per client in every replica of every service) and the new one run side by side in the same run, on two gateways sharing one Redis and one sidecar: per-service limiters in every replica behind a gateway whose filter is off, against the edge limiter, in front of services that keep only the 10x safety limit (the canary's keep their per-service limiters, as a canary would; each scenario's method says which).",
	"Traffic is open loop (each client sends at its rate whatever the answers), and latency runs from when a request was due, so a stalled generator shows as latency rather than as less traffic. Throughput is closed loop.",
	"Each measurement is repeated (-runs), each run with fresh client keys so that it starts from full buckets (the throughput runs share theirs: the cached-deny path needs its client denied once, before the runs); tables give the median of the runs, but for counts a table says it sums over them, and ratios between the designs of the same run rather than absolute times. The machine is shared and small: absolute numbers move from run to run, the ratios are what the conclusions rest on.",
	"Nothing here is typed by hand: the tables, the charts, the checks and the reports come from the results the run saved in e2e/bench/results, the claims and this method from the code of e2e/bench.",
}

// writeBenchmarks writes BENCHMARKS.md from the results saved in e.out,
// and only from them: the date is when the last run ended (a scenario's
// or an attached report's) and the command the one the scenarios ran with, so that `report` rebuilds the
// same file from the same results.
func writeBenchmarks(root, path string, e *env) error {
	var list []*report.Scenario
	var ended time.Time
	commands := map[string]bool{}
	for _, s := range scenarios {
		r, err := report.Load(filepath.Join(e.out, s.name+".json"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		s.complete(r)
		list = append(list, r)
		if end := r.Started.Add(r.Took); end.After(ended) {
			ended = end
		}
		commands[r.Command] = true
	}
	if len(list) == 0 {
		return fmt.Errorf("no results in %s: run a scenario first", e.out)
	}
	command := "" // results of several runs: each scenario names its command
	if len(commands) == 1 {
		command = list[0].Command
	}
	rel, err := filepath.Rel(filepath.Dir(path), e.out)
	if err != nil {
		rel = e.out
	}
	var atts []report.Attachment
	// Each program writes its summary lines beside its report
	// (report.ChecksPath): its targets, and how it ran (scriptbench and
	// memory have no target, only the run).
	out := func(name string) string { return filepath.Join(e.out, name+".txt") }
	withChecks := func(title, name string) report.Attachment {
		return report.Attachment{Title: title, Path: out(name), Checks: report.ChecksPath(out(name))}
	}
	for _, a := range []report.Attachment{
		withChecks("Throughput: the script through go-redis vs redis-benchmark", "scriptbench"),
		withChecks("Throughput: the sidecar vs redis-benchmark, and beside envoyproxy/ratelimit", "sidecarbench"),
		withChecks("Throughput at 10 clients over 1,000 keys: the sidecar vs redis-benchmark and envoyproxy/ratelimit", "sidecarbench-c10"),
		withChecks("Throughput at 200 clients over 100,000 keys: the sidecar vs redis-benchmark and envoyproxy/ratelimit", "sidecarbench-c200"),
		withChecks("The filter's cost per request: wazero against native", "filtercost"),
		withChecks("Memory: the filter, the sidecar and Redis over many requests and clients", "memory"),
		withChecks("This machine: what a system call and a hop between processes cost", "machinecost"),
	} {
		if _, err := os.Stat(a.Path); err != nil {
			continue
		}
		// A report whose summary lines cannot be read would leave its
		// targets out of the summary without a word: refuse instead.
		if a.Checks != "" {
			c, err := report.LoadChecks(a.Checks)
			if err != nil {
				return fmt.Errorf("%s has no readable summary lines beside it: %w", a.Path, err)
			}
			if end := c.Run.Started.Add(c.Run.Took); end.After(ended) {
				ended = end
			}
		}
		a.Shown, _ = filepath.Rel(root, a.Path)
		atts = append(atts, a)
	}
	bm := report.Benchmarks{
		Command: "make bench", Run: command, Method: method, Machine: report.ThisMachine(),
		Generated: ended, Scenarios: list, ResultsDir: filepath.ToSlash(rel), Attachments: atts,
	}
	return os.WriteFile(path, []byte(bm.Markdown()), 0o644)
}

// progress writes one status line that rewrites itself on a terminal, and a
// line per update otherwise (at most one every 2 s, so logs stay short).
type progress struct {
	f    *os.File
	tty  bool
	last time.Time
	open bool
}

func newProgress(f *os.File) *progress {
	st, err := f.Stat()
	return &progress{f: f, tty: err == nil && st.Mode()&os.ModeCharDevice != 0}
}

// Printf shows a status line.
func (p *progress) Printf(format string, a ...any) {
	if p == nil || p.f == nil {
		return
	}
	line := fmt.Sprintf(format, a...)
	if p.tty {
		fmt.Fprintf(p.f, "\r\033[K%s", line)
		p.open = true
		return
	}
	if time.Since(p.last) >= 2*time.Second {
		fmt.Fprintln(p.f, line)
		p.last = time.Now()
	}
}

// Done ends the status line.
func (p *progress) Done() {
	if p != nil && p.tty && p.open {
		fmt.Fprint(p.f, "\r\033[K")
		p.open = false
	}
}
