// Command gateway is the headless stand-in for Envoy: it serves HTTP from
// envoy/envoy.yaml, running filter.wasm in the proxy-wasm host of package
// wasmhost (one VM per worker, as Envoy runs one per worker thread), routes
// by path prefix or exact path to the configured clusters (or answers a
// route's direct_response), and sends the filter's callouts to its clusters
// over HTTP with Envoy's timeout and failure answers.
//
//	gateway -config envoy/envoy.yaml [-listen HOST:PORT] [-admin HOST:PORT]
//	        [-listener NAME=HOST:PORT ...] [-cluster NAME=HOST:PORT ...]
//	        [-wasm PATH] [-concurrency N]
//
// The listener the wasm filter is on is -listen's. The bootstrap's other
// listeners (envoy.yaml's stats listener) have the router as their only
// HTTP filter; -listener moves one. -admin moves the admin interface and,
// with it, every cluster endpoint that is the bootstrap's admin address, so
// that envoy.yaml's envoy_admin cluster, behind the stats listener, still
// reaches the admin.
//
// -listen, -admin, -cluster and -wasm override the file, for running it by
// hand; the end-to-end harness writes a bootstrap with the addresses it
// wants instead and passes only -config and -concurrency, as it passes -c
// and --concurrency to a real Envoy. -poll-oneoff, -access-log, -check,
// -cpuprofile and -nice are the stand-in's own: under Envoy, poll_oneoff
// answers as the release does, the access log is the bootstrap's, and no
// priority is changed. -nice (default 10) lowers the priority of the
// gateway's threads, so that this stand-in, which spends several times
// Envoy's CPU on a request, does not keep the sidecar and Redis beside it
// from a CPU (RATIONALE.md, "Why does the stand-in gateway run at a lower
// priority?").
//
// The admin listener serves /stats (Envoy's "name: value" text, the
// plugin's wasmcustom.* metrics included), /stats/prometheus (the plugin's
// metrics only, named and labelled as Envoy names and tags them from the
// bootstrap's stats_config.stats_tags, histograms in the buckets of its
// histogram_bucket_settings), /ready and POST /reload. SIGTERM
// or SIGINT drains in-flight requests and stops.
//
// SIGHUP (or POST /reload) reloads the configuration as Envoy applies a
// listener update: the -config file is read again with the same -listen,
// -cluster and -wasm overrides, and a new set of worker VMs is started and
// configured from it (_initialize, proxy_on_vm_start, proxy_on_configure,
// as at start). If the plugin rejects the configuration, or the file does
// not load, the running VMs stay, the error is logged and
// gateway.reload_failed counts it. Otherwise new requests go to the new
// VMs, requests in flight finish on the old ones, and the old ones are
// closed once the last of them ends. The plugin's metrics and shared data
// belong to the process and carry over. The listener and admin addresses
// are bound once: a changed address is logged and not applied. The admin
// stats gateway.config_generation (1 at start, +1 per applied reload),
// gateway.reload_success and gateway.reload_failed report reloads.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
)

