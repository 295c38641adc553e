package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

// incidentParams shape the incident replay.
type incidentParams struct {
	Plan     bucket.Limit  // the client's contract
	Offered  float64       // requests per second, spread over the services
	Duration time.Duration // how long the client sends
	Runs     int
}

// defaultIncident: a client with a contract of 10 requests/s (burst 10)
// sends 180/s round-robin over 3 services x 3 replicas. Each replica sees
// 20/s, twice its per-replica limit, so every replica's bucket runs dry and
// admits its whole plan: 9 plans in total. 6 s keeps the burst a seventh of
// the contract.
func defaultIncident(e *env) incidentParams {
	return incidentParams{Plan: bucket.Limit{Capacity: 10, Rate: 10}, Offered: 180, Duration: e.dur(6 * time.Second), Runs: e.runs}
}

// replicaCount is one replica's view of the client.
type replicaCount struct {
	Service  string
	Received int64
	OK       int64
	Window   time.Duration // first to last arrival
}

// incidentRun is one design in one run.
type incidentRun struct {
	Design     string
	Offered    int           // requests sent
	Admitted   int           // 200s the client got
	Denied     int           // 429s
	Other      int           // anything else, failures included
	Window     time.Duration // the client's first to last send
	Contract   float64       // Capacity + Rate x Window: what the plan allows over the window
	Reached    int64         // requests that reached a service replica
	Served     int64         // requests a replica served (200)
	FailedOpen int64         // edge only: checks that failed open
	// Decided is, for the edge, how many requests the bucket in Redis
	// allowed (the sidecar's allowed decisions): the limiter's own
	// accuracy, whatever happened to the answer on its way back. A check
	// that timed out may still have taken a token, so the client's
	// admitted count lies between Decided - FailedOpen and
	// Decided + FailedOpen.
	Decided int64
	// Unavailable counts the checks the sidecar answered 503 because Redis
	// missed its deadline; Redis may still have run them, taking a token
	// the sidecar did not count as allowed.
	Unavailable int64
	Replicas    []replicaCount
}

// Ratio is admitted over contract.
func (r incidentRun) Ratio() float64 { return float64(r.Admitted) / r.Contract }

