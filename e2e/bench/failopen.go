package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/internal/vcpustall"
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
	{name: "Redis flapping (CLIENT PAUSE 50 ms in every 150)", outage: true, enter: flap},
	{name: "Redis up after flapping", enter: func(context.Context, *rig.Backend, time.Duration) error { return nil }},
	{name: "Redis stopped (killed)", outage: true, enter: func(_ context.Context, b *rig.Backend, _ time.Duration) error { return b.Redis.Kill() }},
	{name: "Redis restarted (empty)", enter: func(ctx context.Context, b *rig.Backend, _ time.Duration) error { return b.Redis.Restart(ctx) }},
	{name: "Sidecar hung (SIGSTOP)", outage: true, enter: func(_ context.Context, b *rig.Backend, _ time.Duration) error {
		// The kernel still accepts the filter's connections, nothing
		// answers: each callout waits for the filter's own timeout.
		return b.Sidecar.Pause()
	}},
	{name: "Sidecar resumed", enter: func(_ context.Context, b *rig.Backend, _ time.Duration) error { return b.Sidecar.Resume() }},
}

// The flapping phase pauses Redis for failFlapPause in every failFlapEvery.
const (
	failFlapPause = 50 * time.Millisecond
	failFlapEvery = 150 * time.Millisecond
)

// flap pauses Redis for failFlapPause in every failFlapEvery until the
// phase's length d is over, in the background: an outage that comes and
// goes, in which the sidecar answers the checks that come between the
// pauses and 503 to those that wait through one past its 4 ms deadline.
// The first pause comes once Redis's cron runs at flapHz, up to 100 ms
// into the phase.
func flap(ctx context.Context, b *rig.Backend, d time.Duration) error {
	begun := time.Now()
	stop, err := startFlapping(ctx, b, failFlapPause, failFlapEvery)
	if err != nil {
		return err
	}
	time.AfterFunc(d-failFlapPause-time.Since(begun), stop)
	return nil
}

// flapHz is Redis's hz (its cron's runs a second) while it flaps. Redis
// ends a CLIENT PAUSE at the first run of its cron after the pause's time
// is up: at the default hz of 10, a pause of 20 ms held every client for 20
// to 120 ms, whichever the cron's phase gave, and one phase for a whole
// run when the period is a multiple of 100 ms. At 500, the most Redis
// takes, a pause ends within 2 ms of its time. The cron's runs cost an idle
// Redis about 2% of a core (0.06 s of CPU time in 3 s, against none at 10).
const flapHz = "500"

// startFlapping pauses every client of Redis (CLIENT PAUSE ALL) for pause
// at the start of each period every, from now until stop is called; a
// pause under way when stop is called runs to its end. Redis's hz is
// flapHz until then, and what it was once the last pause is over: stop
// returns then, so that the next startFlapping reads the hz it had.
func startFlapping(ctx context.Context, b *rig.Backend, pause, every time.Duration) (stop func(), err error) {
	c := redis.NewClient(&redis.Options{Addr: b.Redis.Addr})
	hz, err := c.ConfigGet(ctx, "hz").Result()
	var was int
	if err == nil {
		was, err = strconv.Atoi(hz["hz"])
	}
	if err == nil {
		err = c.ConfigSet(ctx, "hz", flapHz).Err()
	}
	if err == nil {
		// The cron's next run may still be one period of the old hz
		// away; from it on, it runs at flapHz.
		time.Sleep(time.Second / time.Duration(max(was, 1)))
		err = c.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err()
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	done, finished := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		defer close(finished)
		defer c.Close()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-done:
				// Held, like every command, until the cron has ended a
				// pause under way at flapHz.
				_ = c.ConfigSet(context.WithoutCancel(ctx), "hz", hz["hz"]).Err()
				return
			case <-ctx.Done():
				return
			}
			// A pause that fails leaves Redis up for one more period.
			_ = c.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err()
		}
	}()
	return func() {
		once.Do(func() { close(done) })
		<-finished
	}, nil
}

// breakerStates are the gateways of a fail-open run: the filter's circuit
// breaker as configured by default; turned off, so that every check during
// an outage makes its callout and waits for it to fail; and, breaker on,
// "on_failure": "local", so that a client whose plan an earlier answer gave
// is held to it by the proxy while the sidecar cannot answer.
var breakerStates = []struct {
	name   string     // as shown in the tables
	tag    string     // in client keys and the front's name
	filter rig.Filter // its changes to the shipped configuration
}{{"on", "on", rig.Filter{}}, {"off", "off", rig.Filter{BreakerOff: true}}, {"on, local", "local", rig.Filter{OnFailure: "local"}}}

