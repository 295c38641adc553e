// Package app assembles the sidecar from its parts (plans, Redis client,
// batching decider, HTTP server, metrics) and runs it: start, reload, graceful
// shutdown. The binary in package main only turns flags and environment into
// a Config and signals into calls; tests and benchmarks run the same App in
// process.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/tick"
	"github.com/edgelimit/edgelimit/sidecar/decide"
	"github.com/edgelimit/edgelimit/sidecar/denycache"
	"github.com/edgelimit/edgelimit/sidecar/faillog"
	"github.com/edgelimit/edgelimit/sidecar/hot"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/redisconn"
	"github.com/edgelimit/edgelimit/sidecar/server"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// Config is everything the sidecar is told at start.
type Config struct {
	// Listen is the check listener's address: POST /v1/check, and also
	// /healthz, /readyz and /metrics. Port 0 picks a free port (see
	// App.Addr).
	Listen string
	// AdminListen, if set, is a second listener serving /healthz, /readyz
	// and /metrics only, for probes and Prometheus (see App.AdminAddr).
	// Empty: none.
	AdminListen string
	// Redis is the parsed -redis URL.
	Redis *redisconn.Spec
	// PlansPath is the plans file.
	PlansPath string
	// RedisTimeout is the deadline for one decision (default 4 ms).
	RedisTimeout time.Duration
	// KeySalt, if set, keys the bucket-key digest (HMAC-SHA256).
	KeySalt []byte
	// PlansPoll is how often the plans file is checked for changes
	// (default 1 s).
	PlansPoll time.Duration
	// Pipelines and MaxBatch tune the decider (see decide.Options).
	Pipelines, MaxBatch int
	// HotInterval is how often hot clients' demand is flushed and their
	// shares reconciled (default hot.DefaultInterval, 1 s).
	HotInterval time.Duration
	// NoHotSharding gives hot clients one bucket like any other client (for
	// comparisons); the plans file's regions are then ignored.
	NoHotSharding bool
	// NoDenyCache sends every check to Redis, where by default the checks
	// that Redis's last answers show cannot be admitted are denied without
	// it (sidecar/denycache).
	NoDenyCache bool
}

// App is a running sidecar.
type App struct {
	log     *slog.Logger
	stats   *stats.Stats
	plans   *plans.Store
	client  redis.UniversalClient
	decider *decide.Decider
	hot     *hot.Sharder // nil without sharding
	srv     *server.Server
	http    *fasthttp.Server
	ln      net.Listener
	admin   *fasthttp.Server // nil without AdminListen
	adminLn net.Listener
	// lnClosed and adminLnClosed are closed when the HTTP server closes
	// its listener (shutdownServer).
	lnClosed, adminLnClosed chan struct{}
	served                  chan error
	stopWatch               context.CancelFunc
	shutdown                sync.Once
}

