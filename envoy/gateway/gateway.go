package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/internal/prefault"
)

// routeTimeout is Envoy's default route timeout: an upstream that has not
// answered by then gets the client a 504.
const routeTimeout = 15 * time.Second

// drainTimeout bounds how long a shutdown waits for in-flight requests.
const drainTimeout = 10 * time.Second

// gateway is the running stand-in for Envoy: the listeners it bound at
// start, and the generation of configuration requests are served with now.
type gateway struct {
	o        options
	log      *slog.Logger
	poll     wasmhost.PollMode
	listener string // the listener address as configured at start
	// listenerNetwork is what listener is bound on, as Envoy binds it
	// (envoyconfig.ListenNetwork: 0.0.0.0 an IPv4 socket only).
	listenerNetwork string
	admin           string // the admin address as configured at start
	// adminLn is the admin listener, bound before the first generation
	// is built: clusters that reach the admin are pointed at adminAddr,
	// the address it is bound to (a port 0 picked).
	adminLn   net.Listener
	adminAddr string
	// others are the listeners without the wasm filter, as configured at
	// start.
	others   []*routerListener
	stats    *wasmhost.Stats
	shared   *wasmhost.SharedData
	next     atomic.Uint64
	counters counters
	// The listener's request counters: every request the connection
	// manager took (downstream_rq_total, by class), and those that reached
	// the router (rq_total): not the ones answered before it, by the
	// connection manager (a path it cannot normalize) or the filter.
	rqTotal  lazyCounter
	rqClass  *classCounters
	rqRouted lazyCounter
	// upgradeRefused is Envoy's downstream_rq_ws_on_non_ws_route: upgrade
	// requests to a route refused (403) before the filter.
	upgradeRefused lazyCounter
	// underscoreRejected is Envoy's HTTP/1 codec's
	// requests_rejected_with_underscores_in_headers.
	underscoreRejected lazyCounter
	accessLog          io.Writer
	logMu              sync.Mutex

	// mu guards cur; a request takes cur and its in-flight count together
	// (read lock), a reload swaps cur (write lock).
	mu  sync.RWMutex
	cur *generation
	// reloadMu makes reloads (SIGHUP, POST /reload) one at a time.
	reloadMu sync.Mutex
	// retiring holds the generations a reload replaced that still serve
	// requests; each closes itself once drained.
	retiring sync.WaitGroup
	oldMu    sync.Mutex
	old      map[*generation]bool

	// modules are the compiled modules the generations run, by the
	// digest of the file's bytes, each with the generations using it.
	modMu   sync.Mutex
	modules map[[sha256.Size]byte]*sharedModule
}

// sharedModule is a compiled module and how many generations use it.
type sharedModule struct {
	mod  *wasmhost.Module
	refs int
}

// generation is one applied configuration: the worker VMs configured from
// it, the clusters it routes and calls out to (each shared with the
// generations around it that define it alike), and the dispatcher of the
// plugin's callouts over them. A reload builds a new generation beside the
// running one and swaps it in; a request keeps the generation it started
// on until it ends.
type generation struct {
	n         int64 // 1 at start, +1 per applied reload
	cfg       *envoyconfig.Config
	mod       *wasmhost.Module
	dropMod   func() // lets go of mod (gateway.module)
	workers   []*wasmhost.VM
	calls     *countingDispatcher
	clusters  map[string]*cluster
	inflight  sync.WaitGroup
	closeOnce sync.Once

	// pluginErrors collects the plugin's error lines while its workers
	// are being configured, to say why it refused its configuration.
	errMu        sync.Mutex
	configuring  bool
	pluginErrors []string
}

