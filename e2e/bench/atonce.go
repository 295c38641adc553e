package main

import (
	"context"
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

// The burst sweep's client is one, at five times its plan: once it is
// denied, most of its requests are answered from the gateways' deny caches
// without a callout, and what its rates measure is mostly that path. When
// every request is a callout (many clients, each within its plan), what
// decides whether a burst is answered within the 5 ms timeout is how many
// callouts arrive together. This scenario sweeps that number: n requests
// at once, atOnceTicks times a second, from a client whose plan allows
// them all, through 1 and 3 gateways sharing one sidecar and Redis, up to
// the first n at which the burst's promises (burstRun.Holds: here, at most
// 1% failed open and the services get every request) stop holding.

// atOnceCounts are the burst sizes swept, ascending.
var atOnceCounts = []int{20, 30, 40, 50, 60, 80, 100, 150}

// atOnceTicks is how many bursts a second each run sends: the stack is
// idle between them, as between the bursts of the burst sweep.
const atOnceTicks = 10

const atOnceClaim = "a burst of callouts arriving together is answered within the 5 ms timeout, up to a size this machine can carry."

func atOnceKey(gateways, n, run int) string { return fmt.Sprintf("atonce-%dg-%d-%d", gateways, n, run) }

func runAtOnce(ctx context.Context, e *env) (*report.Scenario, error) {
	gateways := []int{1, 3}
	window := e.dur(3 * time.Second)
	// Every client on the default plan; each run's key is new, so its
	// bucket is fresh.
	pl := plans{Default: "unlimited", Plans: map[string]bucket.Limit{"unlimited": unlimitedPlan}}
	t := report.Table{
		Title:  fmt.Sprintf("Every request a callout: n requests together, %d times a second, %d runs per step (medians)", atOnceTicks, e.runs),
		Header: burstHeader,
		Notes: []string{
			"One client whose plan allows every request, so each request is a callout the sidecar allows and \"plan allows\" is every request sent; a run holds when every request due was sent (none dropped), at most 1% of them failed open, the admitted are within 5% of those sent, the services received exactly the admitted, and none was answered other than 200 or 429 (burstRun.Holds, the burst scenario's rule). Each gateway count's sizes run in turn on one stack, up to the first that does not hold.",
			"The gateways run envoy/envoy.yaml's filter as shipped (5 ms callout timeout) and the sidecar its defaults (4 ms Redis deadline), on this machine's 2 cores with Redis, the services and the load generator.",
			"The columns are the burst tables' (see there). A burst of n brings n times each part's CPU per request due at once, and the gateways' share is the largest: build/gateway, the headless host that stands in for Envoy here, with its HTTP server, client and hand-offs in Go. A callout answered before its timeout is not failed open however long the answer then waits for the filter to run, which is what the callout p99 past 5 ms shows.",
		},
	}
	summary := report.Table{Title: "Callouts together within the 5 ms timeout", Header: []string{"gateways", "most requests together that held (every one a callout)"}}
	var checks []report.Check
	for _, g := range gateways {
		e.prog.Printf("atonce: starting redis, sidecar and %d gateway(s)", g)
		b, fronts, err := startBurstStack(ctx, e, pl, g)
		if err != nil {
			return nil, err
		}
		held, what := 0, ""
		for _, n := range atOnceCounts {
			offered := float64(n * atOnceTicks)
			st := burstStep{Gateways: g, Senders: n, Offered: offered}
			for run := 0; run < e.runs; run++ {
				e.prog.Printf("atonce: %d gateway(s), %d together, run %d of %d", g, n, run+1, e.runs)
				one, err := burstOnce(ctx, e.vcpus, b, fronts, atOnceKey(g, n, run), unlimitedPlan, n, offered, runWindow(window, offered))
				if err != nil {
					b.Close()
					return nil, err
				}
				st.Runs = append(st.Runs, one)
			}
			t.Add(st.cells()...)
			if !st.Holds() {
				what = fmt.Sprintf("%d did not: %d of %d runs held, %.2f%% failed open, steal %s, vCPU stalls >= 2.5 ms %s", n, st.Held(), len(st.Runs),
					st.median(func(r burstRun) float64 { return 100 * float64(r.FailedOpen) / float64(r.Sent) }), stealOrDash(st.steal()), st.stalls())
				break
			}
			held = n
		}
		if err := b.Close(); err != nil {
			return nil, err
		}
		measured := fmt.Sprintf("%d requests together", held)
		switch {
		case held == 0:
			measured = fmt.Sprintf("none of the sizes swept (the smallest, %s)", what)
		case what == "":
			measured += fmt.Sprintf(" (every size swept held: the limit is above %d)", held)
		default:
			measured += " (" + what + ")"
		}
		summary.Add(g, measured)
		checks = append(checks, report.Check{
			Claim:    fmt.Sprintf("callouts arriving together that a gateway answers within its 5 ms timeout: %d gateway(s)", g),
			Target:   fmt.Sprintf("none: the most requests together, each a callout, %d times a second, that hold (burstRun.Holds: every request sent, none dropped, <= 1%% failed open, admitted within 5%% of those sent, which the plan allows all of, every admitted request received by the services, none answered other than 200 or 429) in most of %d runs", atOnceTicks, e.runs),
			Measured: measured,
			Info:     true,
		})
	}
	return &report.Scenario{
		Title:  "Callouts together: how many a burst can hold, every request a callout",
		Claim:  atOnceClaim,
		Method: fmt.Sprintf("Redis, one sidecar and 1 or 3 gateways sharing them, each gateway with its own services. One client whose plan allows everything sends n requests together through the gateways in turn, %d times a second, %v per run (longer for small n, so that a run sends at least %d requests) and %d runs per size, each run a fresh client; n rises until most runs of a size do not hold: more than 1%% of the requests failed open, or a request was not sent, was answered other than 200, or did not reach a service.", atOnceTicks, window, minBurstRequests, e.runs),
		Tables: []report.Table{summary, t},
		Checks: checks,
	}, nil
}
