package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/e2e/envoyconfig"
	"github.com/edgelimit/edgelimit/e2e/wasmhost"
)

// routeTimeout is Envoy's default route timeout: an upstream that has not
// answered by then gets the client a 504.
const routeTimeout = 15 * time.Second

// drainTimeout bounds how long a shutdown waits for in-flight requests.
const drainTimeout = 10 * time.Second

type gateway struct {
	cfg       *envoyconfig.Config
	log       *slog.Logger
	wasmPath  string
	mod       *wasmhost.Module
	workers   []*wasmhost.VM
	next      atomic.Uint64
	calls     *countingDispatcher
	upstreams map[string]*upstream
	stats     *wasmhost.Stats
	counters  counters
	accessLog io.Writer
	logMu     sync.Mutex
	// pluginErrors collects the plugin's error lines while it is being
	// configured, to say why it refused its configuration.
	pluginErrors []string
	configuring  bool
}

// upstream is one cluster the router forwards to.
type upstream struct {
	name      string
	endpoints []string
	next      atomic.Uint64
	client    *http.Client
}

func newGateway(ctx context.Context, o options, log *slog.Logger) (*gateway, error) {
	cfg, err := envoyconfig.Load(o.config)
	if err != nil {
		return nil, err
	}
	if err := cfg.Override(o.listen, o.clusters, o.wasm); err != nil {
		return nil, err
	}
	if o.admin != "" {
		if _, _, err := net.SplitHostPort(o.admin); err != nil {
			return nil, fmt.Errorf("-admin %q: %w", o.admin, err)
		}
		cfg.Admin = o.admin
	}
	if cfg.Admin == "" {
		return nil, errors.New("no admin address: the configuration has none and -admin is not set")
	}
	poll, err := wasmhost.ParsePollMode(o.poll)
	if err != nil {
		return nil, fmt.Errorf("-poll-oneoff: %w", err)
	}
	g := &gateway{cfg: cfg, log: log, wasmPath: cfg.Wasm.Filename, stats: wasmhost.NewStats(), upstreams: map[string]*upstream{}}
	clusters := map[string]wasmhost.HTTPCluster{}
	for name, c := range cfg.Clusters {
		clusters[name] = wasmhost.HTTPCluster{Endpoints: c.Endpoints, ConnectTimeout: c.ConnectTimeout}
		g.upstreams[name] = newUpstream(c)
	}
	g.calls = &countingDispatcher{HTTPDispatcher: wasmhost.NewHTTPDispatcher(clusters), g: g}

	g.mod, err = wasmhost.LoadFile(ctx, g.wasmPath, wasmhost.ModuleOptions{Poll: poll})
	if err != nil {
		return nil, err
	}
	workers := o.concurrency
	if o.check {
		workers = 1
	}
	for i := 0; i < workers; i++ {
		vm, err := g.mod.NewVM(ctx, wasmhost.Options{
			PluginName: cfg.Wasm.Name,
			RootID:     cfg.Wasm.RootID,
			VMID:       cfg.Wasm.VMID,
			FailOpen:   cfg.Wasm.FailOpen,
			Dispatcher: g.calls,
			Stats:      g.stats,
			Log:        g.pluginLog(i),
			LogLevel:   wasmhost.LogInfo,
		})
		if err != nil {
			g.close()
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		g.workers = append(g.workers, vm)
		g.logMu.Lock()
		g.configuring, g.pluginErrors = true, nil
		g.logMu.Unlock()
		err = vm.Configure(cfg.Wasm.Configuration)
		g.logMu.Lock()
		g.configuring = false
		why := strings.Join(g.pluginErrors, "; ")
		g.logMu.Unlock()
		if err != nil {
			g.close()
			if why != "" {
				return nil, fmt.Errorf("plugin %s: %w: %s", cfg.Wasm.Name, err, why)
			}
			return nil, fmt.Errorf("plugin %s: %w", cfg.Wasm.Name, err)
		}
	}
	return g, nil
}

func newUpstream(c envoyconfig.Cluster) *upstream {
	dialer := &net.Dialer{Timeout: c.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &upstream{
		name:      c.Name,
		endpoints: c.Endpoints,
		client: &http.Client{
			Transport: &http.Transport{
				DialContext:         dialer.DialContext,
				MaxIdleConns:        1024,
				MaxIdleConnsPerHost: 256,
				IdleConnTimeout:     60 * time.Second,
				DisableCompression:  true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// pluginLog forwards a worker VM's plugin log lines to the gateway's log,
// as Envoy's "wasm log" lines.
func (g *gateway) pluginLog(worker int) func(wasmhost.LogLevel, string) {
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
			g.logMu.Lock()
			if g.configuring {
				g.pluginErrors = append(g.pluginErrors, msg)
			}
			g.logMu.Unlock()
		}
		g.log.Log(context.Background(), sl, "wasm log", "plugin", g.cfg.Wasm.Name, "worker", worker, "msg", msg)
	}
}

func (g *gateway) close() {
	for _, vm := range g.workers {
		vm.Close()
	}
	if g.calls != nil {
		g.calls.Close()
	}
	for _, u := range g.upstreams {
		u.client.CloseIdleConnections()
	}
	if g.mod != nil {
		g.mod.Close(context.Background())
	}
}

type workerKey struct{}

// serve runs the listener and the admin listener until ctx ends, then
// drains.
func (g *gateway) serve(ctx context.Context, ready chan<- [2]string) error {
	defer g.close()
	ln, err := net.Listen("tcp", g.cfg.Listener)
	if err != nil {
		return fmt.Errorf("listener: %w", err)
	}
	adminLn, err := net.Listen("tcp", g.cfg.Admin)
	if err != nil {
		ln.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 30 * time.Second,
		// Envoy hands each connection to one worker for its lifetime.
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, workerKey{}, int(g.next.Add(1)-1)%len(g.workers))
		},
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	admin := &http.Server{Handler: g.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- admin.Serve(adminLn) }()
	g.log.Info("gateway serving", "listener", ln.Addr().String(), "admin", adminLn.Addr().String(),
		"workers", len(g.workers), "module", g.wasmPath, "abi", g.mod.ABIVersion())
	if ready != nil {
		ready <- [2]string{ln.Addr().String(), adminLn.Addr().String()}
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	g.log.Info("draining")
	dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	err = srv.Shutdown(dctx)
	admin.Shutdown(dctx)
	return err
}

func (g *gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/plain")
		io.WriteString(w, "LIVE\n")
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/plain")
		g.writeStats(w)
	})
	return mux
}

// writeStats writes Envoy-like "name: value" lines: the gateway's own
// counters, then the plugin's wasmcustom.* metrics.
func (g *gateway) writeStats(w io.Writer) {
	snap := g.counters.snapshot()
	failed := int64(0)
	for _, vm := range g.workers {
		if vm.Failed() {
			failed++
		}
	}
	snap["wasm.vm."+g.cfg.Wasm.VMID+".failed"] = failed
	names := make([]string, 0, len(snap))
	for name := range snap {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "%s: %d\n", name, snap[name])
	}
	g.stats.WriteText(w)
}

// counters are the gateway's own statistics, named as Envoy names them.
type counters struct {
	mu sync.Mutex
	m  map[string]int64
}

func (c *counters) inc(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[name]++
}

func (c *counters) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

func statusClass(code int) string { return strconv.Itoa(code/100) + "xx" }

// countingDispatcher counts the plugin's callouts in the cluster's stats,
// as Envoy's async client does, and sends them on.
type countingDispatcher struct {
	*wasmhost.HTTPDispatcher
	g *gateway
}

func (d *countingDispatcher) Dispatch(ctx context.Context, call wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	prefix := "cluster." + call.Cluster + "."
	d.g.counters.inc(prefix + "upstream_rq_total")
	return d.HTTPDispatcher.Dispatch(ctx, call, func(r wasmhost.CalloutResponse) {
		if r.Reset {
			d.g.counters.inc(prefix + "upstream_rq_rx_reset")
		} else {
			d.g.counters.inc(prefix + "upstream_rq_" + statusClass(r.Status()))
		}
		respond(r)
	})
}

func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
