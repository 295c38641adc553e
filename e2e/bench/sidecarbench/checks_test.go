package main

import (
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
)

// sampleReport is the part of a report (as run writes it) that
// reportChecks reads.
const sampleReport = `sidecar build/sidecar on redis-server 127.0.0.1:34623; 50 clients, 10000 API keys; 2 CPUs, load average 2.30 1.87 1.53
beside it envoyproxy/ratelimit v1.4.1 (build/ratelimit) on the same Redis, loaded by rlsload over 2 HTTP/2 connections
every check is allowed (the script's writing path); redis-benchmark runs the same script and arguments

  round                            side  checks/s      p50       p99     p99.9  not decided  mean batch  Redis cmds/check  CPU µs/check: service  redis  load gen
      1    redis-benchmark EVALSHA -P 1     55804  0.751ms   1.919ms         -            -           1              5.00                      -   24.1      10.2
      1         sidecar over HTTP (wrk)     29523  1.563ms   3.249ms   4.660ms           64        11.2              5.00                   26.3   17.8       9.9
      1  envoyproxy/ratelimit over gRPC     11093  4.024ms  11.318ms  13.629ms            0           -              2.00                  107.4   14.5      40.4
      2    redis-benchmark EVALSHA -P 1     41046  1.175ms   1.767ms         -            -           1              5.00                      -   25.0      10.9
      2  envoyproxy/ratelimit over gRPC     11016  4.055ms  11.098ms  15.828ms            0           -              2.00                  108.8   15.6      41.0
      2         sidecar over HTTP (wrk)     29571  1.536ms   4.423ms   8.866ms          266        11.0              5.00                    8.4   17.9      10.4
      3    redis-benchmark EVALSHA -P 1     50947  0.863ms   1.495ms         -            -           1              5.00                      -   24.6      10.4
      3         sidecar over HTTP (wrk)     28134  1.700ms   3.361ms   4.400ms            1        11.4              5.00                    9.1   19.1      10.5
      3  sidecar deciding at once, no Redis (wrk)  61203  0.702ms   2.101ms   3.902ms            0           -              0.00                    7.2    0.0       6.1
      3       fasthttp, one fixed answer (wrk)  80112  0.551ms   1.870ms   3.311ms            0           -              0.00                    5.3    0.0       5.2

ratio sidecar / redis-benchmark, checks/s: median 0.55 over 3 rounds (0.53, 0.72, 0.55); target >= 0.80
not decided at full load, share of the sidecar's answers: median 0.1% over 3 rounds (0.1, 0.3, 0.0); 503 at its 4ms deadline, checks the filter fails open, which the sidecar's checks/s leave out
Redis's CPU per check, median of the rounds: 17.9 µs under the sidecar's pipelines, 24.6 µs under redis-benchmark -P 1
CPU kept busy, seconds a second, medians of the rounds (Redis runs its commands on one thread; every process shares the 2 CPUs):
  redis-benchmark's side: Redis 1.25, Redis and redis-benchmark 1.78 (35.0 µs a check)
  the sidecar's side: Redis 0.53, the sidecar, Redis and wrk 1.09 (38.7 µs a check)
the sidecar's CPU per check beside its floors, medians of the rounds: 9.1 µs; deciding at once without Redis 7.2 µs (61203 checks/s); one fixed answer 5.3 µs (80112 checks/s)
  each floor loaded as the sidecar is, at its own full load (a higher rate than the sidecar's); the sidecar's figure less the first is what deciding on Redis adds
ratio sidecar / envoyproxy/ratelimit, checks/s: median 2.67 over 3 rounds (2.66, 2.68, 2.67)
ratio sidecar / envoyproxy/ratelimit, CPU per check (medians of the rounds' ratios; below 1: the sidecar spends less):
  service 0.25 (0.25, 0.24, 0.25), Redis 1.23 (1.23, 1.15, 1.23), service + Redis 0.36 (0.36, 0.36, 0.37), load generator 0.25 (0.25, 0.25, 0.25)

at half the raw Redis rate, 25474 checks/s offered (open loop, timed from when each was due):
  the offer is 86% of the 29523 checks/s the sidecar answered at full load in this run (median of the rounds)
  answered 25400/s; p50 0.277ms, p99 1.500ms, p99.9 5.569ms; not decided 0; target p99 < 2 ms
  the sidecar's own decision latency (its histogram), p99 <= 1.000ms; the load generator's lateness in sending, p99 0.326ms

at half the sidecar's own full-load rate, 14762 checks/s offered (open loop, timed from when each was due; no target):
  answered 14750/s; p50 0.212ms, p99 0.941ms, p99.9 3.120ms; not decided 2
  the sidecar's own decision latency (its histogram), p99 <= 0.500ms; the load generator's lateness in sending, p99 0.180ms

targets, on the unrounded figures: ratio 0.5509 >= 0.8 not met; sidecar CPU per check 9.1 µs <= 10 met; p99 at half the raw rate 1.5 ms < 2 met
over the run, the hypervisor took 1.6% of the machine's CPU time (steal): time none of the processes above had
over the run, a vCPU stood still for 2.5 ms or more: 4 times, the longest 9.8 ms (a real-time thread pinned to each CPU woke that late)
run: started 2026-12-03T08:06:37Z, took 1m34s, load average 1.39 at the start, 1.81 at the end: go run ./e2e/bench/sidecarbench -out e2e/bench/results/sidecarbench.txt
`

