package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
)

// The sidecar's targets: at least 0.8x raw Redis (redis-benchmark EVALSHA
// -P 1, one round trip per decision) in the same run, at most 10 µs of the
// sidecar's CPU per check, and a p99 under 2 ms at half the raw Redis rate.
const (
	targetRatio   = 0.80
	targetCPUus   = 10.0
	targetHalfP99 = 2.0 // ms
)

// writeChecks reads the report this program wrote to path and writes the
// lines BENCHMARKS.md's summary gives it beside it (report.ChecksPath). The
// summary is read from the report rather than kept aside, so that a report
// saved by an earlier run gives the same lines (`-checks-from`).
func writeChecks(path string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	checks, err := reportChecks(string(text))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	run, err := reportRun(string(text))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return report.SaveChecks(report.ChecksPath(path), report.Checked{Run: run, Checks: checks})
}

// reportRun reads the report's command, when it ran and how busy the
// machine was besides.
func reportRun(text string) (report.Run, error) {
	var r report.Run
	m := runRE.FindStringSubmatch(text)
	if m == nil {
		return r, fmt.Errorf("no run line (a report written before it was added: run the benchmark again)")
	}
	var err error
	if r.Started, err = time.Parse(time.RFC3339, m[1]); err != nil {
		return r, err
	}
	if r.Took, err = time.ParseDuration(m[2]); err != nil {
		return r, err
	}
	num := func(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }
	r.Load, r.Command = [2]float64{num(m[3]), num(m[4])}, m[5]
	if s := stealRE.FindStringSubmatch(text); s != nil {
		share := num(s[1]) / 100
		r.Steal = &share
	}
	if s := unwatchedRE.FindStringSubmatch(text); s != nil {
		r.Unwatched = s[1]
	}
	if s := stallsRE.FindStringSubmatch(text); s != nil {
		r.Stalls = &report.Stalls{}
		if s[1] != "none" {
			r.Stalls.Count = int(num(s[2]))
			r.Stalls.Longest = time.Duration(num(s[3]) * float64(time.Millisecond))
		}
	}
	return r, nil
}

var (
	headerRE    = regexp.MustCompile(`(?m)^sidecar .*; (\d+) clients, (\d+) API keys;`)
	sidecarRE   = regexp.MustCompile(`(?m)^\s*(\d+)\s+sidecar over HTTP \(\w+\)\s+\d+\s.*\s([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)
	ratioRE     = regexp.MustCompile(`(?m)^ratio sidecar / redis-benchmark, checks/s: median ([0-9.]+) over (\d+) rounds \(([^)]*)\); target >= ([0-9.]+)$`)
	halfRE      = regexp.MustCompile(`(?m)^at half the raw Redis rate, (\d+) checks/s offered`)
	halfFigRE   = regexp.MustCompile(`(?m)^  answered (\d+)/s; p50 [0-9.]+ms, p99 ([0-9.]+)ms, p99\.9 [0-9.]+ms; not decided (\d+); target p99 < ([0-9.]+) ms$`)
	halfOfRE    = regexp.MustCompile(`(?m)^  the offer is (\d+)% of the (\d+) checks/s the sidecar answered at full load in this run`)
	ownHalfRE   = regexp.MustCompile(`(?m)^at half the sidecar's own full-load rate, (\d+) checks/s offered .*\n  answered (\d+)/s; p50 ([0-9.]+)ms, p99 ([0-9.]+)ms, p99\.9 [0-9.]+ms; not decided (\d+)\n  the sidecar's own decision latency \(its histogram\), p99 (.+); the load generator's lateness in sending, p99 ([0-9.]+)ms$`)
	halfOwnRE   = regexp.MustCompile(`(?m)^  the sidecar's own decision latency \(its histogram\), p99 (.+); the load generator's lateness in sending, p99 ([0-9.]+)ms$`)
	rlsRpsRE    = regexp.MustCompile(`(?m)^ratio sidecar / envoyproxy/ratelimit, checks/s: median ([0-9.]+) over (\d+) rounds`)
	busyRE      = regexp.MustCompile(`(?m)^CPU kept busy, .* shares the (\d+) CPUs\):\n  redis-benchmark's side: Redis ([0-9.]+), Redis and redis-benchmark ([0-9.]+) .*\n  the sidecar's side: Redis ([0-9.]+), the sidecar, Redis and \w+ ([0-9.]+) `)
	rlsCPURE    = regexp.MustCompile(`(?m)^  service ([0-9.]+) \([^)]*\), Redis ([0-9.]+) \(`)
	runRE       = regexp.MustCompile(`(?m)^run: started (\S+), took (\S+), load average ([0-9.]+) at the start, ([0-9.]+) at the end: (.+)$`)
	stealRE     = regexp.MustCompile(`(?m)^over the run, the hypervisor took ([0-9.]+)% of the machine's CPU time`)
	unwatchedRE = regexp.MustCompile(`(?m)^over the run, the vCPUs were not watched: (.+)$`)
	stallsRE    = regexp.MustCompile(`(?m)^over the run, a vCPU stood still for [0-9.]+ ms or more: (none|(\d+) times, the longest ([0-9.]+) ms) `)
	floorRE     = regexp.MustCompile(`(?m)^the sidecar's CPU per check beside its floors, medians of the rounds: [0-9.]+ µs; deciding at once without Redis ([0-9.]+) µs \((\d+) checks/s\); one fixed answer ([0-9.]+) µs \((\d+) checks/s\)$`)
	verdictRE   = regexp.MustCompile(`(?m)^targets, on the unrounded figures: ratio \S+ >= \S+ (met|not met); sidecar CPU per check \S+ µs <= \S+ (met|not met); p99 at half the raw rate \S+ ms < \S+ (met|not met)$`)
	undecidedRE = regexp.MustCompile(`(?m)^not decided at full load, share of the sidecar's answers: median ([0-9.]+)% over \d+ rounds \(([^)]*)\); 503 at its (\S+) deadline`)
	redisRE     = regexp.MustCompile(`(?m)^Redis's CPU per check, median of the rounds: ([0-9.]+) µs under the sidecar's pipelines, ([0-9.]+) µs under redis-benchmark -P 1$`)
)

