package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

// runThroughput measures how many requests per second the gateway answers
// on each of the filter's paths, closed loop: a denial from the filter's
// shared deny cache (no callout), a request checked by a callout and
// forwarded, and the same request with the filter off.
func runThroughput(ctx context.Context, e *env) (*report.Scenario, error) {
	const workers, calloutTimeoutMs = 16, 250
	phase := e.dur(2 * time.Second)
	// Clients not listed (the callout-deny path's, a new one each request)
	// are on the tiny plan.
	p := plans{
		Default: "tiny",
		Plans: map[string]bucket.Limit{
			"unlimited": unlimitedPlan,
			"tiny":      {Capacity: 1, Rate: 0.001}, // one token per 1000 s: denied for the whole run
		},
		Clients: map[string]string{"tp-allow": "unlimited", "tp-deny": "tiny"},
	}
	e.prog.Printf("throughput: starting redis, sidecar, two gateways")
	b, err := rig.StartBackend(ctx, e.bin, p.YAML(), "-redis-timeout", fmt.Sprintf("%dms", calloutTimeoutMs-50))
	if err != nil {
		return nil, err
	}
	defer b.Close()
	// Two changes to the shipped filter configuration. POST /orders costs
	// 2 tokens (this scenario's own rule in place of the shipped ones), more
	// than the tiny plan's capacity: the sidecar denies it whatever the
	// bucket holds, by one run of the script (its own deny cache answers
	// only costs within the capacity), and sent by a new client each time
	// it finds no entry in the filter's deny cache, so each one is a
	// callout. The callout timeout is raised from 5 ms: at full load the
	// callouts queue past 5 ms and fail open, which would measure the
	// timeout instead of the path.
	edge, err := b.StartFront(ctx, rig.FrontOptions{Name: "edge", Filter: rig.Filter{TimeoutMs: calloutTimeoutMs,
		Costs: []rig.Cost{{Method: "POST", PathPrefix: "/orders", Cost: 2}}}})
	if err != nil {
		return nil, err
	}
	// The same gateway without the limiter, the "filter off" path.
	off, err := b.StartFront(ctx, rig.FrontOptions{Name: "off", Filter: rig.Filter{Mode: "off"}})
	if err != nil {
		return nil, err
	}

	type path struct {
		name, desc string
		front      *rig.Front
		method     string
		services   []string
		key        string // the client's; "" for a new client each request
		rates      []float64
		p50, p99   []time.Duration
		callouts   []float64 // per request
		failedOpen int64
		statuses   map[int]int
	}
	all := rig.DefaultServices
	paths := []*path{
		{name: "cached deny", desc: "429 from the filter's deny cache, no callout", front: edge, method: "GET", services: all, key: "tp-deny"},
		{name: "callout deny", desc: "one callout (one Redis script), 429 from the sidecar: a new client each request, its cost above the capacity", front: edge, method: "POST", services: []string{"orders"}},
		{name: "callout allow", desc: "one callout (one Redis script), allowed, forwarded to a service", front: edge, method: "GET", services: all, key: "tp-allow"},
		{name: "filter off", desc: "no check, forwarded (the same gateway without the limiter)", front: off, method: "GET", services: all, key: "tp-allow"},
	}
	// One denial from the sidecar fills the deny cache.
	if _, err := load.Closed(ctx, edge.Gateway.Addr, 1, 200*time.Millisecond, func(int, int) (string, string, string) {
		return "GET", "/orders/warm", "tp-deny"
	}); err != nil {
		return nil, err
	}
	for _, pa := range paths {
		pa.statuses = map[int]int{}
	}
	for run := 0; run < e.runs; run++ {
		// Rotate the order so that no path always runs first or last.
		for i := range paths {
			pa := paths[(i+run)%len(paths)]
			e.prog.Printf("throughput: run %d/%d, %s, %d workers for %v", run+1, e.runs, pa.name, workers, phase)
			before, err := pa.front.Counters()
			if err != nil {
				return nil, err
			}
			res, err := load.Closed(ctx, pa.front.Gateway.Addr, workers, phase, func(w, i int) (string, string, string) {
				key := pa.key
				if key == "" {
					key = fmt.Sprintf("tp-new-%d-%d-%d", run, w, i)
				}
				return pa.method, fmt.Sprintf("/%s/%d", pa.services[i%len(pa.services)], i), key
			})
			if err != nil {
				return nil, err
			}
			after, err := pa.front.Counters()
			if err != nil {
				return nil, err
			}
			pa.rates = append(pa.rates, res.Rate())
			pct := stat.Percentiles(res.Latencies, 50, 99)
			pa.p50, pa.p99 = append(pa.p50, pct[0]), append(pa.p99, pct[1])
			delta := counterDelta(before, after)
			pa.callouts = append(pa.callouts, float64(callouts(delta))/float64(max(res.Requests, 1)))
			pa.failedOpen += rig.FailedOpen(delta)
			for k, v := range res.ByStatus {
				pa.statuses[k] += v
			}
		}
	}

	t := report.Table{
		Title:       fmt.Sprintf("Gateway throughput per filter path (closed loop, %d concurrent requests, %v per run, median of %d runs)", workers, phase, e.runs),
		TextColumns: 2,
		Header:      []string{"path", "what happens", "req/s", "vs callout deny", "p50 ms", "p99 ms", "callouts/request", "failed open", "answers"},
	}
	callout := stat.Median(paths[1].rates) // the same answer as a cached deny, through the sidecar
	var names []string
	var rates []float64
	for _, pa := range paths {
		r := stat.Median(pa.rates)
		names, rates = append(names, pa.name), append(rates, r)
		t.Add(pa.name, pa.desc, fmt.Sprintf("%.0f", r), ratio(r/callout), ms(stat.MedianDuration(pa.p50)), ms(stat.MedianDuration(pa.p99)),
			fmt.Sprintf("%.3f", stat.Median(pa.callouts)), pa.failedOpen, statusSummary(pa.statuses))
	}
	t.Notes = []string{"Everything (load generator, gateway, sidecar, Redis, services) shares this machine's cores; the ratios matter more than the absolute rates."}
	chart := "throughput.png"
	if err := report.BarChart(filepath.Join(e.out, chart), "Gateway throughput per filter path", "requests per second (median)", names,
		[]report.Bars{{Name: "req/s", Values: rates}}); err != nil {
		return nil, err
	}
	// The paths take turns within each run: the ratio is the median of
	// the runs' own ratios.
	var cachedVsCallout []float64
	for i := range paths[0].rates {
		cachedVsCallout = append(cachedVsCallout, paths[0].rates[i]/paths[1].rates[i])
	}
	vs := stat.Median(cachedVsCallout)
	return &report.Scenario{
		Title:  "Throughput: the filter's cached-deny path vs a callout",
		Claim:  throughputClaim,
		Method: fmt.Sprintf("%d closed-loop workers send requests for %v per path and run; the paths take turns within each run. Two clients with a plan of one token per 1000 s are denied: one's GETs from the deny cache (filled by one denial before the runs), and POST /orders (cost 2, above the capacity of 1) from a new client on the same plan each request, which the filter's deny cache has no entry for, by the sidecar every time (one run of the script: the sidecar's own deny cache answers only costs within the capacity). An unlimited client's GETs are checked and forwarded, with the filter enforcing and with it off. The filter's callout timeout is %d ms here instead of 5 (and the sidecar's Redis deadline 50 ms less), so that callouts queued at full load are waited for rather than failed open: the table measures the paths, not the timeouts. The callouts per request column comes from the filter's own counters on the gateway's admin /stats.", workers, phase, calloutTimeoutMs),
		Tables: []report.Table{t},
		Charts: []report.Chart{{File: chart, Alt: "gateway requests per second for each filter path"}},
		Checks: []report.Check{{
			Claim:    "cached denials need no callout and cost less than a check",
			Target:   "cached deny > 1x callout deny req/s (median of the runs' ratios), < 0.01 callouts/request",
			Measured: fmt.Sprintf("%s (runs: %s), %.3f callouts/request", ratio(vs), stat.Join(cachedVsCallout, 2, ", "), stat.Median(paths[0].callouts)),
			Holds:    vs > 1 && stat.Median(paths[0].callouts) < 0.01,
		}},
	}, nil
}

// statusSummary lists the status codes seen, e.g. "429: 1200".
func statusSummary(m map[int]int) string {
	s := ""
	for _, code := range []int{200, 429, 503, 0} {
		if n := m[code]; n > 0 {
			if s != "" {
				s += ", "
			}
			label := fmt.Sprint(code)
			if code == 0 {
				label = "failed"
			}
			s += fmt.Sprintf("%s: %d", label, n)
		}
	}
	for code, n := range m {
		if code != 200 && code != 429 && code != 503 && code != 0 {
			s += fmt.Sprintf(", %d: %d", code, n)
		}
	}
	return s
}

// throughputClaim is what the scenario measures.
const throughputClaim = "a client already denied is answered from the filter's shared deny cache without a callout, so denying is cheaper than checking."