func TestReportRun(t *testing.T) {
	r, err := reportRun(sampleReport)
	if err != nil {
		t.Fatal(err)
	}
	if r.Command != "go run ./e2e/bench/sidecarbench -out e2e/bench/results/sidecarbench.txt" || r.Took != 94*time.Second ||
		r.Started != time.Date(2026, 12, 3, 8, 6, 37, 0, time.UTC) || r.Load != [2]float64{1.39, 1.81} || r.Steal == nil || *r.Steal != 0.016 ||
		r.Stalls == nil || *r.Stalls != (report.Stalls{Count: 4, Longest: 9800 * time.Microsecond}) {
		t.Errorf("run %+v (steal %v, stalls %v)", r, r.Steal, r.Stalls)
	}
	none := strings.Replace(sampleReport, "4 times, the longest 9.8 ms", "none", 1)
	if r, err := reportRun(none); err != nil || r.Stalls == nil || *r.Stalls != (report.Stalls{}) {
		t.Errorf("a run without stalls: %v, stalls %v", err, r.Stalls)
	}
	noLine := strings.Replace(sampleReport, "over the run, a vCPU", "", 1)
	if r, err := reportRun(noLine); err != nil || r.Stalls != nil || r.Unwatched != "" {
		t.Errorf("a report written before the stalls' line was added: %v, stalls %v, unwatched %q", err, r.Stalls, r.Unwatched)
	}
	unwatched := strings.Replace(sampleReport, "over the run, a vCPU stood still for 2.5 ms or more: 4 times, the longest 9.8 ms (a real-time thread pinned to each CPU woke that late)",
		"over the run, the vCPUs were not watched: cpu 0: real-time priority: operation not permitted", 1)
	if r, err := reportRun(unwatched); err != nil || r.Stalls != nil || r.Unwatched != "cpu 0: real-time priority: operation not permitted" {
		t.Errorf("a run not watched: %v, stalls %v, unwatched %q", err, r.Stalls, r.Unwatched)
	}
	if _, err := reportRun(strings.Split(sampleReport, "run: ")[0]); err == nil {
		t.Error("a report without its run line gave a run")
	}
}