// Start loads the plans, opens Redis, binds the listener and serves in the
// background. Redis need not be up: until it is, checks get 503 and /readyz
// says why. A bad plans file or an address that cannot be bound is an error;
// the latter names the flag (-listen, -admin-listen) and its variable.
func Start(cfg Config, log *slog.Logger) (*App, error) {
	if log == nil {
		log = slog.Default()
	}
	redis.SetLogger(newRedisLogger(log))
	a := &App{log: log, stats: stats.New(), served: make(chan error, 2)}
	var err error
	digester := keys.New(cfg.KeySalt)
	checkDigests := func(p *plans.Plans) error { return p.CheckDigests(digester.Kind()) }
	if a.plans, err = plans.OpenChecked(cfg.PlansPath, log, a.stats.Reload, checkDigests); err != nil {
		return nil, err
	}
	a.stats.PlansLoaded(time.Now())
	// The listeners are bound before the Redis client is made, which dials
	// its idle connections in the background at once: an address that
	// cannot be bound stops the sidecar without a dial to Redis, and no
	// go-redis line is logged after Start has returned its error.
	if a.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		// Named as the flag and its variable, as a bad value is: the
		// address is the operator's, whatever keeps it from being bound.
		return nil, fmt.Errorf("-listen (SIDECAR_LISTEN): %w", err)
	}
	if cfg.AdminListen != "" {
		if a.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			a.ln.Close()
			return nil, fmt.Errorf("-admin-listen (SIDECAR_ADMIN_LISTEN): %w", err)
		}
	}
	pipelines := cfg.Pipelines
	if pipelines <= 0 {
		pipelines = decide.DefaultPipelines
	}
	a.client = cfg.Redis.NewClient(redisconn.ForPipelines(pipelines))
	a.decider = decide.New(a.client, decide.Options{
		Pipelines:  pipelines,
		WarmConns:  min(pipelines, redisconn.MinIdleConns(a.client)),
		MaxBatch:   cfg.MaxBatch,
		OnBatch:    a.stats.ObserveBatch,
		OnNoScript: a.stats.ScriptLoads.Inc,
		Direct:     cfg.Redis.Kind == redisconn.Standalone,
	})
	var sharder *hot.Sharder
	if !cfg.NoHotSharding {
		sharder = hot.New(a.client, log)
		sharder.OnReconcileError = a.stats.HotReconcileErrors.Inc
		a.hot = sharder
		a.plans.BeforeSwap = func(old, new *plans.Plans) { a.carryHot(digester, old, new) }
	}
	var decider server.Decider = a.decider
	if !cfg.NoDenyCache {
		dc := denycache.New(a.decider)
		dc.OnDenied = a.stats.DeniedCached.Inc
		dc.OnFull = a.stats.DenyCacheFull.Inc
		decider = dc
	}
	srv := server.New(server.Options{
		Plans:   a.plans.Current,
		Hot:     sharder,
		Decider: decider,
		Keys:    digester,
		Timeout: cfg.RedisTimeout,
		Stats:   a.stats,
		Log:     log,
	})
	a.srv = srv
	a.http = srv.HTTPServer()
	if a.adminLn != nil {
		a.admin = srv.AdminHTTPServer()
	}

	var watchCtx context.Context
	watchCtx, a.stopWatch = context.WithCancel(context.Background())
	go a.plans.Watch(watchCtx, cfg.PlansPoll)
	if sharder != nil {
		go sharder.Run(watchCtx, cfg.HotInterval)
	}
	go a.watchEviction(watchCtx, cfg.Redis.Redacted)
	a.lnClosed, a.adminLnClosed = make(chan struct{}), make(chan struct{})
	go func() { a.served <- a.http.Serve(srv.CheckListener(closeSignal(a.ln, a.lnClosed))) }()
	if a.admin != nil {
		go func() { a.served <- a.admin.Serve(srv.AdminListener(closeSignal(a.adminLn, a.adminLnClosed))) }()
	}

	// Load the script now rather than on the first request, and say whether
	// Redis is there; neither is fatal.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p := a.plans.Current()
	if err := a.decider.Ready(ctx); err != nil {
		log.Warn("redis not ready yet; checks answer 503 until it is", "redis", cfg.Redis.Redacted, "err", err)
		go a.awaitRedis(watchCtx, log, cfg.Redis.Redacted)
	}
	log.Info("sidecar listening", "addr", a.Addr(), "admin_addr", a.AdminAddr(), "redis", cfg.Redis.Redacted, "redis_kind", cfg.Redis.Kind.String(),
		"plans", cfg.PlansPath, "plan_count", len(p.ByName), "clients", p.Clients(), "hot_clients", p.HotClients(),
		"redis_timeout", serverTimeout(cfg.RedisTimeout), "key_salt", len(cfg.KeySalt) > 0)
	return a, nil
}

// awaitRedis asks for readiness once a second until Redis is ready, so that
// a sidecar started before Redis loads the script, opens its connections
// and warms the decision path then, not at its first check or its first
// /readyz, and says so once. It ends with ctx (Shutdown cancels it).
func (a *App) awaitRedis(ctx context.Context, log *slog.Logger, redis string) {
	tick.Every(ctx, decide.DefaultReadyCache, func() bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if a.decider.Ready(rctx) != nil {
			return true
		}
		log.Info("redis ready", "redis", redis)
		return false
	})
}

func serverTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return server.DefaultTimeout
	}
	return d
}

// Addr is the address the check listener listens on.
func (a *App) Addr() string { return a.ln.Addr().String() }

// AdminAddr is the address the admin listener listens on, "" without one.
func (a *App) AdminAddr() string {
	if a.adminLn == nil {
		return ""
	}
	return a.adminLn.Addr().String()
}

// Stats exposes the metrics (for tests and benchmarks).
func (a *App) Stats() *stats.Stats { return a.stats }

// carryTimeout bounds the Redis work of carrying the tokens of the clients
// one reload marks hot or unmarks (the reload waits for it).
const carryTimeout = 2 * time.Second

