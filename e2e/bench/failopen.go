package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

// failPhase is one stretch of a fail-open run.
type failPhase struct {
	name   string
	outage bool
	warmup bool // not reported: connections and caches settle
	// enter puts Redis in this phase's state.
	enter func(ctx context.Context, b *rig.Backend, length time.Duration) error
}

var failPhases = []failPhase{
	{name: "warm-up", warmup: true, enter: func(context.Context, *rig.Backend, time.Duration) error { return nil }},
	{name: "Redis up", enter: func(context.Context, *rig.Backend, time.Duration) error { return nil }},
	{name: "Redis hung (CLIENT PAUSE)", outage: true, enter: func(ctx context.Context, b *rig.Backend, d time.Duration) error {
		// Every client's commands wait until the pause ends: the sidecar's
		// calls hang, as with a stalled server or a black-holed network.
		c := redis.NewClient(&redis.Options{Addr: b.Redis.Addr})
		defer c.Close()
		return c.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err()
	}},
	{name: "Redis up again", enter: func(context.Context, *rig.Backend, time.Duration) error { return nil }},
	{name: "Redis stopped (killed)", outage: true, enter: func(_ context.Context, b *rig.Backend, _ time.Duration) error { return b.Redis.Kill() }},
	{name: "Redis restarted (empty)", enter: func(ctx context.Context, b *rig.Backend, _ time.Duration) error { return b.Redis.Restart(ctx) }},
}

// phaseResult is one phase of one run.
type phaseResult struct {
	quietLat           []time.Duration
	quietOK, quietSent int
	noisyOK, noisySent int
	safetyDenied       int64
	failedOpen         map[string]int64
	start, end         time.Duration
}

