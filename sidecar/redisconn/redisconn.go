// Package redisconn turns the sidecar's one Redis URL into a go-redis client:
// a single server, a Redis Cluster, or a master found through Sentinel.
//
// Accepted URLs (userinfo is optional everywhere; "rediss" means TLS):
//
//	redis://[user:password@]host:port[/db][?option=value...]
//	rediss://[user:password@]host:port[/db][?option=value...]
//	unix://[user:password@]/path/to/redis.sock[?db=N]
//	redis+cluster://[user:password@]host1:port1,host2:port2,...[?option=value...]
//	rediss+cluster://...
//	redis+sentinel://[user:password@]host1:port1,host2:port2,.../mastername[/db][?option=value...]
//	rediss+sentinel://...
//
// Cluster addresses are seeds: any reachable node lets the client discover
// the rest. Sentinel addresses are the sentinels; user and password are the
// data nodes' (Redis 6 ACL user or AUTH password), and the sentinels' own
// credentials go in the options sentinel_username and sentinel_password.
// Options are go-redis's URL options (dial_timeout, read_timeout,
// write_timeout, pool_size, max_retries, skip_verify, ...); an unknown option
// is an error.
package redisconn

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Kind is the deployment a URL names.
type Kind int

// Kinds of Redis deployment.
const (
	Standalone Kind = iota
	Cluster
	Sentinel
)

func (k Kind) String() string {
	switch k {
	case Cluster:
		return "cluster"
	case Sentinel:
		return "sentinel"
	}
	return "standalone"
}

// Defaults applied when the URL does not set the option. They are short
// because the sidecar answers 503 after a few milliseconds anyway: a Redis
// that takes a second to accept or answer is down for this purpose, and the
// connection is better dropped and redialled.
const (
	DefaultDialTimeout  = time.Second
	DefaultReadTimeout  = time.Second
	DefaultWriteTimeout = time.Second
	DefaultMaxRetries   = 2
	// DefaultClusterReload is how often a cluster client re-reads the slot
	// map (CLUSTER SLOTS, one cheap command). go-redis's own default is a
	// minute: after a failover, checks on the lost master's slots would keep
	// going to the dead address for up to that long.
	DefaultClusterReload = time.Second
	// DialerRetries is how many times a cluster or single-server client
	// dials a node before a command sees the dial fail: once (go-redis's
	// default is 5, 100 ms apart, which a killed master's checks waited
	// for, and a readiness check on a single server waited out its 250 ms
	// for, answering "context deadline exceeded" instead of the dial's
	// error).
	DialerRetries = 1
)

