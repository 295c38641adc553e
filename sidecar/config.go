package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/sidecar/app"
	"github.com/edgelimit/edgelimit/sidecar/decide"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/redisconn"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// envPrefix starts the environment variable of every flag: -redis-timeout is
// SIDECAR_REDIS_TIMEOUT.
const envPrefix = "SIDECAR_"

// options is the command line, parsed and validated.
type options struct {
	cfg       app.Config
	check     bool
	logLevel  slog.Level
	logFormat string
}

const usageHead = `Usage: sidecar [flags]
       sidecar digest [-key-salt SALT] [API-KEY...]   (see sidecar digest -h)
       sidecar healthcheck [-timeout D] URL           (exit 0 if URL answers 2xx; for container health checks)

The rate limiter's sidecar: POST /v1/check decides, with one Redis round trip,
whether the client in x-api-key may go on (200) or not (429); POST /v1/warm is
the gateways' warm-up call, the same path without a client (no decision). Also
GET /healthz, GET /readyz (Redis reachable, script loaded and run on a bucket key) and GET /metrics
(Prometheus), on the check listener (-listen) and, if set, on the admin
listener (-admin-listen), which serves only these three.

Every flag can also be set by the environment variable shown with it; a flag on
the command line wins over the variable. Signals: SIGHUP reloads the plans file
(it is also reloaded when it changes); SIGTERM or SIGINT stop accepting
connections, finish the checks in flight and exit.

Flags:
`

const usageTail = `
-redis URL forms ("rediss" for TLS; user:password for Redis 6 ACL or AUTH):
  redis://[user:password@]host:port[/db]
  rediss://[user:password@]host:port[/db]
  unix://[user:password@]/path/redis.sock[?db=N]
  redis+cluster://[user:password@]host1:port1,host2:port2,...   (cluster seeds)
  redis+sentinel://[user:password@]s1:port1,s2:port2,.../mastername[/db]
    sentinel credentials: ?sentinel_username=...&sentinel_password=...
  IPv6 literals in brackets, lists included: redis+cluster://[fd00::10]:6379,[fd00::11]:6379
  go-redis URL options may follow (?dial_timeout=1s&pool_size=20...); the
  defaults are dial/read/write timeouts of 1s.

Bucket keys in Redis are "rl:{" + hex SHA-256 of the API key + "}", or
HMAC-SHA256 keyed by -key-salt when set (prefer SIDECAR_KEY_SALT to keep it off
the process list). Sidecars sharing a Redis must share the salt.

x-ratelimit-cost: a whole number from 1 to %d; default 1.
A cost larger than the plan's capacity is answered 429 with
x-ratelimit-never: true (no wait can help), no x-ratelimit-retry-after-ms, and
retry-after set to the seconds until the bucket is full (at least 1).
`