func newGateway(ctx context.Context, o options, log *slog.Logger) (*gateway, error) {
	poll, err := wasmhost.ParsePollMode(o.poll)
	if err != nil {
		return nil, fmt.Errorf("-poll-oneoff: %w", err)
	}
	cfg, err := loadConfig(o)
	if err != nil {
		return nil, err
	}
	admin := cfg.Admin
	if o.admin != "" {
		admin = o.admin
	}
	if admin == "" {
		return nil, errors.New("no admin address: the configuration has none and -admin is not set")
	}
	// Metrics and shared data belong to the process, per vm_id, as in
	// Envoy: every generation's VMs get these same two, so counters and
	// the filter's deny cache and breaker state outlive a reload.
	g := &gateway{o: o, log: log, poll: poll, listener: cfg.Listener, admin: admin,
		listenerNetwork: envoyconfig.ListenNetwork(cfg.Listener, cfg.ListenerIPv4Compat),
		stats:           wasmhost.NewStats(), shared: wasmhost.NewSharedData(), old: map[*generation]bool{}}
	if o.check {
		cfg.Admin = admin
	} else {
		// Bound first, as Envoy starts its admin before its listeners, so
		// that a cluster of the admin is built with the admin's address.
		if g.adminLn, err = net.Listen("tcp", admin); err != nil {
			return nil, fmt.Errorf("admin listener: %w", err)
		}
		g.adminAddr = g.adminLn.Addr().String()
		if err := cfg.MoveAdmin(g.adminAddr); err != nil {
			g.adminLn.Close()
			return nil, err
		}
	}
	for _, l := range cfg.Listeners {
		g.others = append(g.others, newRouterListener(g, l))
	}
	// Bucket bounds are fixed when a histogram is made, from the bootstrap
	// the process started with, as in Envoy (a reload does not change them).
	g.stats.SetHistogramBuckets(cfg.BucketsFor)
	// Tags too: Envoy's stats_config is the bootstrap's.
	g.stats.SetTagExtractor(func(name string) (string, []wasmhost.Tag) {
		extracted, tags := cfg.TagsFor(name)
		out := make([]wasmhost.Tag, len(tags))
		for i, t := range tags {
			out[i] = wasmhost.Tag{Name: t.Name, Value: t.Value}
		}
		return extracted, out
	})
	g.rqTotal = lazyCounter{c: &g.counters, name: "http.edge.downstream_rq_total"}
	g.rqClass = newClassCounters(&g.counters, "http.edge.downstream_rq_")
	g.rqRouted = lazyCounter{c: &g.counters, name: "http.edge.rq_total"}
	g.upgradeRefused = lazyCounter{c: &g.counters, name: "http.edge.downstream_rq_ws_on_non_ws_route"}
	g.underscoreRejected = lazyCounter{c: &g.counters, name: "http1.requests_rejected_with_underscores_in_headers"}
	workers := o.concurrency
	if o.check {
		workers = 1
	}
	g.cur, err = g.build(ctx, cfg, nil, workers, 1)
	if err != nil {
		if g.adminLn != nil {
			g.adminLn.Close()
		}
		return nil, err
	}
	// Compiling the module leaves tens of megabytes of garbage. Collected
	// now, before the listener opens, it is not collected under the first
	// requests, where the mark phase would take a core from them: Envoy
	// has no collector to pause its first callouts. Then the pages the
	// heap will grow into before its next collection are made resident,
	// so that the first requests do not fault them in one by one
	// (RATIONALE.md, "Why does the stand-in fault its heap in at start?").
	prefault.Heap()
	for _, name := range []string{statReloadSuccess, statReloadFailed} {
		g.counters.add(name, 0)
	}
	return g, nil
}

// Admin statistics of configuration reloads.
const (
	statGeneration    = "gateway.config_generation"
	statReloadSuccess = "gateway.reload_success"
	statReloadFailed  = "gateway.reload_failed"
)

// loadConfig reads the -config file and applies the command line's
// overrides of the listeners and clusters, at start and at every reload
// alike. The admin address stays the file's: the caller moves it.
func loadConfig(o options) (*envoyconfig.Config, error) {
	cfg, err := envoyconfig.Load(o.config)
	if err != nil {
		return nil, err
	}
	if err := cfg.Override(o.listen, o.clusters.m, o.wasm); err != nil {
		return nil, err
	}
	if err := cfg.OverrideListeners(o.listeners.m); err != nil {
		return nil, err
	}
	if o.admin != "" {
		if _, _, err := net.SplitHostPort(o.admin); err != nil {
			return nil, fmt.Errorf("-admin %q: %w", o.admin, err)
		}
	}
	return cfg, nil
}