// Spec is a parsed, validated Redis URL. Parse checks everything that can be
// checked without connecting; NewClient only builds the client.
type Spec struct {
	Kind  Kind
	Addrs []string // the server, the cluster seeds, or the sentinels
	// Redacted is the URL with any password replaced by "xxxxx", for logs.
	Redacted string

	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// Parse validates rawURL. Errors name the part at fault and quote it, with
// any password removed.
func Parse(rawURL string) (*Spec, error) {
	withoutHosts, hostList, isList := cutHostList(rawURL)
	u, err := url.Parse(withoutHosts)
	if err != nil {
		// url.Error quotes the whole URL, password included: say less.
		return nil, fmt.Errorf("not a URL: %v", unwrapURLError(err))
	}
	if u.Opaque != "" {
		// No "//" after the scheme: "user:password@host:6379" (the scheme
		// left out) reads as scheme "user" and an opaque rest, and
		// "redis:password@host" as scheme redis with no host. Redacting
		// knows no password in an opaque rest: show none of it.
		return nil, fmt.Errorf("must be scheme://..., got %q followed by something other than // (not shown: it may hold a password)", u.Scheme+":")
	}
	if isList {
		u.Host = hostList
	}
	s := &Spec{Redacted: redact(u)}
	fail := func(format string, args ...any) (*Spec, error) {
		return nil, fmt.Errorf("%s: %s", s.Redacted, fmt.Sprintf(format, args...))
	}
	base, variant, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" && !(base == "unix" && variant == "") {
		return fail("scheme %q is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel", u.Scheme)
	}
	switch variant {
	case "":
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return fail("%v", err)
		}
		if base != "unix" {
			if err := checkAddr(o.Addr); err != nil {
				return fail("%v", err)
			}
		}
		if err := checkOptions(o.DB, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns, o.DialTimeout, u.Query().Get("dial_timeout")); err != nil {
			return fail("%v", err)
		}
		s.Kind, s.Addrs, s.single = Standalone, []string{o.Addr}, o
	case "cluster":
		addrs, err := splitAddrs(u.Host)
		if err != nil {
			return fail("%v", err)
		}
		if u.Path != "" && u.Path != "/" {
			return fail("a cluster URL has no path (Redis Cluster has only database 0), got %q", u.Path)
		}
		// go-redis's cluster URL form: the first seed as the host, the others
		// as addr= options.
		v := *u
		v.Scheme, v.Host, v.Path = base, addrs[0], ""
		q := u.Query()
		if _, ok := q["addr"]; ok {
			return fail("put every cluster address in the host list, not in addr= options")
		}
		for _, a := range addrs[1:] {
			q.Add("addr", a)
		}
		v.RawQuery = q.Encode()
		o, err := redis.ParseClusterURL(v.String())
		if err != nil {
			return fail("%v", err)
		}
		if err := checkOptions(0, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns, o.DialTimeout, u.Query().Get("dial_timeout")); err != nil {
			return fail("%v", err)
		}
		if o.TLSConfig != nil {
			// Each node is dialled by its own name, not the first seed's.
			o.TLSConfig.ServerName = ""
		}
		s.Kind, s.Addrs, s.cluster = Cluster, addrs, o
	case "sentinel":
		addrs, err := splitAddrs(u.Host)
		if err != nil {
			return fail("%v", err)
		}
		parts := strings.Split(strings.Trim(u.Path, "/"), "/")
		if parts[0] == "" || len(parts) > 2 {
			return fail("a sentinel URL's path is /mastername or /mastername/db, got %q", u.Path)
		}
		q := u.Query()
		sentinelUser, sentinelPass := q.Get("sentinel_username"), q.Get("sentinel_password")
		q.Del("sentinel_username")
		q.Del("sentinel_password")
		// Let go-redis parse the data-node options from an equivalent plain URL.
		v := *u
		v.Scheme, v.Host, v.Path, v.RawQuery = base, addrs[0], "", q.Encode()
		if len(parts) == 2 {
			v.Path = "/" + parts[1]
		}
		o, err := redis.ParseURL(v.String())
		if err != nil {
			return fail("%v", err)
		}
		if err := checkOptions(o.DB, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns, o.DialTimeout, u.Query().Get("dial_timeout")); err != nil {
			return fail("%v", err)
		}
		if o.TLSConfig != nil {
			o.TLSConfig.ServerName = ""
		}
		s.Kind, s.Addrs = Sentinel, addrs
		s.failover = &redis.FailoverOptions{
			MasterName:       parts[0],
			SentinelAddrs:    addrs,
			SentinelUsername: sentinelUser,
			SentinelPassword: sentinelPass,
			Username:         o.Username,
			Password:         o.Password,
			DB:               o.DB,
			TLSConfig:        o.TLSConfig,
			Protocol:         o.Protocol,
			ClientName:       o.ClientName,
			MaxRetries:       o.MaxRetries,
			MinRetryBackoff:  o.MinRetryBackoff,
			MaxRetryBackoff:  o.MaxRetryBackoff,
			DialTimeout:      o.DialTimeout,
			ReadTimeout:      o.ReadTimeout,
			WriteTimeout:     o.WriteTimeout,
			PoolFIFO:         o.PoolFIFO,
			PoolSize:         o.PoolSize,
			PoolTimeout:      o.PoolTimeout,
			MinIdleConns:     o.MinIdleConns,
			MaxIdleConns:     o.MaxIdleConns,
			MaxActiveConns:   o.MaxActiveConns,
			ConnMaxIdleTime:  o.ConnMaxIdleTime,
			ConnMaxLifetime:  o.ConnMaxLifetime,
			// Every other option go-redis reads from a URL, so that none
			// is accepted and then ignored.
			ConnMaxLifetimeJitter:   o.ConnMaxLifetimeJitter,
			MaxConcurrentDials:      o.MaxConcurrentDials,
			PipelinePoolSize:        o.PipelinePoolSize,
			PipelineReadBufferSize:  o.PipelineReadBufferSize,
			PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		}
	default:
		return fail("scheme %q is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel", u.Scheme)
	}
	return s, nil
}

// HasPassword reports whether the URL carries a password for the data nodes.
func (s *Spec) HasPassword() bool {
	switch s.Kind {
	case Cluster:
		return s.cluster.Password != ""
	case Sentinel:
		return s.failover.Password != ""
	}
	return s.single.Password != ""
}