// reportChecks returns the summary's lines for a report of this program:
// the sidecar against raw Redis, its CPU per check (beside its floors, in
// the reports that have them), its p99 at half the raw Redis rate and at
// half its own full-load rate, Redis's CPU per check under the sidecar and
// under redis-benchmark, and (when RLS ran) the comparison with RLS; the
// last three have no target.
func reportChecks(text string) ([]report.Check, error) {
	missing := func(what string) error { return fmt.Errorf("no %s in the report", what) }
	num := func(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }

	var checks []report.Check
	// Whether each target is met comes from the run's own verdicts, made
	// on the figures as measured: the figures below are read as printed,
	// rounded.
	v := verdictRE.FindStringSubmatch(text)
	if v == nil {
		return nil, missing("line of verdicts on the unrounded figures (a report written before it was added: run the benchmark again)")
	}
	ratioMet, cpuMet, p99Met := v[1] == "met", v[2] == "met", v[3] == "met"
	hd := headerRE.FindStringSubmatch(text)
	if hd == nil {
		return nil, missing("header")
	}
	// Every claim names the load it was measured under: make bench runs
	// this program at several.
	at := fmt.Sprintf(", %s clients over %s keys", hd[1], hd[2])
	m := ratioRE.FindStringSubmatch(text)
	if m == nil {
		return nil, missing("ratio to redis-benchmark")
	}
	ratio, rounds, target := num(m[1]), m[2], num(m[4])
	vsRaw := fmt.Sprintf("%.2fx (median of %s rounds: %s)", ratio, rounds, m[3])
	// Reports written before the CPU kept busy was printed have no lines.
	if b := busyRE.FindStringSubmatch(text); b != nil {
		vsRaw += fmt.Sprintf("; CPU kept busy, seconds a second (medians): redis-benchmark's side %s, Redis's thread %s of it; the sidecar's side %s, Redis %s; of %s CPUs",
			b[3], b[2], b[5], b[4], b[1])
	}
	// Reports written before the share was printed have no line.
	undecided := ""
	if u := undecidedRE.FindStringSubmatch(text); u != nil {
		undecided = fmt.Sprintf("; the sidecar's checks/s count its decisions only: at full load %s%% of its answers (median of the rounds: %s) were 503 at its %s deadline, checks queued past it, which the filter fails open", u[1], u[2], u[3])
		vsRaw += undecided
	}
	checks = append(checks, report.Check{
		Claim:    "the sidecar keeps up with raw Redis" + at,
		Target:   fmt.Sprintf(">= %.2fx the checks/s of redis-benchmark EVALSHA -P 1 in the same run", target),
		Measured: vsRaw,
		Holds:    ratioMet,
	})

	var cpu []float64
	for _, r := range sidecarRE.FindAllStringSubmatch(text, -1) {
		cpu = append(cpu, num(r[2]))
	}
	if len(cpu) == 0 {
		return nil, missing("sidecar round")
	}
	c := stat.Median(cpu)
	measured := fmt.Sprintf("%.1f µs (median of %d rounds)", c, len(cpu))
	if f := floorRE.FindStringSubmatch(text); f != nil {
		measured += fmt.Sprintf("; without Redis, each at its own full load: %s µs with the sidecar's handler deciding at once (%s checks/s), %s µs for its fasthttp server sending one fixed answer (%s checks/s)",
			f[1], f[2], f[3], f[4])
	}
	checks = append(checks, report.Check{
		Claim:    "the sidecar's CPU per check" + at,
		Target:   fmt.Sprintf("<= %g µs (the sidecar process at full load)", targetCPUus),
		Measured: measured,
		Holds:    cpuMet,
	})

	h, hf, ho := halfRE.FindStringSubmatch(text), halfFigRE.FindStringSubmatch(text), halfOwnRE.FindStringSubmatch(text)
	if h == nil || hf == nil || ho == nil {
		return nil, missing("half-rate run")
	}
	p99, late, target := num(hf[2]), num(ho[2]), num(hf[4])
	share := ""
	// Reports written before the share was printed have no line.
	if of := halfOfRE.FindStringSubmatch(text); of != nil {
		share = fmt.Sprintf("%s%% of the %s/s the sidecar answered at full load in the run; ", of[1], of[2])
	}
	checks = append(checks, report.Check{
		Claim:  "the sidecar's p99 at half the raw Redis rate" + at,
		Target: fmt.Sprintf("< %g ms (open loop, each check timed from when it was due)", target),
		Measured: fmt.Sprintf("%.1f ms at %s checks/s offered (%s%s/s answered, %s not decided); the load generator sent late by %.1f ms at p99, the sidecar's own decision p99 %s",
			p99, h[1], share, hf[1], hf[3], late, ho[1]),
		Holds: p99Met,
	})

	// Reports written before this phase was run have no lines.
	if o := ownHalfRE.FindStringSubmatch(text); o != nil {
		checks = append(checks, report.Check{
			Claim:  "the sidecar's p99 at half its own full-load rate" + at,
			Target: "none: the figure above at a load the sidecar sets, half what it answered at full load (open loop, each check timed from when it was due)",
			Measured: fmt.Sprintf("p50 %.1f ms, p99 %.1f ms at %s checks/s offered (%s/s answered, %s not decided); the load generator sent late by %.1f ms at p99, the sidecar's own decision p99 %s",
				num(o[3]), num(o[4]), o[1], o[2], o[5], num(o[7]), o[6]),
			Info: true,
		})
	}

	// Reports written before the raw rounds measured Redis have no line.
	if r := redisRE.FindStringSubmatch(text); r != nil {
		checks = append(checks, report.Check{
			Claim:    "Redis's CPU per check under the sidecar" + at,
			Target:   "none: against the same script under redis-benchmark EVALSHA -P 1 in the same run",
			Measured: fmt.Sprintf("%s µs under the sidecar's pipelines, %s µs under redis-benchmark (medians of the rounds)", r[1], r[2]),
			Info:     true,
		})
	}

	if r := rlsRpsRE.FindStringSubmatch(text); r != nil {
		cp := rlsCPURE.FindStringSubmatch(text)
		if cp == nil {
			return nil, missing("CPU ratio to envoyproxy/ratelimit")
		}
		checks = append(checks, report.Check{
			Claim:  "the sidecar beside RLS (envoyproxy/ratelimit)" + at,
			Target: "none: side by side on one Redis, every check allowed",
			Measured: fmt.Sprintf("sidecar / RLS: %sx checks/s; CPU per check %sx in the service, %sx in Redis (median of %s rounds)%s",
				r[1], cp[1], cp[2], r[2], undecided),
			Info: true,
		})
	}
	return checks, nil
}