// build loads the module and starts workers VMs configured from cfg, each
// as Envoy starts one: _initialize, proxy_on_vm_start, proxy_on_configure.
// The clusters prev (the running generation, nil at start) has and cfg
// defines alike are taken over with their connections (clusters.go).
// If any VM fails or the plugin refuses its configuration, everything built
// is closed and the error carries the plugin's own error lines.
func (g *gateway) build(ctx context.Context, cfg *envoyconfig.Config, prev *generation, workers int, n int64) (*generation, error) {
	gen := &generation{n: n, cfg: cfg, clusters: clustersFor(cfg, prev, &g.counters)}
	gen.calls = &countingDispatcher{clusters: gen.clusters}
	var err error
	gen.mod, gen.dropMod, err = g.module(ctx, cfg.Wasm.Filename)
	if err != nil {
		gen.close()
		return nil, err
	}
	for i := 0; i < workers; i++ {
		vm, err := gen.mod.NewVM(ctx, wasmhost.Options{
			PluginName: cfg.Wasm.Name,
			RootID:     cfg.Wasm.RootID,
			VMID:       cfg.Wasm.VMID,
			FailOpen:   cfg.Wasm.FailOpen,
			Dispatcher: gen.calls,
			Worker:     i,
			Stats:      g.stats,
			SharedData: g.shared,
			Log:        g.pluginLog(gen, i),
			LogLevel:   wasmhost.LogInfo,
		})
		if err != nil {
			gen.close()
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		gen.workers = append(gen.workers, vm)
		gen.errMu.Lock()
		gen.configuring, gen.pluginErrors = true, nil
		gen.errMu.Unlock()
		err = vm.Configure(cfg.Wasm.Configuration)
		gen.errMu.Lock()
		gen.configuring = false
		why := strings.Join(gen.pluginErrors, "; ")
		gen.errMu.Unlock()
		if err != nil {
			gen.close()
			if why != "" {
				return nil, fmt.Errorf("plugin %s: %w: %s", cfg.Wasm.Name, err, why)
			}
			return nil, fmt.Errorf("plugin %s: %w", cfg.Wasm.Name, err)
		}
	}
	return gen, nil
}

// acquire returns the generation a new request runs on and counts the
// request in it; release it when the request ends.
func (g *gateway) acquire() *generation {
	g.mu.RLock()
	defer g.mu.RUnlock()
	gen := g.cur
	gen.inflight.Add(1)
	return gen
}

func (gen *generation) release() { gen.inflight.Done() }

// current returns the generation new requests run on.
func (g *gateway) current() *generation {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.cur
}

// reload re-reads the configuration and, if the plugin accepts it, swaps
// in a new generation of worker VMs, as Envoy applies a listener update:
// requests already in flight finish on the old VMs, which are closed once
// the last of them ends. If anything fails the running generation stays
// and the failure is logged and counted. It returns the generation that
// serves new requests afterwards.
func (g *gateway) reload(ctx context.Context, why string) (int64, error) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	old := g.current()
	fail := func(err error) (int64, error) {
		g.counters.inc(statReloadFailed)
		g.log.Error("reload failed; keeping the running configuration", "trigger", why, "generation", old.n, "err", err)
		return old.n, err
	}
	cfg, err := loadConfig(g.o)
	if err != nil {
		return fail(err)
	}
	// The listeners stay where they were bound: moving them would drop
	// connections, and Envoy does not move a listener in place either.
	if cfg.Listener != g.listener {
		g.log.Warn("listener address change not applied: restart the gateway to move the listener", "listener", g.listener, "configured", cfg.Listener)
	}
	if g.o.admin == "" && cfg.Admin != "" && cfg.Admin != g.admin {
		g.log.Warn("admin address change not applied: restart the gateway to move the admin listener", "admin", g.admin, "configured", cfg.Admin)
	}
	if err := cfg.MoveAdmin(g.adminAddr); err != nil {
		return fail(err)
	}
	g.checkListeners(cfg)
	// New VMs rather than proxy_on_configure again in the running ones:
	// a refused configuration then cannot leave a running plugin half
	// reconfigured, and the module file is read again as Envoy reads it
	// for a new listener. Only shared data and metrics carry over, which
	// is all a plugin may count on in Envoy too.
	gen, err := g.build(ctx, cfg, old, len(old.workers), old.n+1)
	if err != nil {
		return fail(err)
	}
	// As at start, and before the new VMs take requests: reading (and,
	// when it changed, compiling) the module again left its garbage, which
	// would otherwise be collected under their first callouts, and the
	// heap's pages are made resident again. With three busy processes beside it on 2 cores, the first
	// check after a reload missed its 5 ms in 3 reloads of 150 without
	// it, and in none of 450 with it.
	prefault.Heap()
	g.mu.Lock()
	g.cur = gen
	g.mu.Unlock()
	g.counters.inc(statReloadSuccess)
	g.log.Info("configuration reloaded", "trigger", why, "generation", gen.n, "workers", len(gen.workers), "module", cfg.Wasm.Filename)
	g.retire(old)
	return gen.n, nil
}

