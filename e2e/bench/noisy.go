package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/shadow"
)

// noisyParams shape the noisy-neighbour (canary) scenario.
type noisyParams struct {
	Quiet       int           // the other 95%
	QuietPlan   bucket.Limit  // their contract
	QuietRate   float64       // what each sends, steadily, per second
	NoisyPlan   bucket.Limit  // the noisy 5%'s contract
	NoisyBase   float64       // what it sends between bursts
	NoisyBurst  float64       // what it sends during a burst
	Phase       time.Duration // one design's share of a day
	BurstAt     time.Duration // burst start within the phase
	Burst       time.Duration // burst length
	Workers     int           // per replica
	ServiceTime time.Duration
	Queue       int
	Days        int
}

// defaultNoisy: 19 quiet clients at 1/s each and one noisy client (5%)
// with a plan of 10/s that bursts to 200/s, over services whose replicas
// each serve at most 10/s (one worker, 100 ms per request): 90/s for the
// fleet. Per-service limits let the burst through at 9 times the plan,
// past capacity with the quiet traffic (about 120%); the edge holds it to
// the plan, about a third of capacity with the quiet traffic. The rates
// are kept low so that the machine's CPU is not what is measured.
func defaultNoisy(e *env) noisyParams {
	return noisyParams{
		Quiet: 19, QuietPlan: bucket.Limit{Capacity: 10, Rate: 5}, QuietRate: 1,
		NoisyPlan: bucket.Limit{Capacity: 10, Rate: 10}, NoisyBase: 5, NoisyBurst: 200,
		Phase: e.dur(6 * time.Second), BurstAt: e.dur(1500 * time.Millisecond), Burst: e.dur(3 * time.Second),
		Workers: 1, ServiceTime: 100 * time.Millisecond, Queue: 64,
		Days: max(5, e.runs),
	}
}

var weekdays = []string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}

func dayName(i int) string {
	if i < len(weekdays) {
		return weekdays[i]
	}
	return fmt.Sprintf("day %d", i+1)
}

// quietKey is the key of quiet client q on day d through front f.
func quietKey(d, f, q int) string { return fmt.Sprintf("quiet-%d-%d-%d", d, f, q) }