func main() {
	if os.Getenv("GOGC") == "" {
		// Envoy has no garbage collector; this stand-in has Go's, and a
		// request allocates tens of kilobytes in net/http and the host.
		// At the default GOGC=100 a small live heap means a collection
		// every few hundred requests, each taking one of the two cores
		// for its mark phase: latency no Envoy adds to a callout. A
		// larger target makes collections rare (envoy/wasmhost/RATIONALE.md,
		// "What a request costs the host").
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// namedAddrs collects repeated NAME=HOST:PORT flags (-cluster, -listener).
type namedAddrs struct {
	what string // "cluster", "listener"
	m    map[string]string
}

func (n namedAddrs) String() string {
	var parts []string
	for k, v := range n.m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (n namedAddrs) Set(s string) error {
	name, addr, ok := strings.Cut(s, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want NAME=HOST:PORT, got %q", s)
	}
	if _, dup := n.m[name]; dup {
		return fmt.Errorf("%s %q given twice", n.what, name)
	}
	n.m[name] = addr
	return nil
}

// options are the gateway's command line.
type options struct {
	config      string
	listen      string
	admin       string
	clusters    namedAddrs
	listeners   namedAddrs
	wasm        string
	concurrency int
	poll        string
	check       bool
	accessLog   bool
	cpuProfile  string
	nice        int
	niceGiven   bool // -nice was on the command line
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{clusters: namedAddrs{"cluster", map[string]string{}}, listeners: namedAddrs{"listener", map[string]string{}}}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.config, "config", "envoy/envoy.yaml", "Envoy bootstrap to serve")
	fs.StringVar(&o.listen, "listen", "", "HOST:PORT of the HTTP listener (default: the file's)")
	fs.StringVar(&o.admin, "admin", "", "HOST:PORT of the admin listener (default: the file's)")
	fs.Var(o.clusters, "cluster", "NAME=HOST:PORT: the cluster's only endpoint (repeatable)")
	fs.Var(o.listeners, "listener", "NAME=HOST:PORT: the address of that listener, one without the wasm filter (repeatable)")
	fs.StringVar(&o.wasm, "wasm", "", "the proxy-wasm module (default: the file's vm_config.code.local.filename)")
	fs.IntVar(&o.concurrency, "concurrency", 2, "worker VMs, like Envoy's --concurrency")
	// The default is the minimum supported Envoy's answer (README: 1.33),
	// so nothing passes here that would fail there; sleep is what no
	// Envoy does (envoy/wasmhost/RATIONALE.md: poll_oneoff modes).
	fs.StringVar(&o.poll, "poll-oneoff", "enosys", "WASI poll_oneoff answer: enosys (Envoy 1.33 to 1.38), noevents (Envoy 1.39 and later), sleep (a real implementation, no Envoy)")
	fs.BoolVar(&o.check, "check", false, "load the configuration and the module, configure the plugin once, and exit")
	fs.BoolVar(&o.accessLog, "access-log", false, "write one line per request to stdout")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (for measuring the host's cost per request)")
	fs.IntVar(&o.nice, "nice", defaultNice, "scheduling niceness of the gateway's threads, -20..19; the default never raises a priority the process started with (below 0 needs CAP_SYS_NICE)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) { o.niceGiven = o.niceGiven || f.Name == "nice" })
	if o.nice < -20 || o.nice > 19 {
		return o, fmt.Errorf("-nice: want -20..19, got %d", o.nice)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.concurrency < 1 || o.concurrency > 256 {
		return o, fmt.Errorf("-concurrency: want 1..256, got %d", o.concurrency)
	}
	return o, nil
}

// defaultNice is the scheduling niceness the gateway's threads run at unless
// -nice says otherwise. This stand-in spends several times the CPU per
// request that Envoy does (a Go HTTP server, goroutine handoffs, the module
// in wazero), and in a burst its threads are runnable all at once. At the
// priority of the sidecar and Redis on the same cores they kept both
// waiting for a CPU past the filter's 5 ms callout timeout, work a real
// Envoy does not make (RATIONALE.md, "Why does the stand-in gateway run at
// a lower priority?"). A process may always lower its own priority, so
// this needs no privilege.
const defaultNice = 10

// renice applies -nice to the process (setNice); the package's tests,
// which run the gateway inside the test binary, leave their own priority
// alone.
var renice = setNice

// run starts the gateway and serves until ctx ends. ready, if not nil,
// receives the addresses it serves on once every listener accepts
// connections.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- addrs) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if err := renice(o.nice, !o.niceGiven); err != nil {
		return fmt.Errorf("-nice: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	g, err := newGateway(ctx, o, log)
	if err != nil {
		return err
	}
	if o.check {
		g.close()
		cfg := g.current().cfg
		fmt.Fprintf(stdout, "configuration OK: %s (module %s, %d routes, %d other listeners, %d clusters)\n", o.config, cfg.Wasm.Filename, len(cfg.Routes), len(cfg.Listeners), len(cfg.Clusters))
		return nil
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.accessLog {
		g.accessLog = stdout
	}
	// Again, now that start-up (compiling the module, faulting the heap
	// in) has run: a thread whose creation was under way during the
	// first call came out at the old niceness (setNice), and is set now,
	// before it serves.
	if err := renice(o.nice, !o.niceGiven); err != nil {
		return fmt.Errorf("-nice: %w", err)
	}
	return g.serve(ctx, ready)
}