// retire closes a replaced generation once its last request has ended.
func (g *gateway) retire(old *generation) {
	g.oldMu.Lock()
	g.old[old] = true
	g.oldMu.Unlock()
	g.retiring.Add(1)
	go func() {
		defer g.retiring.Done()
		old.inflight.Wait()
		old.close()
		g.oldMu.Lock()
		delete(g.old, old)
		g.oldMu.Unlock()
		g.log.Info("previous configuration drained and closed", "generation", old.n)
	}()
}

// pluginLog forwards a worker VM's plugin log lines to the gateway's log,
// as Envoy's "wasm log" lines, and keeps its error lines while gen is being
// configured.
func (g *gateway) pluginLog(gen *generation, worker int) func(wasmhost.LogLevel, string) {
	return func(level wasmhost.LogLevel, msg string) {
		sl := slog.LevelInfo
		switch {
		case level <= wasmhost.LogDebug:
			sl = slog.LevelDebug
		case level == wasmhost.LogWarn:
			sl = slog.LevelWarn
		case level >= wasmhost.LogError:
			sl = slog.LevelError
		}
		if level >= wasmhost.LogError {
			gen.errMu.Lock()
			if gen.configuring {
				gen.pluginErrors = append(gen.pluginErrors, msg)
			}
			gen.errMu.Unlock()
		}
		g.log.Log(context.Background(), sl, "wasm log", "plugin", gen.cfg.Wasm.Name, "generation", gen.n, "worker", worker, "msg", msg)
	}
}

// close stops a generation's VMs, its connections and its module. Safe to
// call more than once.
func (gen *generation) close() {
	gen.closeOnce.Do(func() {
		for _, vm := range gen.workers {
			vm.Close()
		}
		for _, c := range gen.clusters {
			c.release()
		}
		if gen.dropMod != nil {
			gen.dropMod()
		}
	})
}

// module reads the module file, as Envoy reads it for every new
// configuration, and returns it compiled, with the function that lets go
// of it. A file with the same bytes as one a running generation was built
// from gets that generation's module: the new VMs are made from it, and
// only the reading and hashing of the file are done again. Decoding and
// validating the module again was a quarter of a reload's CPU (some 88 ms
// in all on the 2-core VM this project is measured on), which at the
// gateway's niceness beside busy processes stretched a reload to seconds.
// The module is closed once no generation uses it.
func (g *gateway) module(ctx context.Context, path string) (*wasmhost.Module, func(), error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("load wasm module: %w", err)
	}
	sum := sha256.Sum256(b)
	g.modMu.Lock()
	defer g.modMu.Unlock()
	sm := g.modules[sum]
	if sm == nil {
		m, err := wasmhost.Load(ctx, b, wasmhost.ModuleOptions{Poll: g.poll})
		if err != nil {
			return nil, nil, fmt.Errorf("load wasm module %s: %w", path, err)
		}
		sm = &sharedModule{mod: m}
		if g.modules == nil {
			g.modules = map[[sha256.Size]byte]*sharedModule{}
		}
		g.modules[sum] = sm
	}
	sm.refs++
	var once sync.Once
	return sm.mod, func() {
		once.Do(func() {
			g.modMu.Lock()
			defer g.modMu.Unlock()
			if sm.refs--; sm.refs == 0 {
				delete(g.modules, sum)
				sm.mod.Close(context.Background())
			}
		})
	}, nil
}