// SetPassword sets the data nodes' password (the AUTH password, or the
// password of the URL's ACL user), as if the URL carried it. It keeps a
// password out of the URL, so it can come from a secret of its own.
func (s *Spec) SetPassword(password string) {
	switch s.Kind {
	case Cluster:
		s.cluster.Password = password
	case Sentinel:
		s.failover.Password = password
	default:
		s.single.Password = password
	}
}

// Tuning is what the sidecar sets on top of the URL.
type Tuning struct {
	// PoolSize, if > 0 and the URL sets no pool_size, bounds the connections
	// per node.
	PoolSize int
	// MinIdleConns, if > 0 and the URL sets no min_idle_conns, is how many
	// connections per node go-redis dials ahead of need and keeps open. The
	// sidecar's decisions have a deadline of a few milliseconds; a
	// connection dialed on a decision's way (a TLS handshake above all)
	// would spend it.
	MinIdleConns int
}

// ForPipelines is the sidecar's Tuning for its decisions' pipelines (at
// most pipelines at once; on a cluster, to each master): per node, room
// for them with some to spare for readiness, the hot clients and the
// script's loads, and as many connections as the pipelines dialed ahead
// and kept idle, so that a pipeline need not dial.
func ForPipelines(pipelines int) Tuning {
	return Tuning{PoolSize: 3*pipelines + 4, MinIdleConns: pipelines}
}

// NewClient builds the client the URL describes. It does not connect: go-redis
// dials lazily and redials after a connection is lost, so a sidecar started
// before its Redis, or outliving a Redis restart, needs nothing more.
func (s *Spec) NewClient(t Tuning) redis.UniversalClient {
	switch s.Kind {
	case Cluster:
		o := *s.cluster
		t.apply(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.PoolSize, &o.MinIdleConns)
		o.ClusterStateReloadInterval = orDefault(o.ClusterStateReloadInterval, DefaultClusterReload)
		// go-redis resends a pipeline's commands that a redirection (ASK,
		// MOVED) sent elsewhere only after its retry backoff, 10 to 30 ms
		// by default (a single command's, at once): past a decision's
		// deadline, so every check of a slot being resharded would fail
		// until the move ends and the slot map is re-read. The retries are
		// few (max_redirects, max_retries) and end with the batch's
		// deadline, so they go at once. A URL's min_retry_backoff stays.
		o.MinRetryBackoff = orDefault(o.MinRetryBackoff, -1)
		// go-redis runs a pipeline on a pool of its own per node, which
		// never keeps a connection idle (MinIdleConns does not reach it):
		// a fresh sidecar's first pipelines to each master, and the first
		// after a master's restart, dialed on their checks' way, through
		// HELLO and CLIENT SETINFO, past a decision's deadline. Without it
		// they run on the node's main pool, whose idle connections are
		// dialed ahead. A URL's pipeline_pool_size stays.
		if o.PipelinePoolSize == 0 {
			o.PipelinePoolSize = -1
		}
		// go-redis dials a node up to 5 times, 100 ms apart, before a
		// pipeline sees the error: a killed master's pipelines each spent
		// its second (ExecTimeout) dialing, and its checks waited out their
		// deadline for it, until the node's pool had failed enough dials to
		// stop dialing (about 0.9 s). Refused once, a dial fails its
		// pipeline at once. A restarted master answers CLUSTERDOWN for 2 s
		// after its start, longer than the pool's redial once a second, so
		// no check succeeds later for it. A URL's dialer_retries stays.
		if o.DialerRetries == 0 {
			o.DialerRetries = DialerRetries
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(&o)
	case Sentinel:
		o := *s.failover
		t.apply(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.PoolSize, &o.MinIdleConns)
		// As on a cluster, go-redis runs the failover client's pipelines
		// on a pool of their own that keeps no connection idle: a fresh
		// sidecar's first burst dialed each pipeline's connection, with
		// its handshake, on its checks' way. They run on the master's
		// main pool, dialed ahead. A URL's pipeline_pool_size stays.
		if o.PipelinePoolSize == 0 {
			o.PipelinePoolSize = -1
		}
		o.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(&o)
	}
	o := *s.single
	t.apply(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.PoolSize, &o.MinIdleConns)
	// On a single server the checks go over the sidecar's own connection,
	// and this client runs readiness, the script's loading and the hot
	// clients' reconciles. Dialing 5 times, 100 ms apart, a readiness check
	// on a Redis refusing connections (or presenting a certificate the
	// sidecar does not trust) waited out its 250 ms and said only "context
	// deadline exceeded"; dialing once, it says the dial's error at once.
	// (go-redis takes no dialer_retries in a single server's URL.)
	o.DialerRetries = DialerRetries
	o.ContextTimeoutEnabled = true
	return redis.NewClient(&o)
}

// MinIdleConns returns the idle connections per node the client keeps
// open, as NewClient (or the URL) set it.
func MinIdleConns(c redis.UniversalClient) int {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().MinIdleConns
	case *redis.ClusterClient:
		return c.Options().MinIdleConns
	}
	return 0
}