// measureIncident runs the two designs side by side, concurrently, runs
// times, each run with fresh client keys (so fresh buckets everywhere).
func measureIncident(ctx context.Context, e *env, p incidentParams) ([][2]incidentRun, error) {
	pl := plans{Default: "contract", Plans: map[string]bucket.Limit{"contract": p.Plan}}
	e.prog.Printf("incident: starting redis, sidecar, two gateways and 2 x 3 services x 3 replicas")
	b, err := rig.StartBackend(ctx, e.bin, pl.YAML())
	if err != nil {
		return nil, err
	}
	defer b.Close()
	old, err := b.StartFront(ctx, rig.FrontOptions{
		Name:  "per_service",
		Fleet: services.Config{Limiter: services.LimiterEnforce, Plans: pl.Lookup()},
		// The old design (ADR-001): no limiter at the edge, each replica
		// limits on its own.
		Filter: rig.Filter{Mode: "off"},
	})
	if err != nil {
		return nil, err
	}
	// The new design: the filter as shipped, the services keeping only
	// their safety limit.
	edge, err := b.StartFront(ctx, rig.FrontOptions{
		Name:  "edge",
		Fleet: services.Config{SafetyFactor: 10, Plans: pl.Lookup()},
	})
	if err != nil {
		return nil, err
	}
	fronts := [2]*rig.Front{old, edge}
	designs := [2]string{"per-service limits", "edge limiter"}

	var out [][2]incidentRun
	for run := 0; run < p.Runs; run++ {
		var res [2]incidentRun
		var errs [2]error
		var before [2]map[string]int64
		for i, f := range fronts {
			if before[i], err = f.Counters(); err != nil {
				return nil, err
			}
		}
		scBefore, err := b.SidecarMetrics()
		if err != nil {
			return nil, err
		}
		var wg sync.WaitGroup
		for i, f := range fronts {
			key := fmt.Sprintf("incident-%d-%d", run, i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := load.Options{Target: f.Gateway.Addr}
				if i == 0 {
					o.Progress = func(el time.Duration, sent int64) {
						e.prog.Printf("incident: run %d/%d, both designs, %4.1fs/%v, %d requests sent each", run+1, p.Runs, el.Seconds(), p.Duration, sent)
					}
				}
				lr, err := load.Run(ctx, o, []load.Stream{{
					Client: key, Rate: p.Offered, Duration: p.Duration, Paths: servicePaths(rig.DefaultServices, "/items"),
				}})
				if err != nil {
					errs[i] = err
					return
				}
				s := &lr.Streams[0]
				r := incidentRun{Design: designs[i], Offered: len(s.Samples) + s.Dropped, Admitted: s.Count(200), Denied: s.Count(429), Window: s.Window()}
				r.Other = r.Offered - r.Admitted - r.Denied
				r.Contract = p.Plan.Capacity + p.Plan.Rate*r.Window.Seconds()
				for _, svc := range f.Fleet.Services {
					for _, rep := range svc.Stats().Replicas {
						c := rep.Clients[key]
						r.Replicas = append(r.Replicas, replicaCount{Service: svc.Name, Received: c.Received, OK: c.OK, Window: c.Window()})
						r.Reached += c.Received
						r.Served += c.OK
					}
				}
				res[i] = r
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		after, err := edge.Counters()
		if err != nil {
			return nil, err
		}
		delta := counterDelta(before[1], after)
		res[1].FailedOpen, res[1].Unavailable = rig.FailedOpen(delta), delta["requests.failed_open.unavailable"]
		scAfter, err := settledMetrics(ctx, b)
		if err != nil {
			return nil, err
		}
		// Only the edge front's filter calls the sidecar.
		res[1].Decided = int64(scAfter[rig.SidecarAllowed] - scBefore[rig.SidecarAllowed])
		out = append(out, res)
	}
	return out, nil
}

func runIncident(ctx context.Context, e *env) (*report.Scenario, error) {
	p := defaultIncident(e)
	runs, err := measureIncident(ctx, e, p)
	if err != nil {
		return nil, err
	}
	t := report.Table{
		Title: fmt.Sprintf("One client over 3 services x 3 replicas: contract %g/s (burst %g), offered %g/s for %v (median of %d runs)",
			p.Plan.Rate, p.Plan.Capacity, p.Offered, p.Duration, len(runs)),
		Header: []string{"design", "contract (burst + rate x window)", "offered", "admitted", "ratio admitted/contract", "allowed by the Redis bucket", "failed open", "429", "reached a service"},
	}
	perRun := report.Table{
		Title:  "Every run",
		Header: []string{"run", "contract", "per-service admitted", "per-service ratio", "edge admitted", "edge ratio", "Redis bucket allowed", "bucket ratio", "edge failed open"},
	}
	var ratios [2][]float64
	var bucketRatios []float64
	for i, r := range runs {
		for d := range r {
			ratios[d] = append(ratios[d], r[d].Ratio())
		}
		br := float64(r[1].Decided) / r[1].Contract
		bucketRatios = append(bucketRatios, br)
		perRun.Add(i+1, fmt.Sprintf("%.1f", r[1].Contract), r[0].Admitted, ratio(r[0].Ratio()), r[1].Admitted, ratio(r[1].Ratio()),
			r[1].Decided, ratio(br), r[1].FailedOpen)
	}
	med := func(d int, f func(incidentRun) float64) float64 {
		var xs []float64
		for _, r := range runs {
			xs = append(xs, f(r[d]))
		}
		return stat.Median(xs)
	}
	var admitted, contract, offered [2]float64
	for d := 0; d < 2; d++ {
		contract[d] = med(d, func(r incidentRun) float64 { return r.Contract })
		offered[d] = med(d, func(r incidentRun) float64 { return float64(r.Offered) })
		admitted[d] = med(d, func(r incidentRun) float64 { return float64(r.Admitted) })
		decided, fo := "-", "-"
		if d == 1 {
			decided = fmt.Sprintf("%.0f (%s)", med(d, func(r incidentRun) float64 { return float64(r.Decided) }), ratio(stat.Median(bucketRatios)))
			fo = fmt.Sprintf("%.0f", med(d, func(r incidentRun) float64 { return float64(r.FailedOpen) }))
		}
		t.Add(runs[0][d].Design, fmt.Sprintf("%.1f", contract[d]), fmt.Sprintf("%.0f", offered[d]), fmt.Sprintf("%.0f", admitted[d]),
			ratio(stat.Median(ratios[d])), decided, fo, fmt.Sprintf("%.0f", med(d, func(r incidentRun) float64 { return float64(r.Denied) })),
			fmt.Sprintf("%.0f", med(d, func(r incidentRun) float64 { return float64(r.Reached) })))
	}
	t.Notes = []string{
		"Contract is what the plan allows over the client's actual sending window: the burst plus the rate times the window. Per-service: each of the 9 replicas gives the client a full bucket of its own. Edge: one bucket in Redis.",
		"\"Allowed by the Redis bucket\" is the sidecar's count of allowed decisions: the limiter's own accuracy. \"Failed open\" are checks the filter let through because the answer missed the 5 ms timeout (or the sidecar answered 503); those are admitted whatever the bucket said, by design, and the gateway counts them. \"Reached a service\" counts requests that arrived at any replica: under the edge limiter a rejected request never does.",
	}

	chart := "incident.png"
	if err := report.BarChart(filepath.Join(e.out, chart), "Incident replay: one client over 3 services x 3 replicas", "requests (median of runs)",
		[]string{"per-service limits", "edge limiter"},
		[]report.Bars{{Name: "offered", Values: offered[:]}, {Name: "contract", Values: contract[:]}, {Name: "admitted", Values: admitted[:]}}); err != nil {
		return nil, err
	}
	ps, eg := stat.Median(ratios[0]), stat.Median(ratios[1])
	return &report.Scenario{
		Title:  "Incident: one client spread over 3 services x 3 replicas",
		Claim:  incidentClaim,
		Method: fmt.Sprintf("Two gateways side by side, driven at the same time with the same open-loop traffic: one client sending %g requests/s round-robin over /orders, /billing and /accounts for %v. Per-service: the filter is off and every replica runs its own token bucket per client with the client's plan (ADR-001). Edge: the filter enforces the plan through the sidecar and Redis, and the services keep only the 10x safety limit. Each run uses a fresh client key.", p.Offered, p.Duration),
		Tables: []report.Table{t, perRun},
		Charts: []report.Chart{{File: chart, Alt: "offered, contract and admitted requests per design"}},
		Checks: []report.Check{
			{Claim: "per-service limits admit ~9x the contract", Target: "9x (3 services x 3 replicas), within 5%", Measured: ratio(ps), Holds: math.Abs(ps/9-1) <= 0.05},
			{Claim: "one bucket in Redis allows the contract", Target: "1.0x within 5%", Measured: ratio(stat.Median(bucketRatios)), Holds: math.Abs(stat.Median(bucketRatios)-1) <= 0.05},
			{Claim: "the edge limiter admits the contract (fail-opens included)", Target: "1.0x within 5%", Measured: fmt.Sprintf("%s, %.0f failed open", ratio(eg), med(1, func(r incidentRun) float64 { return float64(r.FailedOpen) })), Holds: math.Abs(eg-1) <= 0.05},
		},
	}, nil
}

// settledMetrics reads the sidecar's metrics once they stop moving: a check
// the filter gave up on (timeout) may still be decided after the client had
// its answer.
func settledMetrics(ctx context.Context, b *rig.Backend) (map[string]float64, error) {
	last, err := b.SidecarMetrics()
	if err != nil {
		return nil, err
	}
	for i := 0; i < 40; i++ {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		m, err := b.SidecarMetrics()
		if err != nil {
			return nil, err
		}
		if m[rig.SidecarAllowed] == last[rig.SidecarAllowed] && m[rig.SidecarDenied] == last[rig.SidecarDenied] {
			return m, nil
		}
		last = m
	}
	return last, nil
}

// incidentClaim is what the incident scenario replays (README.md, "Why:
// one client at nine times its contract").
const incidentClaim = "per-service limits multiply with services and replicas (in the incident the README describes, a client spread over 3 services x 3 replicas was admitted at 9x its contract); one bucket per client at the edge holds the contract within 5%."