// close stops every generation: the current one, and replaced ones whose
// requests did not end within the drain.
func (g *gateway) close() {
	g.current().close()
	g.oldMu.Lock()
	for old := range g.old {
		old.close()
	}
	g.oldMu.Unlock()
}

type workerKey struct{}

// addrs are the addresses a running gateway serves on.
type addrs struct {
	listener, admin string
	others          map[string]string // the other listeners', by name
}

// serve runs the listeners and the admin listener until ctx ends, then
// drains. SIGHUP reloads the configuration meanwhile.
func (g *gateway) serve(ctx context.Context, ready chan<- addrs) error {
	defer g.close()
	adminLn := g.adminLn
	ln, err := net.Listen(g.listenerNetwork, g.listener)
	if err != nil {
		adminLn.Close()
		return fmt.Errorf("listener: %w", err)
	}
	var others []net.Listener
	for _, l := range g.others {
		oln, err := net.Listen(l.network, l.addr)
		if err != nil {
			ln.Close()
			adminLn.Close()
			for _, o := range others {
				o.Close()
			}
			return fmt.Errorf("listener %s: %w", l.name, err)
		}
		others = append(others, oln)
	}
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 30 * time.Second,
		// Envoy hands each connection to one worker for its lifetime; the
		// worker's index picks the VM of whichever generation a request
		// runs on.
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, workerKey{}, int(g.next.Add(1)-1))
		},
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	admin := &http.Server{Handler: g.adminHandler(ctx), ReadHeaderTimeout: 10 * time.Second}
	var otherSrvs []*http.Server
	for _, l := range g.others {
		otherSrvs = append(otherSrvs, &http.Server{Handler: l, ReadHeaderTimeout: 30 * time.Second,
			ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)})
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	errc := make(chan error, 2+len(others))
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- admin.Serve(adminLn) }()
	served := addrs{listener: ln.Addr().String(), admin: adminLn.Addr().String(), others: map[string]string{}}
	for i, oln := range others {
		go func() { errc <- otherSrvs[i].Serve(oln) }()
		served.others[g.others[i].name] = oln.Addr().String()
	}
	gen := g.current()
	g.log.Info("gateway serving", "listener", served.listener, "admin", served.admin, "other listeners", served.others,
		"workers", len(gen.workers), "module", gen.cfg.Wasm.Filename, "abi", gen.mod.ABIVersion())
	if ready != nil {
		ready <- served
	}
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-errc:
			return err
		case <-hup:
			// Errors are logged and counted by reload; the gateway keeps
			// serving either way.
			g.reload(ctx, "SIGHUP")
		}
	}
	g.log.Info("draining")
	dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	err = srv.Shutdown(dctx)
	for _, o := range otherSrvs {
		o.Shutdown(dctx)
	}
	admin.Shutdown(dctx)
	if err == nil {
		// Every request has ended, so replaced generations close now.
		g.retiring.Wait()
	}
	return err
}

func (g *gateway) adminHandler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/plain")
		io.WriteString(w, "LIVE\n")
	})
	// filter= keeps the statistics whose names the regular expression
	// matches anywhere, as Envoy's /stats?filter= does (RE2 both); one
	// that does not compile is a 400, as at Envoy.
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		var keep *regexp.Regexp
		if q := r.URL.Query(); q.Has("filter") {
			re, err := regexp.Compile(q.Get("filter"))
			if err != nil {
				http.Error(w, "Invalid re2 regex", http.StatusBadRequest)
				return
			}
			keep = re
		}
		w.Header().Set("content-type", "text/plain")
		g.writeStats(w, keep)
	})
	// The plugin's metrics as Envoy's /stats/prometheus writes them, tagged
	// by the bootstrap's stats_tags; the gateway's own Envoy-style
	// statistics are in /stats only (their Prometheus form needs Envoy's
	// built-in tags, which the gateway does not have).
	mux.HandleFunc("/stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/plain; version=0.0.4")
		g.stats.WritePrometheus(w)
	})
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/plain")
		n, err := g.reload(ctx, "admin")
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "reload failed, generation %d still serving: %v\n", n, err)
			return
		}
		fmt.Fprintf(w, "generation %d\n", n)
	})
	return mux
}