func runFailOpen(ctx context.Context, e *env) (*report.Scenario, error) {
	// The quiet clients send enough for a p99 per phase to rest on a few
	// hundred requests.
	const quiet, quietRate, noisyRate = 10, 10.0, 300.0
	// Outages last longer than the phases around them, so that the safety
	// buckets' bursts weigh less against their rate.
	upPhase, outPhase := e.dur(2*time.Second), e.dur(3*time.Second)
	lengths := make([]time.Duration, len(failPhases))
	starts := make([]time.Duration, len(failPhases))
	var total time.Duration
	for i, ph := range failPhases {
		switch {
		case ph.warmup:
			lengths[i] = time.Second
		case ph.outage:
			lengths[i] = outPhase
		default:
			lengths[i] = upPhase
		}
		starts[i] = total
		total += lengths[i]
	}
	standard, small := bucket.Limit{Capacity: 20, Rate: 20}, bucket.Limit{Capacity: 1, Rate: 1}
	noisyKey := func(run int) string { return fmt.Sprintf("failopen-noisy-%d", run) }
	pl := plans{Default: "standard", Plans: map[string]bucket.Limit{"standard": standard, "small": small}, Clients: map[string]string{}}
	for run := 0; run < e.runs; run++ {
		pl.Clients[noisyKey(run)] = "small"
	}
	e.prog.Printf("failopen: starting redis, sidecar, gateway and 3 services x 3 replicas")
	b, err := rig.StartBackend(ctx, e.bin, pl.YAML())
	if err != nil {
		return nil, err
	}
	defer b.Close()
	edge, err := b.StartFront(ctx, rig.FrontOptions{
		Name:   "edge",
		Fleet:  services.Config{SafetyFactor: 10, Plans: pl.Lookup()},
		Filter: rig.Filter{Mode: "enforce"},
	})
	if err != nil {
		return nil, err
	}
	paths := servicePaths(rig.DefaultServices, "/items")
	results := make([][]phaseResult, e.runs) // [run][phase]
	for run := 0; run < e.runs; run++ {
		var streams []load.Stream
		for q := 0; q < quiet; q++ {
			streams = append(streams, load.Stream{Name: "quiet", Client: fmt.Sprintf("failopen-quiet-%d-%d", run, q), Rate: quietRate,
				Start: time.Duration(q) * time.Second / quiet / 2, Duration: total, Paths: paths})
		}
		streams = append(streams, load.Stream{Name: "noisy", Client: noisyKey(run), Rate: noisyRate, Duration: total, Paths: paths})

		// Redis changes state at each phase boundary while the load runs.
		type mark struct {
			at      time.Duration
			counter map[string]int64
			safety  int64
			err     error
		}
		marks := make(chan mark, len(failPhases)+1)
		runStart := time.Now()
		go func() {
			for i, ph := range failPhases {
				if wait := starts[i] - time.Since(runStart); wait > 0 {
					select {
					case <-time.After(wait):
					case <-ctx.Done():
						marks <- mark{err: ctx.Err()}
						return
					}
				}
				c, err := edge.Counters()
				m := mark{at: time.Since(runStart), counter: c, safety: safetyDenied(edge.Fleet, noisyKey(run)), err: err}
				if err == nil {
					if err := ph.enter(ctx, b, lengths[i]); err != nil {
						m.err = fmt.Errorf("%s: %w", ph.name, err)
					}
				}
				marks <- m
			}
		}()
		res, err := load.Run(ctx, load.Options{Target: edge.Gateway.Addr, Timeout: 5 * time.Second, Progress: func(el time.Duration, sent int64) {
			i := sort.Search(len(starts), func(i int) bool { return starts[i] > el }) - 1
			e.prog.Printf("failopen: run %d/%d, %s, %4.1fs/%v, %d requests sent", run+1, e.runs, failPhases[i].name, el.Seconds(), total, sent)
		}}, streams)
		if err != nil {
			return nil, err
		}
		var ms []mark
		for range failPhases {
			m := <-marks
			if m.err != nil {
				return nil, m.err
			}
			ms = append(ms, m)
		}
		endCounters, err := edge.Counters()
		if err != nil {
			return nil, err
		}
		ms = append(ms, mark{at: total, counter: endCounters, safety: safetyDenied(edge.Fleet, noisyKey(run))})
		phases := make([]phaseResult, len(failPhases))
		for i := range phases {
			phases[i] = phaseResult{start: ms[i].at, end: ms[i+1].at, failedOpen: failedOpenByReason(counterDelta(ms[i].counter, ms[i+1].counter)),
				safetyDenied: ms[i+1].safety - ms[i].safety}
		}
		// Each request belongs to the phase it was due in.
		for si := range res.Streams {
			s := &res.Streams[si]
			for _, sm := range s.Samples {
				i := sort.Search(len(phases), func(i int) bool { return phases[i].end > sm.Due })
				if i == len(phases) {
					i = len(phases) - 1
				}
				ph := &phases[i]
				if s.Name == "quiet" {
					ph.quietSent++
					if sm.Status == 200 {
						ph.quietOK++
						ph.quietLat = append(ph.quietLat, sm.Latency)
					}
				} else {
					ph.noisySent++
					if sm.Status == 200 {
						ph.noisyOK++
					}
				}
			}
		}
		results[run] = phases
		// The last phase restarted Redis; wait until the sidecar can decide
		// again before the next run.
		if err := waitReady(ctx, b); err != nil {
			return nil, err
		}
	}

	t := report.Table{
		Title: fmt.Sprintf("Redis hung, then stopped, under load: %d quiet clients at %g/s and a noisy client at %g/s over 3 services x 3 replicas (outages %v, other phases %v, median of %d runs)",
			quiet, quietRate, noisyRate, outPhase, upPhase, e.runs),
		Header: []string{"phase", "quiet answered 200", "quiet p50 ms", "quiet p99 ms", "added p50 vs Redis up", "added p99 vs Redis up", "noisy admitted/s", "limit on the noisy client", "noisy stopped by the safety limit", "checks failed open (reason)"},
	}
	capPerSec := 9 * 10 * small.Rate
	// The safety buckets start an outage full (the edge held the client to
	// its plan), so an outage also spends their bursts: 9 x 10 x capacity
	// over the phase.
	outageCap := capPerSec + 9*10*small.Capacity/outPhase.Seconds()
	var names []string
	var noisyPerSec []float64
	minOK, maxNoisyOutage := 1.0, 0.0
	// The baseline is the first phase with Redis up.
	base := slices.IndexFunc(failPhases, func(ph failPhase) bool { return !ph.warmup })
	var upP50, upP99 []time.Duration
	for _, r := range results {
		pc := stat.Percentiles(r[base].quietLat, 50, 99)
		upP50, upP99 = append(upP50, pc[0]), append(upP99, pc[1])
	}
	worstAdded50, worstAdded := time.Duration(math.MinInt64), time.Duration(math.MinInt64)
	for i, ph := range failPhases {
		if ph.warmup {
			continue
		}
		var okShare, p50, p99, added, added50, noisy, safety []float64
		reasons := map[string]int64{}
		for run, r := range results {
			p := r[i]
			okShare = append(okShare, float64(p.quietOK)/float64(max(p.quietSent, 1)))
			pc := stat.Percentiles(p.quietLat, 50, 99)
			p50, p99 = append(p50, float64(pc[0])), append(p99, float64(pc[1]))
			added = append(added, float64(pc[1]-upP99[run]))
			added50 = append(added50, float64(pc[0]-upP50[run]))
			noisy = append(noisy, float64(p.noisyOK)/(p.end-p.start).Seconds())
			safety = append(safety, float64(p.safetyDenied))
			for k, v := range p.failedOpen {
				reasons[k] += v
			}
		}
		ok, nps, add, add50 := stat.Median(okShare), stat.Median(noisy), time.Duration(stat.Median(added)), time.Duration(stat.Median(added50))
		addCell, add50Cell := "-", "-"
		if i != base {
			addCell, add50Cell = ms(add), ms(add50)
		}
		limit := fmt.Sprintf("edge: %g/s", small.Rate)
		if ph.outage {
			limit = fmt.Sprintf("safety: %.0f/s", outageCap)
		}
		t.Add(ph.name, fmt.Sprintf("%.1f%%", 100*ok), ms(time.Duration(stat.Median(p50))), ms(time.Duration(stat.Median(p99))), add50Cell, addCell,
			fmt.Sprintf("%.0f", nps), limit, fmt.Sprintf("%.0f", stat.Median(safety)), reasonSummary(reasons))
		names, noisyPerSec = append(names, ph.name), append(noisyPerSec, nps)
		if ph.outage {
			worstAdded = max(worstAdded, add)
			worstAdded50 = max(worstAdded50, add50)
			minOK = min(minOK, ok)
			maxNoisyOutage = max(maxNoisyOutage, nps)
		}
	}
	t.Notes = []string{
		fmt.Sprintf("Plans: quiet clients %g/s (burst %g), the noisy client %g/s (burst %g). While Redis is out, every check fails open and the services' coarse safety limit (10x the plan, per replica) is what is left: 9 replicas x 10 x %g/s = %.0f/s for the noisy client, plus the safety buckets' bursts (9 x 10 x %g) spread over the %v outage: %.0f/s. Failed-open counts are summed over the runs.",
			standard.Rate, standard.Capacity, small.Rate, small.Capacity, small.Rate, capPerSec, small.Capacity, outPhase, outageCap),
		"Latency runs from when a request was due to its answer; \"added\" is the phase's quiet percentile minus the same run's with Redis up. A request pays at most the wait for its check to fail, and nothing once the circuit breaker is open; the tail also pays for the extra work an outage brings (every request of the noisy client now reaches a service).",
	}
	chart := "failopen.png"
	var limits []float64
	for _, ph := range failPhases {
		if ph.warmup {
			continue
		}
		if ph.outage {
			limits = append(limits, outageCap)
		} else {
			limits = append(limits, small.Rate)
		}
	}
	if err := report.BarChart(filepath.Join(e.out, chart), "Noisy client admitted per second while Redis fails", "requests/s admitted (median of runs)", shortNames(names),
		[]report.Bars{{Name: "noisy client admitted", Values: noisyPerSec}, {Name: "its limit (edge plan, or the services' safety limit)", Values: limits}}); err != nil {
		return nil, err
	}
	return &report.Scenario{
		Title:  "Fail open: Redis hung and stopped mid-run",
		Claim:  "if Redis or the sidecar is unavailable, requests fail open after the 5 ms timeout and keep flowing, while the services' coarse safety limit (10x the plan rate) still caps a noisy client.",
		Method: "One gateway enforcing through the sidecar, services with only the 10x safety limit, under steady open-loop load. Redis changes state phase by phase: up; hung (CLIENT PAUSE ALL: commands wait, so the sidecar answers 503 at its own 3 ms deadline or the filter's 5 ms timeout passes); up again; killed (connections refused: the sidecar answers 503 at once); restarted empty. In both outages the filter's circuit breaker opens after a few failed checks, and requests then fail open at once without a callout (failed_open.circuit_open) until a probe gets an answer. Requests are counted in the phase they were due in; a first second with Redis up, before the phases, lets connections settle and is not reported.",
		Tables: []report.Table{t},
		Charts: []report.Chart{{File: chart, Alt: "noisy client's admitted rate per phase against the safety cap"}},
		Checks: []report.Check{
			{Claim: "requests keep flowing with Redis out", Target: ">= 99% of quiet requests answered 200", Measured: fmt.Sprintf("%.1f%% in the worst outage phase", 100*minOK), Holds: minOK >= 0.99},
			{Claim: "a check that cannot be answered costs at most the 5 ms timeout", Target: "added quiet p50 <= 5 ms", Measured: ms(worstAdded50) + " ms in the worst outage phase", Holds: worstAdded50 <= 5*time.Millisecond},
			{Claim: "the tail stays within the timeout too", Target: "added quiet p99 <= 5 ms + 1 ms", Measured: ms(worstAdded) + " ms in the worst outage phase", Holds: worstAdded <= 6*time.Millisecond},
			{Claim: "the safety limit still caps the noisy client", Target: fmt.Sprintf("<= %.0f/s admitted (9 x 10 x plan + bursts) of %.0f/s offered, 5%% for phase edges", outageCap, noisyRate),
				Measured: fmt.Sprintf("%.0f/s in the worst outage phase", maxNoisyOutage), Holds: maxNoisyOutage <= 1.05*outageCap},
		},
	}, nil
}

// safetyDenied counts client's requests the services' safety limits turned
// away.
func safetyDenied(f *services.Fleet, client string) int64 { return f.Client(client).SafetyDenied }

// failedOpenByReason picks the failed_open counters out of a delta.
func failedOpenByReason(d map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range d {
		if r, ok := strings.CutPrefix(k, "requests.failed_open."); ok && v > 0 {
			out[r] = v
		}
	}
	return out
}

func reasonSummary(m map[string]int64) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

func shortNames(ns []string) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i], _, _ = strings.Cut(n, " (")
	}
	return out
}

// waitReady polls the sidecar's /readyz until it can decide again.
func waitReady(ctx context.Context, b *rig.Backend) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return harness.WaitHTTP(wctx, nil, "http://"+b.SidecarAddr+"/readyz", http.StatusOK)
}