// carryHot carries the tokens of each client whose bucket layout differs
// between old and new (marked hot, unmarked, other regions) to the buckets
// of its new layout (hot.Carry). A client without a plan in either file
// has no tokens to carry. What cannot be carried is logged; the client's
// new buckets then start as they would without it (full, or as they were
// left).
func (a *App) carryHot(d *keys.Digester, old, new *plans.Plans) {
	changes := plans.HotChanges(old, new)
	if len(changes) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), carryTimeout)
	defer cancel()
	var failed int
	var first string
	var firstErr error
	for _, c := range changes {
		if c.FromPlan == nil || c.ToPlan == nil {
			continue
		}
		base := keys.BucketKeyOf(c.Sum)
		if c.Key != "" {
			base = d.BucketKey([]byte(c.Key))
		}
		from := hot.Layout{Regions: c.From, Capacity: c.FromPlan.Capacity, Rate: c.FromPlan.Rate}
		to := hot.Layout{Regions: c.To, Capacity: c.ToPlan.Capacity, Rate: c.ToPlan.Rate}
		carried, tokens, err := hot.Carry(ctx, a.client, base, from, to)
		if err != nil {
			// One line for the reload, naming the first client: a file
			// marking 200 clients hot while Redis is down is one failure.
			if failed++; failed == 1 {
				first, firstErr = base, err
			}
			continue
		}
		if carried {
			a.log.Info("hot client's tokens carried to its new buckets", "client", keys.LogID(base),
				"from", strings.Join(c.From, ","), "to", strings.Join(c.To, ","), "tokens", tokens)
		}
	}
	if failed > 0 {
		a.log.Warn("hot clients' tokens not carried to their new buckets", "failed", failed, "client", keys.LogID(first), "err", firstErr)
	}
}

// Reload re-reads the plans file now (SIGHUP). A bad file is logged and the
// plans in force kept; the error is returned too.
func (a *App) Reload() error { return a.plans.Reload("SIGHUP") }

// Done receives the serving error, if any, when either HTTP server stops.
func (a *App) Done() <-chan error { return a.served }

// Shutdown stops accepting connections, lets in-flight checks finish (until
// ctx ends), then stops the decider and closes Redis. It is safe to call more
// than once.
func (a *App) Shutdown(ctx context.Context) error {
	var err error
	a.shutdown.Do(func() {
		a.stopWatch()
		// /readyz says 503 before the check listener closes, and for as
		// long as its last checks take.
		a.srv.Stopping()
		err = shutdownServer(ctx, a.http, a.lnClosed)
		// The admin listener goes last: probes and scrapes see the sidecar
		// until its checks are done.
		if a.admin != nil {
			err = errors.Join(err, shutdownServer(ctx, a.admin, a.adminLnClosed))
		}
		a.decider.Close()
		if cerr := a.client.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
			err = errors.Join(err, cerr)
		}
		a.log.Info("sidecar stopped")
	})
	return err
}

// shutdownPoll is how often shutdownServer looks for the server's last
// connection to have closed.
const shutdownPoll = time.Millisecond

// shutdownServer is srv.ShutdownWithContext (its listener closed, its idle
// connections closed, the requests in flight answered, each on a
// connection then closed), but it returns as soon as srv has no connection
// left once lnClosed is closed, where fasthttp looks only every 100 ms: a
// sidecar on SIGTERM with the proxy's keep-alive connections open took 101
// ms to exit, and for a restart in place (the same port, as a container
// restarts) that is 101 ms more in which no sidecar listens and every
// check fails open. The shutdown goes on in the background and ends at its
// next look; with no listener and no connection, there is nothing left
// for it to wait for.
func shutdownServer(ctx context.Context, srv *fasthttp.Server, lnClosed <-chan struct{}) error {
	done := make(chan error, 1)
	go func() { done <- srv.ShutdownWithContext(ctx) }()
	select {
	case err := <-done:
		return err
	case <-lnClosed:
	}
	tick := time.NewTicker(shutdownPoll)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			// Once the server is stopping, the count is every connection
			// still served and the accept loop until it has returned.
			if srv.GetOpenConnectionsCount() == 0 {
				return nil
			}
		}
	}
}

// closeSignal returns ln that closes closed when it is closed.
func closeSignal(ln net.Listener, closed chan struct{}) net.Listener {
	return &signalListener{Listener: ln, closed: closed}
}

type signalListener struct {
	net.Listener
	closed chan struct{}
	once   sync.Once
}

func (l *signalListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.closed) })
	return err
}

// redisLogger sends go-redis's own messages (dial and handshake failures:
// connection refused, a TLS certificate Redis's server does not pass, a
// wrong password) to slog. They say why Redis cannot be reached, which the
// decisions they fail ("context deadline exceeded") do not, so the first
// one in each interval goes out at warn, with the number held back since
// the last, and the rest at debug.
type redisLogger struct {
	log   *slog.Logger
	lines *faillog.Log
}

// redisLogEvery is the least time between two warn lines from go-redis.
const redisLogEvery = 10 * time.Second

func newRedisLogger(log *slog.Logger) redisLogger {
	return redisLogger{log: log, lines: &faillog.Log{Every: redisLogEvery}}
}

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if held, warn := l.lines.Failed(time.Now(), 1); warn {
		l.log.Warn("redis client", "msg", msg, "suppressed", held)
		return
	}
	l.log.Debug("redis client", "msg", msg)
}
