package main

import (
	"context"
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

// An outage that comes and goes: Redis paused for flapPause in every
// flapEvery (startFlapping, with Redis's cron at flapHz so that a pause
// lasts its time) while one client bursts at five times its plan, within
// what this machine carries (the burst sweep's rate), through a gateway as
// shipped (on_failure open) and one with on_failure local, in turn. The
// sidecar answers the checks between the pauses and 503 to those a pause
// holds past its 4 ms deadline, so two deciders share the client's
// requests: Redis's bucket, and with "local" the proxy's own, which is
// charged for what the sidecar admits in between (filter/RATIONALE.md, "An
// outage that comes and goes"). From its first use on, the process admits
// the client at most its plan and one capacity more.

const (
	flapPause = 20 * time.Millisecond
	flapEvery = 200 * time.Millisecond
	// flapOffered is the client's rate: five times its plan, and within
	// the burst sweep's capacity on this machine with Redis up.
	flapOffered = 3000
	flapSenders = 40
)

const flappingClaim = "with on_failure local, an outage that comes and goes admits a client at most its plan and one capacity more: the proxy's bucket is charged for what the sidecar admits between the failures."

// flapFronts are the two gateways of a flapping run.
var flapFronts = []struct {
	name   string
	tag    string
	filter rig.Filter
}{{"on_failure open (as shipped)", "open", rig.Filter{}}, {"on_failure local", "local", rig.Filter{OnFailure: "local"}}}

func flapKey(tag string, run int) string { return fmt.Sprintf("flap-%s-%d", tag, run) }

func runFlapping(ctx context.Context, e *env) (*report.Scenario, error) {
	window := runWindow(e.dur(4*time.Second), flapOffered)
	plan := burstPlan(flapOffered)
	pl := plans{Default: "unlimited", Plans: map[string]bucket.Limit{"unlimited": unlimitedPlan}, Clients: map[string]string{}}
	for run := 0; run < e.runs; run++ {
		for _, f := range flapFronts {
			pl.addBurstClient(flapKey(f.tag, run), flapOffered)
		}
	}
	e.prog.Printf("flapping: starting redis, sidecar and two gateways (on_failure open, local)")
	b, err := rig.StartBackend(ctx, e.bin, pl.YAML())
	if err != nil {
		return nil, err
	}
	defer b.Close()
	fronts := make([]*rig.Front, len(flapFronts))
	for i, f := range flapFronts {
		// The local front changes on_failure, what this scenario measures.
		if fronts[i], err = b.StartFront(ctx, rig.FrontOptions{Name: "flap_" + f.tag, Filter: f.filter}); err != nil {
			return nil, err
		}
	}
	if err := settle(ctx, fronts); err != nil {
		return nil, err
	}
	runs := make([][]burstRun, len(flapFronts))
	local := make([][2]int64, e.runs) // local_allowed, local_denied per run of the local front
	for run := 0; run < e.runs; run++ {
		for i, f := range flapFronts {
			e.prog.Printf("flapping: %s, run %d of %d", f.name, run+1, e.runs)
			before, err := fronts[i].Counters()
			if err != nil {
				return nil, err
			}
			stop, err := startFlapping(ctx, b, flapPause, flapEvery)
			if err != nil {
				return nil, err
			}
			one, err := burstOnce(ctx, e.vcpus, b, fronts[i:i+1], flapKey(f.tag, run), plan, flapSenders, flapOffered, window)
			stop()
			if err != nil {
				return nil, err
			}
			after, err := fronts[i].Counters()
			if err != nil {
				return nil, err
			}
			if f.filter.OnFailure == "local" {
				local[run] = [2]int64{after["requests.local_allowed"] - before["requests.local_allowed"], after["requests.local_denied"] - before["requests.local_denied"]}
			}
			runs[i] = append(runs[i], one)
			// Each run starts with the sidecar answering and the breaker
			// closed, which the pauses can have left open.
			if err := settle(ctx, fronts[i:i+1]); err != nil {
				return nil, err
			}
		}
	}
	// The bound: the plan over the run, and one capacity more.
	bound := func(r burstRun) float64 { return r.Want + plan.Capacity }
	t := report.Table{
		Title: fmt.Sprintf("One client at %d req/s, %d senders together, on a plan of %g + %g/s; Redis paused %v in every %v; %d runs per gateway, taking turns (medians)",
			flapOffered, flapSenders, plan.Capacity, plan.Rate, flapPause, flapEvery, e.runs),
		Header: []string{"gateway", "sent", "plan allows", "admitted", "admitted/plan", "plan + one capacity", "failed open", "decided by the local bucket", "reached services = admitted", "runs within plan + one capacity"},
		Notes: []string{
			fmt.Sprintf("Redis is paused (CLIENT PAUSE ALL) for %v at the start of every %v of each run, its hz raised to %s meanwhile so that a pause ends within 2 ms of its time (at the default 10 it lasted until the cron's next run, up to 100 ms more): the sidecar decides the checks between the pauses and answers 503 at its 4 ms deadline to those a pause holds, and the filter's circuit breaker (as shipped) opens and closes with them. A request that fails goes through unlimited with on_failure open, and through the client's local bucket with on_failure local.", flapPause, flapEvery, flapHz),
			"\"plan allows\" is capacity + rate × the run's window; \"plan + one capacity\" is the most the local gateway may admit of the client from its bucket's first use (a bucket starts full, and its debt stops at minus the capacity). \"decided by the local bucket\" counts local_allowed + local_denied.",
		},
	}
	var checks []report.Check
	for i, f := range flapFronts {
		st := burstStep{Runs: runs[i]}
		within := 0
		for _, r := range runs[i] {
			if float64(r.Admitted) <= bound(r) {
				within++
			}
		}
		localCell := "-"
		if f.filter.OnFailure == "local" {
			var decided []float64
			for _, l := range local {
				decided = append(decided, float64(l[0]+l[1]))
			}
			localCell = fmt.Sprintf("%.0f", stat.Median(decided))
		}
		ratio := st.median(func(r burstRun) float64 { return float64(r.Admitted) / r.Want })
		boundRatio := st.median(func(r burstRun) float64 { return bound(r) / r.Want })
		t.Add(f.name,
			fmt.Sprintf("%.0f", st.median(func(r burstRun) float64 { return float64(r.Sent) })),
			fmt.Sprintf("%.0f", st.median(func(r burstRun) float64 { return r.Want })),
			fmt.Sprintf("%.0f", st.median(func(r burstRun) float64 { return float64(r.Admitted) })),
			fmt.Sprintf("%.3f", ratio), fmt.Sprintf("%.3f", boundRatio),
			fmt.Sprintf("%.1f%%", st.median(func(r burstRun) float64 { return 100 * float64(r.FailedOpen) / float64(r.Sent) })),
			localCell,
			fmt.Sprintf("%d of %d runs", st.reachedExactly(), len(runs[i])),
			fmt.Sprintf("%d of %d", within, len(runs[i])))
		c := report.Check{
			Claim:    "an outage that comes and goes: " + f.name,
			Measured: fmt.Sprintf("%.3fx the plan admitted (median of %d runs; plan + one capacity is %.3fx), %d of %d runs within it", ratio, len(runs[i]), boundRatio, within, len(runs[i])),
		}
		if f.filter.OnFailure == "local" {
			c.Target = fmt.Sprintf("admitted <= plan + one capacity (%g), in most of %d runs, Redis paused %v in every %v", plan.Capacity, len(runs[i]), flapPause, flapEvery)
			c.Holds = 2*within > len(runs[i])
		} else {
			c.Target = "none: failing open admits what the sidecar cannot decide"
			c.Info = true
		}
		checks = append(checks, c)
	}
	return &report.Scenario{
		Title:  "Flapping: an outage that comes and goes, on_failure open and local",
		Claim:  flappingClaim,
		Method: fmt.Sprintf("Redis, one sidecar and two gateways sharing them, each with its own services: one as shipped (on_failure open), one with on_failure local. One client with a fresh bucket per run sends %d req/s, %d senders together, for %v, through one gateway, then a new client through the other, %d runs each; Redis is paused for %v in every %v while each run lasts.", flapOffered, flapSenders, window, e.runs, flapPause, flapEvery),
		Tables: []report.Table{t},
		Checks: checks,
	}, nil
}