// parseOptions reads args and the environment (through getenv). Bad values
// are errors naming the flag (and variable) and the value.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		listen       = fs.String("listen", "127.0.0.1:8081", "`address` to serve POST /v1/check and POST /v1/warm (and /healthz, /readyz, /metrics) on; loopback by default, the sidecar sits next to the proxy")
		adminListen  = fs.String("admin-listen", "", "`address` of a second listener serving only /healthz, /readyz and /metrics, for probes and Prometheus (e.g. :8082); empty: none")
		redisURL     = fs.String("redis", "redis://127.0.0.1:6379/0", "Redis `URL`: a server, a cluster or a sentinel-managed master (forms below)")
		redisPass    = fs.String("redis-password", "", "Redis password, instead of one in the -redis URL (keeps it out of the URL; prefer the environment variable)")
		plansPath    = fs.String("plans", "", "plans file (YAML) `path`; required")
		redisTimeout = fs.Duration("redis-timeout", server.DefaultTimeout, "deadline for one decision; past it the check is answered 503 at once, so the gateway fails open in time")
		check        = fs.Bool("check", false, "validate the flags and the plans file, print what is wrong, exit non-zero on a problem; start nothing")
		keySalt      = fs.String("key-salt", "", "secret that keys the bucket-key digest (HMAC-SHA256); empty: plain SHA-256")
		plansPoll    = fs.Duration("plans-poll", plans.DefaultPollInterval, "how often to look at the plans file for changes")
		pipelines    = fs.Int("redis-pipelines", decide.DefaultPipelines, "pipelines in flight to Redis at once: on a single server all on one connection, on Cluster and Sentinel each on its own")
		maxBatch     = fs.Int("redis-max-batch", decide.DefaultMaxBatch, "most decisions sent in one pipeline")
		denyCache    = fs.Bool("deny-cache", true, "deny without Redis the checks that Redis's last answer for the bucket, and the checks on their way to it, show cannot be admitted; false sends every check to Redis")
		logLevel     = fs.String("log-level", "info", "log `level`: debug, info, warn or error")
		logFormat    = fs.String("log-format", "text", "log `format`: text or json")
	)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			if name != "" {
				name = " " + name
			}
			fmt.Fprintf(fs.Output(), "  -%s%s\n    \t%s\n    \tenv %s", f.Name, name, usage, envName(f.Name))
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(fs.Output(), " (default %q)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
		fmt.Fprintf(fs.Output(), usageTail, server.MaxCost)
	}

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	// The environment sets what the command line did not: a flag given
	// wins, and its variable is not read at all. Every bad variable is
	// reported.
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	var envErrs []error
	fs.VisitAll(func(f *flag.Flag) {
		v := getenv(envName(f.Name))
		if v == "" || onCommandLine[f.Name] {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s (-%s): want %s, got %q", envName(f.Name), f.Name, want(f), v))
		}
	})
	if err := errors.Join(envErrs...); err != nil {
		return nil, err
	}

	o := &options{check: *check, logFormat: *logFormat}
	var errs []error
	bad := func(flagName, format string, args ...any) {
		errs = append(errs, fmt.Errorf("-%s (%s): %s", flagName, envName(flagName), fmt.Sprintf(format, args...)))
	}
	listenHost, listenPort, listenErr := splitListen(*listen)
	if listenErr != nil {
		bad("listen", "%v", listenErr)
	}
	if *adminListen != "" {
		if host, port, err := splitListen(*adminListen); err != nil {
			bad("admin-listen", "%v", err)
		} else if listenErr == nil && sameSocket(host, port, listenHost, listenPort) {
			if *adminListen == *listen {
				bad("admin-listen", "must differ from -listen, got %q for both", *adminListen)
			} else {
				bad("admin-listen", "must not take -listen's port, got %q beside -listen %q: both cannot be bound", *adminListen, *listen)
			}
		}
	}
	spec, err := redisconn.Parse(*redisURL)
	if err != nil {
		bad("redis", "%v", err)
	} else if *redisPass != "" {
		if spec.HasPassword() {
			bad("redis-password", "the -redis URL has a password already; give it in one place")
		}
		spec.SetPassword(*redisPass)
	}
	if *plansPath == "" {
		bad("plans", "required: the path of the plans file")
	}
	if *redisTimeout <= 0 || *redisTimeout > time.Minute {
		bad("redis-timeout", "must be > 0 and <= 1m, got %s", *redisTimeout)
	}
	if *plansPoll < 10*time.Millisecond {
		bad("plans-poll", "must be >= 10ms, got %s", *plansPoll)
	}
	if *pipelines < 1 || *pipelines > 256 {
		bad("redis-pipelines", "must be 1 to 256, got %d", *pipelines)
	}
	if *maxBatch < 1 || *maxBatch > 10000 {
		bad("redis-max-batch", "must be 1 to 10000, got %d", *maxBatch)
	}
	if err := o.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		bad("log-level", "must be debug, info, warn or error, got %q", *logLevel)
	}
	if *logFormat != "text" && *logFormat != "json" {
		bad("log-format", "must be text or json, got %q", *logFormat)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	o.cfg = app.Config{
		Listen:       *listen,
		AdminListen:  *adminListen,
		Redis:        spec,
		PlansPath:    *plansPath,
		RedisTimeout: *redisTimeout,
		KeySalt:      []byte(*keySalt),
		PlansPoll:    *plansPoll,
		Pipelines:    *pipelines,
		MaxBatch:     *maxBatch,
		NoDenyCache:  !*denyCache,
	}
	return o, nil
}

// want describes the values a flag takes, for errors.
func want(f *flag.Flag) string {
	switch f.Value.(flag.Getter).Get().(type) {
	case time.Duration:
		return "a duration such as 3ms or 1s"
	case int:
		return "a whole number"
	case bool:
		return "true or false"
	}
	return "a string"
}

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// splitListen checks a listen address: host:port with a numeric port.
// sameSocket reports whether two listen addresses, split, name one port
// that only one of them can bind: the same port, not 0 (a port of the
// system's choice), on the same host or where either is a wildcard
// address, which holds the port on every address (`:8081` beside
// `127.0.0.1:8081`). IP literals are compared as addresses: `[::1]` is
// `[0:0:0:0:0:0:0:1]`, `[::ffff:127.0.0.1]` is `127.0.0.1` (Go binds an
// IPv4-mapped address as the IPv4 one), and `[0::]` is a wildcard. Host
// names are compared as written, not resolved.
func sameSocket(host1, port1, host2, port2 string) bool {
	p1, _ := strconv.ParseUint(port1, 10, 16)
	p2, _ := strconv.ParseUint(port2, 10, 16)
	if p1 != p2 || p1 == 0 {
		return false
	}
	a1, err1 := netip.ParseAddr(host1)
	a2, err2 := netip.ParseAddr(host2)
	wildcard := func(h string, a netip.Addr, err error) bool {
		return h == "" || err == nil && a.Unmap().IsUnspecified()
	}
	if wildcard(host1, a1, err1) || wildcard(host2, a2, err2) {
		return true
	}
	if err1 == nil && err2 == nil {
		return a1.Unmap() == a2.Unmap()
	}
	return host1 == host2
}

func splitListen(addr string) (string, string, error) {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("must be host:port, got %q", addr)
	}
	return host, port, nil
}