func runNoisy(ctx context.Context, e *env) (*report.Scenario, error) {
	p := defaultNoisy(e)
	noisyKey := func(day, front int) string { return fmt.Sprintf("noisy-%d-%d", day, front) }
	pl := plans{Default: "standard", Plans: map[string]bucket.Limit{"standard": p.QuietPlan, "bulk": p.NoisyPlan}, Clients: map[string]string{}}
	var canary []string
	for d := 0; d < p.Days; d++ {
		for f := 0; f < 2; f++ {
			pl.Clients[noisyKey(d, f)] = "bulk"
		}
		canary = append(canary, noisyKey(d, 1))
	}
	e.prog.Printf("noisy: starting redis, sidecar, two gateways and 2 x 3 services x 3 replicas")
	b, err := rig.StartBackend(ctx, e.bin, pl.YAML())
	if err != nil {
		return nil, err
	}
	defer b.Close()
	fleet := services.Config{
		Limiter: services.LimiterEnforce, Plans: pl.Lookup(),
		Workers: p.Workers, Queue: p.Queue, ServiceTime: p.ServiceTime,
	}
	// The old design (ADR-001): no limiter at the edge, each replica limits
	// on its own.
	old, err := b.StartFront(ctx, rig.FrontOptions{Name: "per_service", Fleet: fleet, Filter: rig.Filter{Mode: "off"}})
	if err != nil {
		return nil, err
	}
	// The canary: the edge enforces the noisy clients only; everyone else
	// runs in shadow there and stays under the per-service limiters. The
	// rest of the filter configuration is as shipped.
	edge, err := b.StartFront(ctx, rig.FrontOptions{Name: "edge", Fleet: fleet, Filter: rig.Filter{CanaryClients: canary}})
	if err != nil {
		return nil, err
	}
	fronts := [2]*rig.Front{old, edge}
	designs := [2]string{"per-service limits", "edge limiter (canary)"}

	type day struct {
		p99, p50      [2]float64 // ms, NaN when no quiet request was answered 200
		served, sent  [2]int
		noisyAdmitted [2]int
		noisyOffered  [2]int
		failedOpen    [2]int64
	}
	days := make([]day, p.Days)
	var before [2]map[string]int64
	for f := range fronts {
		if before[f], err = fronts[f].Counters(); err != nil {
			return nil, err
		}
	}
	paths := servicePaths(rig.DefaultServices, "/items")
	for d := 0; d < p.Days; d++ {
		// The two designs take turns, the first alternating from day to
		// day: the bursts of one would otherwise load the machine under the
		// other.
		for k := 0; k < 2; k++ {
			f := (d + k) % 2
			var streams []load.Stream
			for q := 0; q < p.Quiet; q++ {
				streams = append(streams, load.Stream{Name: "quiet", Client: quietKey(d, f, q), Rate: p.QuietRate,
					Start: load.Staggered(q, p.Quiet, p.QuietRate), Duration: p.Phase, Paths: paths})
			}
			nk := noisyKey(d, f)
			streams = append(streams,
				load.Stream{Name: "noisy", Client: nk, Rate: p.NoisyBase, Duration: p.Phase, Paths: paths},
				load.Stream{Name: "noisy burst", Client: nk, Rate: p.NoisyBurst, Start: p.BurstAt, Duration: p.Burst, Paths: paths})
			res, err := load.Run(ctx, load.Options{Target: fronts[f].Gateway.Addr, Progress: func(el time.Duration, sent int64) {
				e.prog.Printf("noisy: %s (%d/%d), %s, %4.1fs/%v, %d requests sent", dayName(d), d+1, p.Days, designs[f], el.Seconds(), p.Phase, sent)
			}}, streams)
			if err != nil {
				return nil, err
			}
			var lat []time.Duration
			for i := range res.Streams {
				s := &res.Streams[i]
				if s.Name == "quiet" {
					lat = append(lat, s.Latencies(200)...)
					days[d].served[f] += s.Count(200)
					days[d].sent[f] += len(s.Samples) + s.Dropped
				} else {
					days[d].noisyAdmitted[f] += s.Count(200)
					days[d].noisyOffered[f] += len(s.Samples) + s.Dropped
				}
			}
			pct := stat.PercentilesMs(lat, 50, 99)
			days[d].p50[f], days[d].p99[f] = pct[0], pct[1]
			after, err := fronts[f].Counters()
			if err != nil {
				return nil, err
			}
			days[d].failedOpen[f] = rig.FailedOpen(counterDelta(before[f], after))
			before[f] = after
			// Let the fleet's queues drain before the next design runs.
			if err := drain(ctx, fronts[f].Fleet); err != nil {
				return nil, err
			}
		}
	}

	t := report.Table{
		Title: fmt.Sprintf("p99 latency of the other 95%% (%d clients at %g/s) while the noisiest 5%% bursts to %g/s for %v of every %v",
			p.Quiet, p.QuietRate, p.NoisyBurst, p.Burst, p.Phase),
		Header: []string{"day", "per-service p99 ms", "edge p99 ms", "edge / per-service", "per-service p50 ms", "edge p50 ms", "quiet served per-service", "quiet served edge", "noisy admitted per-service", "noisy admitted edge", "edge checks failed open"},
	}
	var x, ps, eg, ratios []float64
	var dayNames []string
	for d, dy := range days {
		r := dy.p99[1] / dy.p99[0]
		x, ratios = append(x, float64(d)), append(ratios, r)
		dayNames = append(dayNames, dayName(d))
		ps, eg = append(ps, dy.p99[0]), append(eg, dy.p99[1])
		t.Add(dayName(d), msv(dy.p99[0]), msv(dy.p99[1]), ratio(r), msv(dy.p50[0]), msv(dy.p50[1]),
			pctOf(dy.served[0], dy.sent[0]), pctOf(dy.served[1], dy.sent[1]),
			fmt.Sprintf("%d of %d", dy.noisyAdmitted[0], dy.noisyOffered[0]), fmt.Sprintf("%d of %d", dy.noisyAdmitted[1], dy.noisyOffered[1]), dy.failedOpen[1])
	}
	medRatio := stat.Median(ratios)
	t.Add("median", fmt.Sprintf("%.0f", stat.Median(ps)), fmt.Sprintf("%.0f", stat.Median(eg)), ratio(medRatio), "", "", "", "", "", "", "")
	capacity := float64(p.Workers) / p.ServiceTime.Seconds() * 9
	t.Notes = []string{fmt.Sprintf("Services: 3 x 3 replicas, each one worker holding a request for %v (the fleet serves at most %.0f/s) with up to %d waiting per replica. Plans: the quiet clients %g/s (burst %g), the noisy client %g/s (burst %g). Per-service limits admit the burst at up to 9 times the noisy plan, %.0f/s, past the fleet's capacity; the edge admits the plan. Latency is from when each request was due to its answer; only served (200) requests count, \"quiet served\" gives the share.",
		p.ServiceTime, capacity, p.Queue, p.QuietPlan.Rate, p.QuietPlan.Capacity, p.NoisyPlan.Rate, p.NoisyPlan.Capacity, 9*p.NoisyPlan.Rate)}

	rep := edge.Fleet.Shadow()
	sh := report.Table{
		Title:  shadowTitle + ": the edge's decisions for the other 95% (shadow mode) against the per-service limiters'",
		Header: []string{"requests compared", "agree", "edge would deny, service allowed", "edge would allow, service denied", "edge unknown (failed open)", "disagreement", "exit criterion", "edge would deny", "services denied"},
	}
	// How many of the shadowed requests either side denied: a comparison
	// in which neither denied anything agrees whatever either limiter
	// does, and shows nothing about the criterion.
	var edgeDeny, serviceDeny int64
	for d := 0; d < p.Days; d++ {
		for q := 0; q < p.Quiet; q++ {
			c := edge.Fleet.Client(quietKey(d, 1, q))
			edgeDeny, serviceDeny = edgeDeny+c.ShadowDeny, serviceDeny+c.LimiterDenied
		}
	}
	tot := rep.Total
	sh.Add(tot.Compared(), tot.Agree, tot.EdgeDenied, tot.EdgeAllowed, tot.Unknown, fmt.Sprintf("%.3f%%", 100*tot.DisagreementRate()),
		fmt.Sprintf("< %.1f%%: %s", 100*shadow.ExitCriterion, report.Met(rep.MeetsExitCriterion())), edgeDeny, serviceDeny)

	chart := "noisy.png"
	if err := report.LineChart(filepath.Join(e.out, chart), "p99 of the other 95% while the noisiest 5% bursts", "day", "p99 latency, ms (log scale)",
		[]report.Line{{Name: designs[0], X: x, Y: ps}, {Name: designs[1], X: x, Y: eg}}, report.LineOptions{LogY: true, XNames: dayNames}); err != nil {
		return nil, err
	}
	return &report.Scenario{
		Title: "Noisy neighbour: the canary table",
		Claim: noisyClaim,
		Method: fmt.Sprintf("Each \"day\" runs the same %v of traffic against both designs in turn (the first alternating from day to day), each on its own gateway and services: %d quiet clients sending %g/s each, and one noisy client sending %g/s that bursts to %g/s for %v. Per-service: the filter is off and every replica limits every client with its plan. Edge (the canary): the filter enforces the noisy client only (canary_clients) and runs everyone else in shadow; the per-service limiters stay. The services have finite capacity (a bounded worker pool with a fixed service time), so admitted excess turns into queueing for everyone.",
			p.Phase, p.Quiet, p.QuietRate, p.NoisyBase, p.NoisyBurst, p.Burst),
		Tables: []report.Table{t, sh},
		Charts: []report.Chart{{File: chart, Alt: "p99 latency of the quiet clients per day, per design"}},
		Checks: []report.Check{{
			Claim: "p99 for the other 95% falls by more than half under the edge limiter", Target: "edge / per-service p99 < 0.5",
			Measured: fmt.Sprintf("%s (median over %d days: %.0f ms → %.0f ms)", ratio(medRatio), p.Days, stat.Median(ps), stat.Median(eg)),
			Holds:    medRatio < 0.5,
		}},
	}, nil
}

