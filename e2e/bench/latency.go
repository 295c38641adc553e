package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

// latencyPoint is one design at one rate in one run.
type latencyPoint struct {
	pct        [3]time.Duration // p50, p99, p99.9 of answered requests
	answered   int
	offered    int
	failedOpen int64
	elapsed    time.Duration
}

// measureLatency drives one front at rate for phase with clients open-loop
// clients.
func measureLatency(ctx context.Context, e *env, f *rig.Front, run, ri int, rate float64, clients int, phase time.Duration, paths []string, show bool) (latencyPoint, error) {
	var streams []load.Stream
	for c := 0; c < clients; c++ {
		streams = append(streams, load.Stream{Client: fmt.Sprintf("lat-%d-%d-%d", run, ri, c), Rate: rate / float64(clients),
			Start: load.Staggered(c, clients, rate/float64(clients)), Duration: phase, Paths: paths})
	}
	before, err := f.Counters()
	if err != nil {
		return latencyPoint{}, err
	}
	o := load.Options{Target: f.Gateway.Addr}
	if show {
		o.Progress = func(el time.Duration, sent int64) {
			e.prog.Printf("latency: run %d/%d, %g req/s on each gateway, %4.1fs/%v", run+1, e.runs, rate, el.Seconds(), phase)
		}
	}
	res, err := load.Run(ctx, o, streams)
	if err != nil {
		return latencyPoint{}, err
	}
	after, err := f.Counters()
	if err != nil {
		return latencyPoint{}, err
	}
	var lat []time.Duration
	pt := latencyPoint{elapsed: res.Elapsed, failedOpen: rig.FailedOpen(counterDelta(before, after))}
	for i := range res.Streams {
		s := &res.Streams[i]
		lat = append(lat, s.Latencies(200)...)
		pt.answered += s.Count(200)
		pt.offered += len(s.Samples) + s.Dropped
	}
	copy(pt.pct[:], stat.Percentiles(lat, 50, 99, 99.9))
	return pt, nil
}