// writeStats writes Envoy-like "name: value" lines: the gateway's own
// counters, then the plugin's wasmcustom.* metrics; with keep, only those
// whose names it matches.
func (g *gateway) writeStats(w io.Writer, keep *regexp.Regexp) {
	snap := g.counters.snapshot()
	gen := g.current()
	failed := int64(0)
	for _, vm := range gen.workers {
		if vm.Failed() {
			failed++
		}
	}
	snap["wasm.vm."+gen.cfg.Wasm.VMID+".failed"] = failed
	snap[statGeneration] = gen.n
	names := make([]string, 0, len(snap))
	for name := range snap {
		names = append(names, name)
	}
	sort.Strings(names)
	var all bytes.Buffer
	for _, name := range names {
		fmt.Fprintf(&all, "%s: %d\n", name, snap[name])
	}
	g.stats.WriteText(&all)
	for _, line := range strings.SplitAfter(all.String(), "\n") {
		name, _, _ := strings.Cut(line, ": ")
		if line != "" && (keep == nil || keep.MatchString(name)) {
			io.WriteString(w, line)
		}
	}
}

// counters are the gateway's own statistics, named as Envoy names them.
// Each is an atomic, made on first use: an increment on the request path
// takes no lock once the name exists (lazyCounter), and a name never used
// is not listed, as before.
type counters struct {
	mu sync.RWMutex
	m  map[string]*atomic.Int64
}

func (c *counters) counter(name string) *atomic.Int64 {
	c.mu.RLock()
	n := c.m[name]
	c.mu.RUnlock()
	if n != nil {
		return n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*atomic.Int64{}
	}
	if n = c.m[name]; n == nil {
		n = new(atomic.Int64)
		c.m[name] = n
	}
	return n
}

func (c *counters) inc(name string) { c.add(name, 1) }

func (c *counters) add(name string, d int64) { c.counter(name).Add(d) }

func (c *counters) snapshot() map[string]int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]int64, len(c.m))
	for k, v := range c.m {
		out[k] = v.Load()
	}
	return out
}

// lazyCounter is one counter whose name is known in advance; it is made
// in counters at its first increment.
type lazyCounter struct {
	c    *counters
	name string
	p    atomic.Pointer[atomic.Int64]
}

func (l *lazyCounter) inc() {
	p := l.p.Load()
	if p == nil {
		p = l.c.counter(l.name)
		l.p.Store(p)
	}
	p.Add(1)
}

// classCounters are prefix+"1xx" … prefix+"9xx", by status code.
type classCounters [10]lazyCounter

func newClassCounters(c *counters, prefix string) *classCounters {
	var cc classCounters
	for i := range cc {
		cc[i].c, cc[i].name = c, prefix+strconv.Itoa(i)+"xx"
	}
	return &cc
}

func (cc *classCounters) inc(code int) {
	if i := code / 100; i >= 0 && i < len(cc) {
		cc[i].inc()
		return
	}
	cc[0].c.inc(cc[0].name[:len(cc[0].name)-3] + statusClass(code))
}

// clusterCounters are a cluster's upstream statistics.
type clusterCounters struct {
	total, timeout, connectFail, reset, overflow lazyCounter
	class                                        *classCounters
}

func newClusterCounters(c *counters, cluster string) *clusterCounters {
	prefix := "cluster." + cluster + "."
	return &clusterCounters{
		total:       lazyCounter{c: c, name: prefix + "upstream_rq_total"},
		timeout:     lazyCounter{c: c, name: prefix + "upstream_rq_timeout"},
		connectFail: lazyCounter{c: c, name: prefix + "upstream_cx_connect_fail"},
		reset:       lazyCounter{c: c, name: prefix + "upstream_rq_rx_reset"},
		overflow:    lazyCounter{c: c, name: prefix + "upstream_rq_pending_overflow"},
		class:       newClassCounters(c, prefix+"upstream_rq_"),
	}
}

func statusClass(code int) string { return strconv.Itoa(code/100) + "xx" }

// newRequestID is a random (version 4) UUID, hex-encoded into one string.
func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:36], b[10:16])
	return string(out[:])
}