// apply fills what the URL left unset: the dial, read and write timeouts,
// the retries, the pool size and the idle connections kept. The three kinds
// of go-redis options keep these in fields of the same names but different
// types, hence the pointers.
func (t Tuning) apply(dial, read, write *time.Duration, retries, pool, minIdle *int) {
	*dial = orDefault(*dial, DefaultDialTimeout)
	*read = orDefault(*read, DefaultReadTimeout)
	*write = orDefault(*write, DefaultWriteTimeout)
	if *retries == 0 {
		*retries = DefaultMaxRetries
	}
	if *pool == 0 {
		*pool = t.PoolSize
	}
	if *minIdle == 0 {
		*minIdle = t.MinIdleConns
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// checkOptions rejects the values go-redis parses from a URL but cannot
// use: a negative database (Redis refuses SELECT, so the sidecar would never
// be ready), a negative pool size (go-redis panics building the pool), a
// negative count of idle or active connections, a dial_timeout of zero or
// less (go-redis reads it as "no timeout", which for a dial is a deadline
// already past: every dial fails at once). dialText is the URL's
// dial_timeout, for the error. An option left out keeps go-redis's or the
// sidecar's default.
func checkOptions(db, pool, minIdle, maxIdle, maxActive int, dial time.Duration, dialText string) error {
	switch {
	case db < 0:
		return fmt.Errorf("database: must be >= 0, got %d", db)
	case pool < 0:
		return fmt.Errorf("pool_size: must be >= 0, got %d", pool)
	case minIdle < 0:
		return fmt.Errorf("min_idle_conns: must be >= 0, got %d", minIdle)
	case maxIdle < 0:
		return fmt.Errorf("max_idle_conns: must be >= 0, got %d", maxIdle)
	case maxActive < 0:
		return fmt.Errorf("max_active_conns: must be >= 0, got %d", maxActive)
	case dial < 0:
		return fmt.Errorf("dial_timeout: must be > 0, got %q", dialText)
	}
	return nil
}

// hostListPlaceholder stands for a cluster or sentinel URL's host list while
// url.Parse reads the rest of the URL.
const hostListPlaceholder = "host-list.invalid"

// cutHostList takes the host list out of a cluster or sentinel URL
// (scheme with a "+"), putting a placeholder in its place, and returns the
// URL so changed and the list. url.Parse reads an authority as one host,
// and refuses "[::1]:7000,[::1]:7001": a host that opens with a bracket must
// be one IPv6 literal. Each address of the list is checked on its own by
// splitAddrs. The authority ends where url.Parse ends it, at the first "/",
// "?" or "#"; the userinfo, if any, at its last "@".
func cutHostList(rawURL string) (rest, hostList string, ok bool) {
	scheme, after, found := strings.Cut(rawURL, "://")
	if !found || !strings.Contains(scheme, "+") {
		return rawURL, "", false
	}
	end := strings.IndexAny(after, "/?#")
	if end < 0 {
		end = len(after)
	}
	authority := after[:end]
	at := strings.LastIndex(authority, "@") + 1
	return scheme + "://" + authority[:at] + hostListPlaceholder + after[end:], authority[at:], true
}

// splitAddrs splits "h1:p1,h2:p2" and checks each address.
func splitAddrs(hostList string) ([]string, error) {
	if hostList == "" {
		return nil, fmt.Errorf("no addresses: list them as host1:port1,host2:port2")
	}
	var addrs []string
	for a := range strings.SplitSeq(hostList, ",") {
		if err := checkAddr(a); err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" {
		return fmt.Errorf("address %q must be host:port", a)
	}
	// url.Parse's rules for one host: a bracketed host is an IPv6 literal,
	// and no character a URL's host cannot hold.
	if _, err := url.Parse("redis://" + a); err != nil {
		return fmt.Errorf("address %q: %v", a, unwrapURLError(err))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("address %q: port must be 1 to 65535", a)
	}
	return nil
}

// redact returns u without secrets: the userinfo password and the
// sentinel_password option.
func redact(u *url.URL) string {
	v := *u
	if q := v.Query(); q.Has("sentinel_password") {
		q.Set("sentinel_password", "xxxxx")
		v.RawQuery = q.Encode()
	}
	return v.Redacted()
}

func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}
