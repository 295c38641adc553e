// Command gwcpu measures what build/gateway costs per request: the CPU time
// the gateway process used (utime + stime) over bursts of 30 simultaneous
// keep-alive requests through the whole stack (a real Redis, the sidecar, a
// service), and how many of the filter's callouts failed open, by reason
// (requests.failed_open.<reason>), and what the gateway adds to a callout
// at p99 (the filter's callout histogram less the sidecar's decision
// histogram, rig.CalloutLatency), beside the CPU its own process (the
// load generator and the service) spent. Several gateway binaries run side by
// side on the same stack and take turns, so a before/after comparison
// alternates on a shared, noisy machine; it prints each round and the
// medians.
//
//	go run ./e2e/bench/gwcpu -gateways build/gateway.before,build/gateway -rounds 7
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/load"
	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

func main() {
	bin := flag.String("bin", "build", "directory with filter.wasm and sidecar (built there if missing)")
	gateways := flag.String("gateways", "build/gateway", "comma-separated gateway binaries, measured in turn")
	rounds := flag.Int("rounds", 5, "rounds; each gateway gets one burst run per round")
	rate := flag.Float64("rate", 1500, "requests per second in total")
	window := flag.Duration("window", 4*time.Second, "how long each run sends")
	senders := flag.Int("senders", 30, "requests fired together per tick")
	profile := flag.String("cpuprofile", "", "write each gateway's CPU profile to this prefix + its index + .prof")
	flag.Parse()
	if err := run(*bin, strings.Split(*gateways, ","), *rounds, *rate, *window, *senders, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "gwcpu:", err)
		os.Exit(1)
	}
}

type gw struct {
	bin   string
	g     *harness.Gateway
	cpu   []float64 // µs per request, per round
	bench []float64 // this process's (the load generator and the service), µs per request, per round
	fo    []float64 // failed-open share, per round
	added []float64 // ms the gateway adds to a callout at p99, per round
}

func run(binDir string, bins []string, rounds int, rate float64, window time.Duration, senders int, profile string) error {
	ctx := context.Background()
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	b, err := harness.Locate(ctx, binDir)
	if err != nil {
		return err
	}
	backend, err := rig.StartBackend(ctx, b, rig.OpenPlans) // every request a callout the sidecar allows: the path whose cost is measured
	if err != nil {
		return err
	}
	defer backend.Close()
	svc, err := services.Start("127.0.0.1:0", services.Config{Name: "orders", Replicas: 1})
	if err != nil {
		return err
	}
	defer svc.Close()
	var gws []*gw
	for i, path := range bins {
		bb := b
		bb.Gateway = path
		var extra []string
		if profile != "" {
			extra = []string{"-cpuprofile", fmt.Sprintf("%s%d.prof", profile, i)}
		}
		g, err := harness.StartGateway(ctx, bb, harness.GatewayConfig{
			Config:   filepath.Join(root, "envoy", "envoy.yaml"),
			Clusters: map[string]string{"orders": svc.Addr, "billing": svc.Addr, "ratelimit_sidecar": backend.SidecarAddr},
			Extra:    extra,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		defer g.Stop(5 * time.Second)
		gws = append(gws, &gw{bin: path, g: g})
	}
	burst := func(g *gw, w time.Duration) (load.BurstResult, error) {
		return load.RunBurst(ctx, load.Burst{Targets: []string{g.g.Addr}, Client: "gwcpu", Path: "/orders/1",
			Rate: rate, Window: w, Senders: senders})
	}
	for _, g := range gws { // warm up: connections, VM heaps
		if _, err := burst(g, time.Second); err != nil {
			return err
		}
	}
	for r := 0; r < rounds; r++ {
		for _, g := range gws {
			before, err := g.g.CPUTime()
			if err != nil {
				return err
			}
			self0, err := harness.CPUTimeOf(os.Getpid())
			if err != nil {
				return err
			}
			s0, err := g.g.Stats()
			if err != nil {
				return err
			}
			l0, err := rig.ReadCalloutLatency(backend, g.g)
			if err != nil {
				return err
			}
			res, err := burst(g, window)
			if err != nil {
				return err
			}
			after, err := g.g.CPUTime()
			if err != nil {
				return err
			}
			self1, err := harness.CPUTimeOf(os.Getpid())
			if err != nil {
				return err
			}
			s1, err := g.g.Stats()
			if err != nil {
				return err
			}
			l1, err := rig.ReadCalloutLatency(backend, g.g)
			if err != nil {
				return err
			}
			if res.Other > 0 {
				return fmt.Errorf("%s: %d answers neither 200 nor 429", g.bin, res.Other)
			}
			var fo int64
			var reasons []string
			for name, v := range s1 {
				if reason, ok := strings.CutPrefix(name, failedOpen); ok && v > s0[name] {
					fo += v - s0[name]
					reasons = append(reasons, fmt.Sprintf("%s %d", reason, v-s0[name]))
				}
			}
			sort.Strings(reasons)
			us := float64((after - before).Microseconds()) / float64(res.Sent)
			benchUS := float64((self1 - self0).Microseconds()) / float64(res.Sent)
			share := float64(fo) / float64(res.Sent)
			lat := l1.Since(l0)
			filter, sidecar := lat.P99()
			g.cpu, g.fo, g.added = append(g.cpu, us), append(g.fo, share), append(g.added, filter-sidecar)
			g.bench = append(g.bench, benchUS)
			fmt.Printf("round %d %-28s %6d requests  %6.1f µs CPU/request (load and service %.1f)  failed open %5.2f%%  callout p99 %.2f ms, sidecar's %.2f (read wait %.2f)  load %s  %s\n",
				r+1, g.bin, res.Sent, us, benchUS, 100*share, filter, sidecar, lat.WaitP99(), loadavg(), strings.Join(reasons, ", "))
		}
	}
	fmt.Println()
	for _, g := range gws {
		fmt.Printf("median %-28s %6.1f µs CPU/request (load and service %.1f)  failed open %5.2f%%  the gateway adds %.2f ms to a callout at p99\n",
			g.bin, stat.Median(g.cpu), stat.Median(g.bench), 100*stat.Median(g.fo), stat.Median(g.added))
	}
	return nil
}

// failedOpen prefixes the gateway's counter of each reason a callout
// failed open (filter/limiter's MetricFailedOpenPrefix, as the host names
// a custom metric).
const failedOpen = "wasmcustom." + limiter.MetricFailedOpenPrefix

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}