func runLatency(ctx context.Context, e *env) (*report.Scenario, error) {
	rates := []float64{100, 200, 400, 800, 1600}
	const clients = 20
	// Each point's p99 should rest on at least ten requests beyond it:
	// 1000 requests, or 3 s at the higher rates.
	minSamples := 1000.0
	phaseAt := func(rate float64) time.Duration {
		return e.dur(max(3*time.Second, time.Duration(minSamples/rate*float64(time.Second))))
	}
	pl := plans{Default: "unlimited", Plans: map[string]bucket.Limit{"unlimited": unlimitedPlan}}
	e.prog.Printf("latency: starting redis, sidecar, two gateways")
	b, err := rig.StartBackend(ctx, e.bin, pl.YAML())
	if err != nil {
		return nil, err
	}
	defer b.Close()
	// The baseline: the same gateway with the filter off, so the
	// difference is what the limiter adds.
	off, err := b.StartFront(ctx, rig.FrontOptions{Name: "off", Filter: rig.Filter{Mode: "off"}})
	if err != nil {
		return nil, err
	}
	// The filter as shipped, its 5 ms callout timeout included.
	edge, err := b.StartFront(ctx, rig.FrontOptions{Name: "edge"})
	if err != nil {
		return nil, err
	}
	fronts := [2]*rig.Front{off, edge}
	names := [2]string{"without the limiter (filter off)", "with the limiter"}
	// points[rate][front] over runs
	points := make([][2][]latencyPoint, len(rates))
	// busy[rate] over runs: the share of the machine's CPU time its
	// processes used while both fronts ran at that rate.
	busy := make([][]float64, len(rates))
	paths := servicePaths(rig.DefaultServices, "/items")
	for run := 0; run < e.runs; run++ {
		for ri, rate := range rates {
			// Both designs at once, with the same schedule: whatever else
			// the machine does at that moment hits both alike.
			var wg sync.WaitGroup
			var errs [2]error
			var pts [2]latencyPoint
			cpu0 := report.ReadCPUTime()
			for f := 0; f < 2; f++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pts[f], errs[f] = measureLatency(ctx, e, fronts[f], run, ri, rate, clients, phaseAt(rate), paths, f == 0)
				}()
			}
			wg.Wait()
			if b := report.ReadCPUTime().BusySince(cpu0); b != nil {
				busy[ri] = append(busy[ri], *b)
			}
			for f := 0; f < 2; f++ {
				if errs[f] != nil {
					return nil, errs[f]
				}
				points[ri][f] = append(points[ri][f], pts[f])
			}
		}
	}

	t := report.Table{
		Title: fmt.Sprintf("Latency through the gateway with and without the limiter (open loop, %d clients per gateway, at least %.0f requests or %v per rate and run, median of %d runs)", clients, minSamples, e.dur(3*time.Second), e.runs),
		Header: []string{"offered req/s", "off p50", "off p99", "off p99.9", "limiter p50", "limiter p99", "limiter p99.9",
			"added p50", "added p99", "added p99.9", "failed open", "answered 200 off / limiter", "machine busy", "state"},
	}
	var xs, offP50, offP99, edgeP50, edgeP99 []float64
	var okX, okAdd50, okAdd99 []float64
	var rateNames []string
	worst, worstAt := time.Duration(0), -1 // the largest added p99 where the limiter kept up, and its rate's index
	unsaturated := 0
	var limiterFailing []string // the unsaturated rates at which the limiter's requests failed or failed open
	for ri, rate := range rates {
		med := func(f, i int) time.Duration {
			var ds []time.Duration
			for _, pt := range points[ri][f] {
				ds = append(ds, pt.pct[i])
			}
			return stat.MedianDuration(ds)
		}
		// Added latency per run (the two designs of the same run), then
		// the median over runs.
		var added [3]time.Duration
		for i := 0; i < 3; i++ {
			var ds []time.Duration
			for r := range points[ri][0] {
				ds = append(ds, points[ri][1][r].pct[i]-points[ri][0][r].pct[i])
			}
			added[i] = stat.MedianDuration(ds)
		}
		var fo, answered, answeredOff float64
		var foR []float64
		for _, pt := range points[ri][1] {
			foR = append(foR, float64(pt.failedOpen)/float64(max(pt.offered, 1)))
		}
		fo = stat.Median(foR)
		var ans [2][]float64
		for f := 0; f < 2; f++ {
			for _, pt := range points[ri][f] {
				ans[f] = append(ans[f], float64(pt.answered)/float64(max(pt.offered, 1)))
			}
		}
		answeredOff, answered = stat.Median(ans[0]), stat.Median(ans[1])
		// Saturated: the gateway without the limiter no longer keeps up
		// (requests fail or the tail explodes); past that the numbers
		// measure the machine's queue. Below it, a limiter whose requests
		// fail or whose checks miss their deadline fails the target: that
		// is the limiter's doing, not the machine's.
		state := "ok"
		switch {
		case answeredOff < 0.99 || med(0, 1) > 50*time.Millisecond:
			state = "saturated"
		case answered < 0.99 || fo > 0.01:
			state = "limiter failing"
			limiterFailing = append(limiterFailing, fmt.Sprintf("%.0f req/s (%.1f%% answered 200, %.2f%% failed open)", rate, 100*answered, 100*fo))
			unsaturated++
		default:
			unsaturated++
			if added[1] > worst || worstAt < 0 {
				worst, worstAt = added[1], ri
			}
		}
		t.Add(fmt.Sprintf("%.0f", rate), ms(med(0, 0)), ms(med(0, 1)), ms(med(0, 2)), ms(med(1, 0)), ms(med(1, 1)), ms(med(1, 2)),
			ms(added[0]), ms(added[1]), ms(added[2]), fmt.Sprintf("%.2f%%", 100*fo), fmt.Sprintf("%.1f%% / %.1f%%", 100*answeredOff, 100*answered), busyCell(busy[ri]), state)
		// The rates double from one to the next: evenly spaced names read
		// as a log scale with every rate labelled.
		xs, rateNames = append(xs, float64(ri)), append(rateNames, fmt.Sprintf("%.0f", rate))
		offP99, edgeP99 = append(offP99, stat.Ms(med(0, 1))), append(edgeP99, stat.Ms(med(1, 1)))
		offP50, edgeP50 = append(offP50, stat.Ms(med(0, 0))), append(edgeP50, stat.Ms(med(1, 0)))
		if state == "ok" {
			okX, okAdd50, okAdd99 = append(okX, float64(ri)), append(okAdd50, stat.Ms(added[0])), append(okAdd99, stat.Ms(added[1]))
		}
	}
	t.Notes = []string{
		"Latencies in ms, from when each request was due to the end of its answer, for requests answered 200. \"Added\" is the limiter's p-th percentile minus the same percentile without it, in the same run. Every request is allowed (an unlimited plan), so each one makes a callout: sidecar, Redis script, answer.",
		"\"Without the limiter\" is the same gateway with the filter loaded and its mode off (the gateway, like Envoy's configuration here, always has the filter; mode off skips the check). A rate is marked saturated when the gateway without the limiter answers fewer than 99% of its requests 200 or its p99 exceeds 50 ms: the machine no longer keeps up, limiter or not. Below that, a rate at which the limiter's gateway answers fewer than 99% 200 or more than 1% of its checks fail open is marked \"limiter failing\", and fails the target.",
		"Both gateways run at the same time, each at the offered rate, so the machine carries twice that. p99.9 rests on few samples (1000 requests per run at 100 req/s: the second largest).",
		"Machine busy: the share of the machine's CPU time (every CPU, /proc/stat) that its processes used while both gateways ran at that rate, median of the runs: everything on it shares those CPUs, the load generator and the services included, and as the share nears all of it every request waits for a CPU, with the limiter or without.",
	}
	chart1, chart2 := "latency.png", "latency-added.png"
	if err := report.LineChart(filepath.Join(e.out, chart1), "Latency through the gateway, with and without the limiter", "offered requests per second", "latency, ms (log scale)",
		[]report.Line{
			{Name: "p50 " + names[0], X: xs, Y: offP50}, {Name: "p50 " + names[1], X: xs, Y: edgeP50},
			{Name: "p99 " + names[0], X: xs, Y: offP99}, {Name: "p99 " + names[1], X: xs, Y: edgeP99},
		}, report.LineOptions{LogY: true, XNames: rateNames}); err != nil {
		return nil, err
	}
	charts := []report.Chart{{File: chart1, Alt: "p50 and p99 latency with and without the limiter by request rate"}}
	// The added latency only means something below saturation; past it the
	// numbers measure the queue, not the limiter.
	if len(okX) > 0 {
		if err := report.LineChart(filepath.Join(e.out, chart2), "Latency added by the limiter, below saturation", "offered requests per second", "added latency, ms",
			[]report.Line{{Name: "p50", X: okX, Y: okAdd50}, {Name: "p99", X: okX, Y: okAdd99}},
			report.LineOptions{Reference: &report.Reference{Name: "design goal: 2 ms at p99", Y: 2}, XNames: rateNames}); err != nil {
			return nil, err
		}
		charts = append(charts, report.Chart{File: chart2, Alt: "latency added by the limiter at p50 and p99, below saturation"})
	} else {
		os.Remove(filepath.Join(e.out, chart2)) // a previous run's
	}
	check := report.Check{Claim: "under 2 ms added at p99", Target: "added p99 < 2 ms below saturation, the limiter's gateway answering >= 99% 200 with <= 1% failed open"}
	switch {
	case unsaturated == 0:
		check.Measured = "every rate saturated this machine"
	case worstAt < 0:
		check.Measured = "the limiter failed at every unsaturated rate: " + strings.Join(limiterFailing, ", ")
	default:
		check.Measured = fmt.Sprintf("at most %s ms (at %.0f req/s, the machine %s busy) over %d unsaturated rates", ms(worst), rates[worstAt], busyCell(busy[worstAt]), unsaturated-len(limiterFailing))
		check.Holds = worst < 2*time.Millisecond && len(limiterFailing) == 0
		if len(limiterFailing) > 0 {
			check.Measured += "; the limiter failed at " + strings.Join(limiterFailing, ", ")
		}
	}
	return &report.Scenario{
		Title: "Latency budget: what the limiter adds",
		Claim: latencyClaim,
		Method: fmt.Sprintf("Two gateways side by side over identical services (no worker pool: they answer at once), one with the filter enforcing, one with it off, driven at the same time with the same schedule at each rate (%s req/s each) by %d open-loop clients spread over the three services; every request is allowed, so every one pays for a callout.",
			strings.Trim(strings.Join(strings.Fields(fmt.Sprint(rates)), ", "), "[]"), clients),
		Tables: []report.Table{t},
		Charts: charts,
		Checks: []report.Check{check},
	}, nil
}

// latencyClaim is what the scenario measures.
const latencyClaim = "under 2 ms added at p99 (the gateway makes one sidecar call, the sidecar one Redis round trip)."

// busyCell is the median of a rate's busy shares, or "-" when none was
// read.
func busyCell(shares []float64) string {
	if len(shares) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*stat.Median(shares))
}