// phaseResult is one phase of one run on one gateway.
type phaseResult struct {
	quietLat           []time.Duration
	quietOK, quietSent int
	noisyOK, noisySent int
	safetyDenied       int64
	failedOpen         map[string]int64
	start, end         time.Duration
	// stalls are the vCPU stalls of vcpustall.BreaksACallout or more
	// within the phase, and quietInStalls its quiet requests answered 200
	// that waited through one: both -1 where the vCPUs were not watched.
	stalls, quietInStalls int64
}

// failMark is what a fail-open run reads at a phase boundary, per gateway.
type failMark struct {
	at      time.Duration
	counter []map[string]int64
	safety  []int64
	err     error
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
	noisyKey := func(run, f int) string { return fmt.Sprintf("failopen-%s-noisy-%d", breakerStates[f].tag, run) }
	pl := plans{Default: "standard", Plans: map[string]bucket.Limit{"standard": standard, "small": small}, Clients: map[string]string{}}
	for run := 0; run < e.runs; run++ {
		for f := range breakerStates {
			pl.Clients[noisyKey(run, f)] = "small"
		}
	}
	e.prog.Printf("failopen: starting redis, sidecar, three gateways (breaker on, off, on with on_failure local) and 3 x 3 services x 3 replicas")
	b, err := rig.StartBackend(ctx, e.bin, pl.YAML())
	if err != nil {
		return nil, err
	}
	defer b.Close()
	fronts := make([]*rig.Front, len(breakerStates))
	for f, bs := range breakerStates {
		if fronts[f], err = b.StartFront(ctx, rig.FrontOptions{
			Name:  "breaker_" + bs.tag,
			Fleet: services.Config{SafetyFactor: 10, Plans: pl.Lookup()},
			// As shipped, but for the breaker_off front: with the breaker
			// off every outage request waits for its own check to fail,
			// which is what the breaker is measured against; and the
			// breaker_local front, whose on_failure is what it measures.
			Filter: bs.filter,
		}); err != nil {
			return nil, err
		}
	}
	readMark := func(at time.Duration, run int) failMark {
		m := failMark{at: at}
		for f, fr := range fronts {
			c, err := fr.Counters()
			if err != nil {
				m.err = err
				return m
			}
			m.counter = append(m.counter, c)
			m.safety = append(m.safety, safetyDenied(fr.Fleet, noisyKey(run, f)))
		}
		return m
	}
	paths := servicePaths(rig.DefaultServices, "/items")
	results := make([][][]phaseResult, e.runs) // [run][gateway][phase]
	for run := 0; run < e.runs; run++ {
		// Redis (or the sidecar) changes state at each phase boundary while
		// the load runs on both gateways at once.
		marks := make(chan failMark, len(failPhases)+1)
		runStart := time.Now()
		go func() {
			for i, ph := range failPhases {
				if wait := starts[i] - time.Since(runStart); wait > 0 {
					select {
					case <-time.After(wait):
					case <-ctx.Done():
						marks <- failMark{err: ctx.Err()}
						return
					}
				}
				m := readMark(time.Since(runStart), run)
				if m.err == nil {
					if err := ph.enter(ctx, b, lengths[i]); err != nil {
						m.err = fmt.Errorf("%s: %w", ph.name, err)
					}
				}
				marks <- m
			}
		}()
		res := make([]*load.Result, len(fronts))
		errs := make([]error, len(fronts))
		var wg sync.WaitGroup
		for f, fr := range fronts {
			var streams []load.Stream
			// The quiet clients of all three gateways take turns, one
			// request every 1/(30 x 10/s) = 3.33 ms; the noisy clients send
			// in the gaps, halfway between two of them. Quiet requests due
			// together would queue behind each other, and a phase's p99,
			// its slowest 3 of 300, would rest on one such clump.
			for q := 0; q < quiet; q++ {
				streams = append(streams, load.Stream{Name: "quiet", Client: fmt.Sprintf("failopen-%s-quiet-%d-%d", breakerStates[f].tag, run, q), Rate: quietRate,
					Start: load.Staggered(q*len(fronts)+f, quiet*len(fronts), quietRate), Duration: total, Paths: paths})
			}
			streams = append(streams, load.Stream{Name: "noisy", Client: noisyKey(run, f), Rate: noisyRate,
				Start: load.Staggered(2*f+1, 2*len(fronts), noisyRate), Duration: total, Paths: paths})
			o := load.Options{Target: fr.Gateway.Addr, Timeout: 5 * time.Second}
			if f == 0 {
				o.Progress = func(el time.Duration, sent int64) {
					i := sort.Search(len(starts), func(i int) bool { return starts[i] > el }) - 1
					e.prog.Printf("failopen: run %d/%d, %s, %4.1fs/%v, %d requests sent per gateway", run+1, e.runs, failPhases[i].name, el.Seconds(), total, sent)
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[f], errs[f] = load.Run(ctx, o, streams)
			}()
		}
		wg.Wait()
		var ms []failMark
		for range failPhases {
			m := <-marks
			if m.err != nil {
				return nil, m.err
			}
			ms = append(ms, m)
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		end := readMark(total, run)
		if end.err != nil {
			return nil, end.err
		}
		ms = append(ms, end)
		watched := e.vcpus != nil && e.vcpus.Unavailable() == ""
		if watched {
			e.vcpus.Sync()
		}
		results[run] = make([][]phaseResult, len(fronts))
		for f := range fronts {
			phases := make([]phaseResult, len(failPhases))
			for i := range phases {
				phases[i] = phaseResult{start: ms[i].at, end: ms[i+1].at,
					failedOpen:   failedOpenByReason(counterDelta(ms[i].counter[f], ms[i+1].counter[f])),
					safetyDenied: ms[i+1].safety[f] - ms[i].safety[f],
					stalls:       -1, quietInStalls: -1}
				if watched {
					phases[i].stalls = int64(len(e.vcpus.Within(runStart.Add(ms[i].at), runStart.Add(ms[i+1].at), vcpustall.BreaksACallout)))
					phases[i].quietInStalls = 0
				}
			}
			// Each request belongs to the phase it was due in.
			for si := range res[f].Streams {
				s := &res[f].Streams[si]
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
							// Due counts from the load's start, just after
							// runStart, from which the phases' marks count.
							if due := runStart.Add(sm.Due); watched && e.vcpus.Broke(due, due.Add(sm.Latency)) {
								ph.quietInStalls++
							}
						}
					} else {
						ph.noisySent++
						if sm.Status == 200 {
							ph.noisyOK++
						}
					}
				}
			}
			results[run][f] = phases
		}
		// The last phases restarted Redis and resumed the sidecar; wait
		// until it can decide again before the next run.
		if err := waitReady(ctx, b); err != nil {
			return nil, err
		}
	}

	t := report.Table{
		Title: fmt.Sprintf("Redis hung, then flapping, then stopped, then the sidecar hung, under load, on three gateways at once (circuit breaker on; off; on with on_failure local): %d quiet clients at %g/s and a noisy client at %g/s over 3 services x 3 replicas each (outages %v, other phases %v, median of %d runs)",
			quiet, quietRate, noisyRate, outPhase, upPhase, e.runs),
		Header:      []string{"phase", "breaker", "quiet answered 200", "quiet p50 ms", "quiet p99 ms", "added p50 vs Redis up", "added p99 vs Redis up", "noisy admitted/s", "limit on the noisy client", "noisy stopped by the safety limit", "checks failed open (reason)", "vCPU stalls >= 2.5 ms (quiet requests waiting through them)"},
		TextColumns: 2,
	}
	capPerSec := 9 * 10 * small.Rate
	// The safety buckets start an outage full (the edge held the client to
	// its plan), so an outage also spends their bursts: 9 x 10 x capacity
	// over the phase.
	outageCap := capPerSec + 9*10*small.Capacity/outPhase.Seconds()
	// The baseline is the first phase with Redis up, per gateway and run.
	base := slices.IndexFunc(failPhases, func(ph failPhase) bool { return !ph.warmup })
	// Latencies here are in ms, NaN for a phase in which no quiet request
	// was answered 200 (stat.PercentilesMs): the checks below then fail for
	// it rather than read 0.
	type outageFigures struct {
		phase           string
		added50, added  float64 // ms
		ok, noisyPerSec float64
		stalls          string // by run: stalls (quiet requests in them)
	}
	var names []string
	noisyPerSec := make([][]float64, len(fronts))
	p50s := make([][]float64, len(fronts))
	var budget []float64
	outages := make([][]outageFigures, len(fronts))
	for i, ph := range failPhases {
		if ph.warmup {
			continue
		}
		names = append(names, ph.name)
		for f := range fronts {
			var okShare, p50, p99, added, added50, noisy, safety, upP50, stalls, inStalls []float64
			reasons := map[string]int64{}
			for _, byFront := range results {
				r := byFront[f]
				p := r[i]
				up := stat.PercentilesMs(r[base].quietLat, 50, 99)
				okShare = append(okShare, float64(p.quietOK)/float64(max(p.quietSent, 1)))
				pc := stat.PercentilesMs(p.quietLat, 50, 99)
				p50, p99 = append(p50, pc[0]), append(p99, pc[1])
				added = append(added, pc[1]-up[1])
				added50 = append(added50, pc[0]-up[0])
				upP50 = append(upP50, up[0])
				noisy = append(noisy, float64(p.noisyOK)/(p.end-p.start).Seconds())
				safety = append(safety, float64(p.safetyDenied))
				stalls, inStalls = append(stalls, float64(p.stalls)), append(inStalls, float64(p.quietInStalls))
				for k, v := range p.failedOpen {
					reasons[k] += v
				}
			}
			ok, nps, add, add50 := stat.Median(okShare), stat.Median(noisy), stat.Median(added), stat.Median(added50)
			addCell, add50Cell := "-", "-"
			if i != base {
				addCell, add50Cell = msv(add), msv(add50)
			}
			stallCell, byRun := "not watched", "not watched"
			if n := stat.Median(stalls); n >= 0 {
				stallCell = fmt.Sprintf("%.0f (%.0f)", n, stat.Median(inStalls))
				var runs []string
				for k := range stalls {
					runs = append(runs, fmt.Sprintf("%.0f (%.0f)", stalls[k], inStalls[k]))
				}
				byRun = strings.Join(runs, ", ")
			}
			limit := fmt.Sprintf("edge: %g/s", small.Rate)
			if ph.outage {
				limit = fmt.Sprintf("safety: %.0f/s", outageCap)
			}
			t.Add(ph.name, breakerStates[f].name, fmt.Sprintf("%.1f%%", 100*ok), msv(stat.Median(p50)), msv(stat.Median(p99)), add50Cell, addCell,
				fmt.Sprintf("%.0f", nps), limit, fmt.Sprintf("%.0f", stat.Median(safety)), reasonSummary(reasons), stallCell)
			noisyPerSec[f] = append(noisyPerSec[f], nps)
			p50s[f] = append(p50s[f], stat.Median(p50))
			if f == 0 {
				budget = append(budget, stat.Median(upP50)+5)
			}
			if ph.outage {
				outages[f] = append(outages[f], outageFigures{phase: ph.name, added50: add50, added: add, ok: ok, noisyPerSec: nps, stalls: byRun})
			}
		}
	}
	const on, off, local = 0, 1, 2
	// worst returns the outage phase of gateway f where by is largest, or
	// the first where it is NaN (no quiet request answered 200): that
	// phase fails the checks below.
	worst := func(f int, by func(outageFigures) float64) (outageFigures, int) {
		w := 0
		for k, o := range outages[f] {
			if math.IsNaN(by(outages[f][w])) {
				break
			}
			if math.IsNaN(by(o)) || by(o) > by(outages[f][w]) {
				w = k
			}
		}
		return outages[f][w], w
	}
	// maxNoisy is over the gateways that fail open (on_failure "open"),
	// maxLocal over the one that holds known clients to their plan.
	minOK, maxNoisy, maxLocal := 1.0, 0.0, 0.0
	for f := range fronts {
		for _, o := range outages[f] {
			minOK = min(minOK, o.ok)
			if breakerStates[f].filter.OnFailure == "local" {
				maxLocal = max(maxLocal, o.noisyPerSec)
			} else {
				maxNoisy = max(maxNoisy, o.noisyPerSec)
			}
		}
	}
	// With on_failure "local" the noisy client's plan (learned from the
	// sidecar's answers before the outage) is enforced by the one gateway
	// it goes through: at most a full local bucket plus the refill over the
	// outage, and the phase's two edges, where a request due in the outage
	// can still be decided by the sidecar (at the same plan): one each.
	localCap := (small.Capacity + small.Rate*outPhase.Seconds() + 2) / outPhase.Seconds()
	w50, k50 := worst(off, func(o outageFigures) float64 { return o.added50 })
	w99, k99 := worst(off, func(o outageFigures) float64 { return o.added })
	on50, on99 := outages[on][k50], outages[on][k99]
	short := func(phase string) string { n, _, _ := strings.Cut(phase, " ("); return n }
	t.Notes = []string{
		fmt.Sprintf("Plans: quiet clients %g/s (burst %g), the noisy client %g/s (burst %g). While Redis or the sidecar is out, every check fails open and the services' coarse safety limit (10x the plan, per replica) is what is left: 9 replicas x 10 x %g/s = %.0f/s for the noisy client, plus the safety buckets' bursts (9 x 10 x %g) spread over the %v outage: %.0f/s. Failed-open counts are summed over the runs.",
			standard.Rate, standard.Capacity, small.Rate, small.Capacity, small.Rate, capPerSec, small.Capacity, outPhase, outageCap),
		"Three gateways, each with its own services and its own client keys, run the same traffic at the same time on one Redis and one sidecar. Breaker on: the filter's default circuit breaker (20 failures in a row open it). Breaker on, on_failure local: the same, but a request that fails open goes through the client's local token bucket, with the plan the sidecar's earlier answers gave: the noisy client is held to its plan by the proxy instead of reaching the services' safety limit. Breaker off (\"breaker\": {\"failures\": 0}): every check makes its callout and waits for its answer, so the outage rows measure what a check that cannot be answered costs: the sidecar's 503 at its own 4 ms Redis deadline with Redis hung, the filter's 5 ms timeout with the sidecar hung, an immediate 503 with Redis refusing connections. With the breaker on, most outage requests skip the callout (circuit_open): the difference between the two rows is what the breaker saves.",
		"Redis flapping is an outage that comes and goes: the sidecar answers the checks between the pauses, so the noisy client's requests are decided by Redis for part of the phase and fail open for the rest. With the breaker on, each pause fails enough checks in a row to open it, and a probe that meets a pause doubles the time it stays open, so the noisy client goes through unlimited for much of the phase, and into the phase after it until a probe is answered (up to max_open_ms, 5 s). With on_failure local, the local bucket decides what fails open, and is charged for what the sidecar admits in between.",
		fmt.Sprintf("Latency runs from when a request was due to its answer; \"added\" is the phase's quiet percentile minus the same gateway's and run's with Redis up. It can be negative with the breaker open: those requests make no callout at all, while with Redis up each pays for one. The tail also pays for the extra work an outage brings (every request of the noisy clients now reaches a service, and with the breaker off every request makes a callout that waits). A check that waits out the 5 ms timeout adds the timeout less the callout it stands in for, plus how late the gateway's timer fires and the wake-ups of processes idle since: so with the sidecar hung and the breaker off the added p50 sits within a few tenths of a millisecond of 5 ms by construction, under it only where the timer is late by less than a callout takes. The quiet clients of the three gateways take turns, one request every %.2f ms between them, and the noisy clients send in the gaps: requests due together would queue behind each other, a wait no client sees.",
			1000/(quiet*quietRate*float64(len(breakerStates)))),
		fmt.Sprintf("vCPU stalls: a real-time thread per CPU (internal/vcpustall) counts the times within the phase that a vCPU stood still 2.5 ms or more; in brackets, the quiet requests answered 200 whose wait, from when they were due, took one in. A gateway's quiet clients send %.0f requests in an outage phase and %.0f in the others, so its p99 is where its slowest 1%% begin (%d and %d requests): that many held up by one stall move it by up to the stall's length. The targets stay what they are whatever the stalls.",
			quiet*quietRate*outPhase.Seconds(), quiet*quietRate*upPhase.Seconds(), int(math.Ceil(quiet*quietRate*outPhase.Seconds()/100)), int(math.Ceil(quiet*quietRate*upPhase.Seconds()/100))),
	}
	charts := []report.Chart{{File: "failopen.png", Alt: "noisy client's admitted rate per phase against the safety cap: breaker on, off, and on with on_failure local"},
		{File: "failopen-latency.png", Alt: "quiet clients' p50 per phase (breaker on, off, on with on_failure local) against Redis up plus the 5 ms timeout"}}
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
	if err := report.BarChart(filepath.Join(e.out, charts[0].File), "Noisy client admitted per second while Redis or the sidecar fails", "requests/s admitted (median of runs)", shortNames(names),
		[]report.Bars{{Name: "breaker on", Values: noisyPerSec[on]}, {Name: "breaker off", Values: noisyPerSec[off]}, {Name: "breaker on, on_failure local", Values: noisyPerSec[local]},
			{Name: "its limit (edge plan, or the services' safety limit)", Values: limits}}); err != nil {
		return nil, err
	}
	if err := report.BarChart(filepath.Join(e.out, charts[1].File), "Quiet clients' p50 while Redis or the sidecar fails", "ms (median of runs)", shortNames(names),
		[]report.Bars{{Name: "breaker on", Values: p50s[on]}, {Name: "breaker off", Values: p50s[off]}, {Name: "breaker on, on_failure local", Values: p50s[local]},
			{Name: "Redis up p50 + the 5 ms timeout", Values: budget}}); err != nil {
		return nil, err
	}
	return &report.Scenario{
		Title:  "Fail open: Redis hung, flapping, stopped, the sidecar hung mid-run; circuit breaker on and off, and on_failure local",
		Claim:  failOpenClaim,
		Method: "Three gateways enforcing through one sidecar, one with the filter's circuit breaker on (its default), one with it off, and one with the breaker on and on_failure local, each in front of its own services with only the 10x safety limit, under the same steady open-loop load at the same time. Redis, then the sidecar, changes state phase by phase: up; Redis hung (CLIENT PAUSE ALL: commands wait, so the sidecar answers 503 at its own 4 ms deadline); up again; Redis flapping (paused for 50 ms in every 150: the sidecar answers the checks between the pauses and 503 to those a pause holds, an outage that comes and goes); up again; Redis killed (connections refused: the sidecar answers 503 at once); Redis restarted empty; the sidecar hung (SIGSTOP: connections are accepted and nothing answers, so the filter's 5 ms timeout passes); the sidecar resumed (last, since the callouts it kept unanswered are all read at once when it resumes). With the breaker on, it opens after a few failed checks, and requests then fail open at once without a callout (failed_open.circuit_open) until a probe gets an answer; with it off, every request waits for its check to fail. Requests are counted in the phase they were due in; a first second with Redis up, before the phases, lets connections settle and is not reported.",
		Tables: []report.Table{t},
		Charts: charts,
		Checks: []report.Check{
			{Claim: "requests keep flowing with Redis out", Target: ">= 99% of quiet requests answered 200", Measured: fmt.Sprintf("%.1f%% in the worst outage phase (every gateway)", 100*minOK), Holds: minOK >= 0.99},
			{Claim: "a check that cannot be answered costs at most the 5 ms timeout", Target: "added quiet p50 <= 5 ms, breaker off (every check waits)",
				Measured: fmt.Sprintf("%s ms in the worst outage phase (%s); breaker on there: %s ms", msv(w50.added50), short(w50.phase), msv(on50.added50)), Holds: w50.added50 <= 5},
			{Claim: "the tail stays within the timeout too", Target: "added quiet p99 <= 5 ms + 1 ms, breaker off",
				Measured: fmt.Sprintf("%s ms in the worst outage phase (%s; vCPU stalls >= 2.5 ms there, by run, with the quiet requests waiting through them: %s); breaker on there: %s ms", msv(w99.added), short(w99.phase), w99.stalls, msv(on99.added)), Holds: w99.added <= 6},
			{Claim: "the circuit breaker spares the wait", Target: "added quiet p50 with the breaker on < off, in the outage where waiting costs most",
				Measured: fmt.Sprintf("%s ms on vs %s ms off (%s)", msv(on50.added50), msv(w50.added50), short(w50.phase)), Holds: on50.added50 < w50.added50},
			{Claim: "the safety limit still caps the noisy client", Target: fmt.Sprintf("<= %.0f/s admitted of %.0f/s offered: %.0f/s (9 x 10 x plan + bursts) and 5%% for phase edges", 1.05*outageCap, noisyRate, outageCap),
				Measured: fmt.Sprintf("%.0f/s in the worst outage phase (breaker on and off)", maxNoisy), Holds: maxNoisy <= 1.05*outageCap},
			{Claim: "on_failure local holds a known client to its plan during the outage", Target: fmt.Sprintf("<= %.1f/s admitted (its plan, %g/s + burst %g, on the one gateway, plus a request at each phase edge) of %.0f/s offered", localCap, small.Rate, small.Capacity, noisyRate),
				Measured: fmt.Sprintf("%.1f/s in the worst outage phase, against %.0f/s failing open", maxLocal, maxNoisy), Holds: maxLocal <= localCap},
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

// failOpenClaim is what the scenario measures.
const failOpenClaim = "if Redis or the sidecar is unavailable, requests fail open after the 5 ms timeout and keep flowing, while the services' coarse safety limit (10x the plan rate) still caps a noisy client; with on_failure local, the proxy holds a client it knows to its plan."