// noisyClaim is what the noisy-neighbour scenario replays (README.md, "Why:
// one client at nine times its contract").
const noisyClaim = "with the edge limiter enforcing the noisiest 5% of clients, p99 for the other 95% falls by more than half (on the first day the noisiest were limited at the edge, it fell from 412 ms to 214 ms: README, \"Why: one client at nine times its contract\") and stays flat through the bursts."

// shadowTitle starts the title of the noisy scenario's shadow comparison.
const shadowTitle = "Shadow comparison during the canary"

// noisyDerived returns the checks read from the noisy scenario's tables:
// the shadow comparison against the rollout's exit criterion. They are
// derived from the saved table, not kept beside it, so that results saved
// before the check existed show it too.
func noisyDerived(s *report.Scenario) []report.Check {
	for _, t := range s.Tables {
		if !strings.HasPrefix(t.Title, shadowTitle) || len(t.Rows) != 1 {
			continue
		}
		cell := func(name string) string {
			if i := slices.Index(t.Header, name); i >= 0 && i < len(t.Rows[0]) {
				return t.Rows[0][i]
			}
			return ""
		}
		compared, rate, crit := cell("requests compared"), cell("disagreement"), cell("exit criterion")
		target, verdict, ok := strings.Cut(crit, ": ")
		if compared == "" || rate == "" || !ok {
			continue
		}
		c := report.Check{
			Claim:    "the edge's shadow decisions agree with the per-service limiters' (the rollout's exit criterion)",
			Target:   target + " of the compared decisions disagree",
			Measured: fmt.Sprintf("%s of %s compared", rate, compared),
			Holds:    verdict == "met",
		}
		// Agreement where neither side denied anything holds whatever
		// the limiters do: said, and not counted as the criterion met.
		edgeDeny, serviceDeny := cell("edge would deny"), cell("services denied")
		switch {
		case edgeDeny == "" || serviceDeny == "":
			c.Measured += "; the table does not say how many either side denied, so this run cannot show the criterion"
			c.Info, c.Holds = true, false
		case edgeDeny == "0" && serviceDeny == "0":
			c.Measured += ", none of them denied by either side (the shadowed clients stay within their plan), so this run cannot show the criterion: TestRolloutCanaryShadowEnforce (e2e) compares denials"
			c.Info, c.Holds = true, false
		default:
			c.Measured += fmt.Sprintf("; the edge would have denied %s of them, the services denied %s", edgeDeny, serviceDeny)
		}
		return []report.Check{c}
	}
	return nil
}

func pctOf(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// drain waits until no replica of f has a request waiting or in service.
func drain(ctx context.Context, f *services.Fleet) error {
	for {
		busy := false
		for _, s := range f.Services {
			for _, r := range s.Stats().Replicas {
				if r.Pool != nil && (r.Pool.Queued > 0 || r.Pool.InFlight > 0) {
					busy = true
				}
			}
		}
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