func TestReportChecks(t *testing.T) {
	checks, err := reportChecks(sampleReport)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		claim, measured string
		holds, info     bool
	}{
		{"the sidecar keeps up with raw Redis, 50 clients over 10000 keys", "0.55x (median of 3 rounds: 0.53, 0.72, 0.55); CPU kept busy, seconds a second (medians): redis-benchmark's side 1.78, Redis's thread 1.25 of it; the sidecar's side 1.09, Redis 0.53; of 2 CPUs; the sidecar's checks/s count its decisions only: at full load 0.1% of its answers (median of the rounds: 0.1, 0.3, 0.0) were 503 at its 4ms deadline, checks queued past it, which the filter fails open", false, false},
		{"the sidecar's CPU per check, 50 clients over 10000 keys", "9.1 µs (median of 3 rounds); without Redis, each at its own full load: 7.2 µs with the sidecar's handler deciding at once (61203 checks/s), 5.3 µs for its fasthttp server sending one fixed answer (80112 checks/s)", true, false},
		{"the sidecar's p99 at half the raw Redis rate, 50 clients over 10000 keys", "1.5 ms at 25474 checks/s offered (86% of the 29523/s the sidecar answered at full load in the run; 25400/s answered, 0 not decided); the load generator sent late by 0.3 ms at p99, the sidecar's own decision p99 <= 1.000ms", true, false},
		{"the sidecar's p99 at half its own full-load rate, 50 clients over 10000 keys", "p50 0.2 ms, p99 0.9 ms at 14762 checks/s offered (14750/s answered, 2 not decided); the load generator sent late by 0.2 ms at p99, the sidecar's own decision p99 <= 0.500ms", false, true},
		{"Redis's CPU per check under the sidecar, 50 clients over 10000 keys", "17.9 µs under the sidecar's pipelines, 24.6 µs under redis-benchmark (medians of the rounds)", false, true},
		{"the sidecar beside RLS (envoyproxy/ratelimit), 50 clients over 10000 keys", "sidecar / RLS: 2.67x checks/s; CPU per check 0.25x in the service, 1.23x in Redis (median of 3 rounds); the sidecar's checks/s count its decisions only: at full load 0.1% of its answers (median of the rounds: 0.1, 0.3, 0.0) were 503 at its 4ms deadline, checks queued past it, which the filter fails open", false, true},
	}
	if len(checks) != len(want) {
		t.Fatalf("%d checks, want %d: %+v", len(checks), len(want), checks)
	}
	for i, w := range want {
		c := checks[i]
		if c.Claim != w.claim || c.Measured != w.measured || c.Holds != w.holds || c.Info != w.info {
			t.Errorf("check %d = %+v, want %+v", i, c, w)
		}
	}

	// A report written before the share not decided was printed reads
	// as before, without it.
	i := strings.Index(sampleReport, "not decided at full load")
	j := i + strings.Index(sampleReport[i:], "\n") + 1
	if checks, err := reportChecks(sampleReport[:i] + sampleReport[j:]); err != nil || strings.Contains(checks[0].Measured, "decisions only") || !strings.HasSuffix(checks[0].Measured, "of 2 CPUs") {
		t.Errorf("without the share not decided: %v, %q", err, checks[0].Measured)
	}

	// Without RLS there is no comparison line, and a report from before
	// Redis was measured under redis-benchmark has no Redis line; without
	// the ratio the report is not one of this program's.
	noRLS := strings.Split(sampleReport, "Redis's CPU per check")[0] + "\n" + sampleReport[strings.Index(sampleReport, "at half"):]
	if checks, err := reportChecks(noRLS); err != nil || len(checks) != 4 {
		t.Errorf("without RLS: %d checks, %v", len(checks), err)
	}
	// A report from before the floors were measured gives the sidecar's
	// figure alone.
	noFloors := strings.Split(sampleReport, "the sidecar's CPU per check beside")[0] + sampleReport[strings.Index(sampleReport, "ratio sidecar / envoyproxy"):]
	if checks, err := reportChecks(noFloors); err != nil || checks[1].Measured != "9.1 µs (median of 3 rounds)" {
		t.Errorf("without the floors: %+v, %v", checks, err)
	}
	// A figure that rounds to its target is decided as measured: 0.7951
	// prints as 0.80 and does not meet ">= 0.80", 10.04 µs prints as
	// 10.0 and does not meet "<= 10".
	rounded := strings.NewReplacer("median 0.55 over", "median 0.80 over",
		"medians of the rounds: 9.1 µs", "medians of the rounds: 10.0 µs", "                    9.1   19.1", "                   10.0   19.1",
		"ratio 0.5509 >= 0.8 not met; sidecar CPU per check 9.1 µs <= 10 met", "ratio 0.7951 >= 0.8 not met; sidecar CPU per check 10.04 µs <= 10 not met").Replace(sampleReport)
	if checks, err := reportChecks(rounded); err != nil || checks[0].Holds || checks[1].Holds || !strings.HasPrefix(checks[0].Measured, "0.80x") || !strings.HasPrefix(checks[1].Measured, "10.0 µs") {
		t.Errorf("figures that round to their targets: %+v, %v", checks, err)
	}
	// A report from before the phase at half the sidecar's own rate has
	// no line for it.
	i = strings.Index(sampleReport, "at half the sidecar's own")
	j = strings.Index(sampleReport, "targets, on the unrounded")
	if checks, err := reportChecks(sampleReport[:i] + sampleReport[j:]); err != nil || len(checks) != 5 || strings.Contains(checks[3].Claim, "its own") {
		t.Errorf("without the phase at half the sidecar's own rate: %d checks, %v", len(checks), err)
	}
	noVerdicts := strings.Replace(sampleReport, "targets, on the unrounded", "", 1)
	if _, err := reportChecks(noVerdicts); err == nil {
		t.Error("a report without the verdicts' line gave checks")
	}
	if _, err := reportChecks("sidecar x; 50 clients, 10 API keys;\n"); err == nil {
		t.Error("a report without the figures gave checks")
	}
}

// The note beside the RLS comparison names the generator that loaded the
// sidecar: the Go one stands in when wrk is not installed.
func TestRLSNoteNamesTheLoader(t *testing.T) {
	for loader, says := range map[string]string{"wrk": "wrk is C and LuaJIT", "go": "the Go one is Go and fasthttp's client"} {
		note := rlsNote(config{loader: loader, concurrency: 50, rlsConns: 2, keys: 10000})
		if !strings.Contains(note, "HTTP/1.1 ("+loader+": 50 keep-alive connections") || !strings.Contains(note, "("+says+", rlsload Go") {
			t.Errorf("-load %s: the note does not say %q:\n%s", loader, says, note)
		}
	}
}
