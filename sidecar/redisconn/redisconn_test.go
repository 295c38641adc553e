package redisconn

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParse(t *testing.T) {
	tests := []struct {
		url      string
		kind     Kind
		addrs    []string
		redacted string
	}{
		{"redis://127.0.0.1:6379/0", Standalone, []string{"127.0.0.1:6379"}, "redis://127.0.0.1:6379/0"},
		{"redis://u:secret@h:1/2", Standalone, []string{"h:1"}, "redis://u:xxxxx@h:1/2"},
		{"rediss://h:6380", Standalone, []string{"h:6380"}, "rediss://h:6380"},
		{"redis://h", Standalone, []string{"h:6379"}, "redis://h"},
		{"unix:///tmp/r.sock?db=2", Standalone, []string{"/tmp/r.sock"}, "unix:///tmp/r.sock?db=2"},
		{"redis+cluster://h1:7000,h2:7001,h3:7002", Cluster, []string{"h1:7000", "h2:7001", "h3:7002"}, "redis+cluster://h1:7000,h2:7001,h3:7002"},
		{"rediss+cluster://u:pw@h1:7000,h2:7001?dial_timeout=2s", Cluster, []string{"h1:7000", "h2:7001"}, "rediss+cluster://u:xxxxx@h1:7000,h2:7001?dial_timeout=2s"},
		{"redis+sentinel://s1:26379,s2:26379/mymaster/3?sentinel_password=spw", Sentinel, []string{"s1:26379", "s2:26379"}, "redis+sentinel://s1:26379,s2:26379/mymaster/3?sentinel_password=xxxxx"},
		{"rediss+sentinel://u:pw@s1:26379/mymaster", Sentinel, []string{"s1:26379"}, "rediss+sentinel://u:xxxxx@s1:26379/mymaster"},
		// IPv6 literals: url.Parse alone refuses a host list that holds one.
		{"redis://[::1]:6379", Standalone, []string{"[::1]:6379"}, "redis://[::1]:6379"},
		{"redis+cluster://u:pw@[::1]:7000,[fd00::2]:7001,h3:7002", Cluster, []string{"[::1]:7000", "[fd00::2]:7001", "h3:7002"}, "redis+cluster://u:xxxxx@[::1]:7000,[fd00::2]:7001,h3:7002"},
		{"rediss+cluster://[::1]:7000?dial_timeout=2s", Cluster, []string{"[::1]:7000"}, "rediss+cluster://[::1]:7000?dial_timeout=2s"},
		{"redis+sentinel://[::1]:26379,[::1]:26380/mymaster/2?sentinel_password=spw", Sentinel, []string{"[::1]:26379", "[::1]:26380"}, "redis+sentinel://[::1]:26379,[::1]:26380/mymaster/2?sentinel_password=xxxxx"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			s, err := Parse(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind != tt.kind || strings.Join(s.Addrs, " ") != strings.Join(tt.addrs, " ") || s.Redacted != tt.redacted {
				t.Fatalf("Parse = %v %v %q, want %v %v %q", s.Kind, s.Addrs, s.Redacted, tt.kind, tt.addrs, tt.redacted)
			}
		})
	}
}

func TestParseDetails(t *testing.T) {
	s, err := Parse("rediss+sentinel://app:pw@s1:26379,s2:26379/mymaster/3?sentinel_username=su&sentinel_password=spw&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	f := s.failover
	if f.MasterName != "mymaster" || f.DB != 3 || f.Username != "app" || f.Password != "pw" ||
		f.SentinelUsername != "su" || f.SentinelPassword != "spw" || f.DialTimeout != 2*time.Second ||
		f.TLSConfig == nil || f.TLSConfig.ServerName != "" {
		t.Fatalf("failover options = %+v", f)
	}
	// The options a sentinel URL shares with a plain one all reach the
	// failover client, none accepted and then dropped.
	p, err := Parse("redis+sentinel://s1:26379/mymaster?pipeline_pool_size=3&pipeline_read_buffer_size=4096" +
		"&pipeline_write_buffer_size=8192&max_concurrent_dials=5&conn_max_lifetime=1h&conn_max_lifetime_jitter=1m")
	if err != nil {
		t.Fatal(err)
	}
	if f := p.failover; f.PipelinePoolSize != 3 || f.PipelineReadBufferSize != 4096 || f.PipelineWriteBufferSize != 8192 ||
		f.MaxConcurrentDials != 5 || f.ConnMaxLifetime != time.Hour || f.ConnMaxLifetimeJitter != time.Minute {
		t.Fatalf("failover options = %+v", f)
	}
	c, err := Parse("rediss+cluster://app:pw@h1:7000,h2:7001,h3:7002?read_timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	v6, err := Parse("redis+cluster://[::1]:7000,[fd00::2]:7001")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(v6.cluster.Addrs, ","); got != "[::1]:7000,[fd00::2]:7001" {
		t.Fatalf("cluster seeds = %s, want [::1]:7000,[fd00::2]:7001", got)
	}
	co := c.cluster
	if strings.Join(co.Addrs, ",") != "h1:7000,h2:7001,h3:7002" || co.Username != "app" || co.Password != "pw" ||
		co.ReadTimeout != 5*time.Second || co.TLSConfig == nil || co.TLSConfig.ServerName != "" {
		t.Fatalf("cluster options = %+v", co)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct{ url, want string }{
		{"http://h:1", `http://h:1: scheme "http" is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel`},
		{"redis+foo://h:1", `redis+foo://h:1: scheme "redis+foo" is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel`},
		{"redis://u:secret@h:99999", `redis://u:xxxxx@h:99999: address "h:99999": port must be 1 to 65535`},
		{"redis://h:1/x", `redis://h:1/x: redis: invalid database number: "x"`},
		{"redis://h:1?bogus=1", `redis://h:1?bogus=1: redis: unexpected option: bogus`},
		{"redis://u:secret@h:1?dial_timeout=abc", `redis://u:xxxxx@h:1?dial_timeout=abc: redis: invalid dial_timeout duration: time: invalid duration "abc"`},
		{"redis+cluster://h1:7000,h2", `redis+cluster://h1:7000,h2: address "h2" must be host:port`},
		{"redis+cluster://u:secret@[::1]:7000,[::1:7001", `redis+cluster://u:xxxxx@[::1]:7000,[::1:7001: address "[::1:7001" must be host:port`},
		{"redis+sentinel://u:secret@[::1]:1,[zz]:2/m", `redis+sentinel://u:xxxxx@[::1]:1,[zz]:2/m: address "[zz]:2": invalid host: ParseAddr("zz"): unable to parse IP`},
		{"redis+cluster://h 1:7000", `redis+cluster://h%201:7000: address "h 1:7000": invalid character " " in host name`},
		{"redis+cluster://h1:7000,:7001", `redis+cluster://h1:7000,:7001: address ":7001" must be host:port`},
		{"redis+cluster://h1:1/3", `redis+cluster://h1:1/3: a cluster URL has no path (Redis Cluster has only database 0), got "/3"`},
		{"redis+cluster://h1:1?addr=h2:2", `redis+cluster://h1:1?addr=h2:2: put every cluster address in the host list, not in addr= options`},
		{"redis+cluster://h1:1?bogus=2", `redis+cluster://h1:1?bogus=2: redis: unexpected option: bogus`},
		{"redis+sentinel://s1:1", `redis+sentinel://s1:1: a sentinel URL's path is /mastername or /mastername/db, got ""`},
		{"redis+sentinel://s1:1/m/1/2", `redis+sentinel://s1:1/m/1/2: a sentinel URL's path is /mastername or /mastername/db, got "/m/1/2"`},
		{"redis+sentinel://s1:1/m/x", `redis+sentinel://s1:1/m/x: redis: invalid database number: "x"`},
		{"127.0.0.1:6379", `not a URL: first path segment in URL cannot contain colon`},
		{"default:secret@h:6379", `must be scheme://..., got "default:" followed by something other than // (not shown: it may hold a password)`},
		{"redis:secret@h:6379", `must be scheme://..., got "redis:" followed by something other than // (not shown: it may hold a password)`},
		{"rediss:u:secret@h:6379/0", `must be scheme://..., got "rediss:" followed by something other than // (not shown: it may hold a password)`},
		{"redis.default.svc:6379", `must be scheme://..., got "redis.default.svc:" followed by something other than // (not shown: it may hold a password)`},
		{"redis://u:secret@h:1/-1", `redis://u:xxxxx@h:1/-1: database: must be >= 0, got -1`},
		{"unix:///tmp/r.sock?db=-2", `unix:///tmp/r.sock?db=-2: database: must be >= 0, got -2`},
		{"redis+sentinel://s1:1/m/-1", `redis+sentinel://s1:1/m/-1: database: must be >= 0, got -1`},
		{"redis://h:1?pool_size=-3", `redis://h:1?pool_size=-3: pool_size: must be >= 0, got -3`},
		{"redis+cluster://h1:1,h2:2?pool_size=-1", `redis+cluster://h1:1,h2:2?pool_size=-1: pool_size: must be >= 0, got -1`},
		{"redis+sentinel://s1:1/m?pool_size=-1", `redis+sentinel://s1:1/m?pool_size=-1: pool_size: must be >= 0, got -1`},
		{"redis://h:1?min_idle_conns=-1", `redis://h:1?min_idle_conns=-1: min_idle_conns: must be >= 0, got -1`},
		{"redis://h:1?max_idle_conns=-1", `redis://h:1?max_idle_conns=-1: max_idle_conns: must be >= 0, got -1`},
		{"redis+cluster://h1:1?max_active_conns=-1", `redis+cluster://h1:1?max_active_conns=-1: max_active_conns: must be >= 0, got -1`},
		{"redis://h:1?dial_timeout=-1s", `redis://h:1?dial_timeout=-1s: dial_timeout: must be > 0, got "-1s"`},
		{"redis://h:1?dial_timeout=0", `redis://h:1?dial_timeout=0: dial_timeout: must be > 0, got "0"`},
		{"redis+cluster://h1:1?dial_timeout=0s", `redis+cluster://h1:1?dial_timeout=0s: dial_timeout: must be > 0, got "0s"`},
		{"redis+sentinel://s1:1/m?dial_timeout=-5ms", `redis+sentinel://s1:1/m?dial_timeout=-5ms: dial_timeout: must be > 0, got "-5ms"`},
	}
	for _, tt := range tests {
		_, err := Parse(tt.url)
		if err == nil || err.Error() != tt.want {
			t.Errorf("Parse(%q) = %v\nwant %s", tt.url, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q) error leaks the password: %v", tt.url, err)
		}
	}
}

func TestNewClientKinds(t *testing.T) {
	tests := []struct {
		url  string
		want string
	}{
		{"redis://127.0.0.1:1/0", "*redis.Client"},
		{"redis+cluster://127.0.0.1:1,127.0.0.1:2", "*redis.ClusterClient"},
		{"redis+sentinel://127.0.0.1:1/m", "*redis.Client"},
	}
	for _, tt := range tests {
		s, err := Parse(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		c := s.NewClient(Tuning{PoolSize: 7, MinIdleConns: 2})
		if n := MinIdleConns(c); n != 2 {
			t.Errorf("%s: MinIdleConns = %d, want 2", tt.url, n)
		}
		switch v := c.(type) {
		case *redis.Client:
			if tt.want != "*redis.Client" {
				t.Errorf("%s: got *redis.Client", tt.url)
			}
			if o := v.Options(); o.PoolSize != 7 || o.MinIdleConns != 2 || o.ReadTimeout != DefaultReadTimeout || !o.ContextTimeoutEnabled {
				t.Errorf("%s: options %+v", tt.url, o)
			}
		case *redis.ClusterClient:
			if tt.want != "*redis.ClusterClient" {
				t.Errorf("%s: got *redis.ClusterClient", tt.url)
			}
			if o := v.Options(); o.PoolSize != 7 || o.MinIdleConns != 2 || o.MaxRetries != DefaultMaxRetries || o.MinRetryBackoff != 0 {
				t.Errorf("%s: options %+v", tt.url, o)
			}
		}
		c.Close()
	}
}

// TestClusterRetryBackoff: a cluster client follows a redirection at once
// (no retry backoff, which go-redis reports as 0), unless the URL sets one.
func TestClusterRetryBackoff(t *testing.T) {
	for url, want := range map[string]time.Duration{
		"redis+cluster://127.0.0.1:1":                        0,
		"redis+cluster://127.0.0.1:1?min_retry_backoff=20ms": 20 * time.Millisecond,
	} {
		s, err := Parse(url)
		if err != nil {
			t.Fatal(err)
		}
		c := s.NewClient(Tuning{})
		if got := c.(*redis.ClusterClient).Options().MinRetryBackoff; got != want {
			t.Errorf("%s: MinRetryBackoff %v, want %v", url, got, want)
		}
		c.Close()
	}
}

// TestDialerRetries: a cluster or single-server client dials a node once
// before a command sees the dial fail (go-redis's default is 5), unless a
// cluster's URL sets dialer_retries (a single server's takes none); a
// Sentinel client keeps go-redis's 5.
func TestDialerRetries(t *testing.T) {
	for url, want := range map[string]int{
		"redis+cluster://127.0.0.1:1":                  1,
		"redis+cluster://127.0.0.1:1?dialer_retries=3": 3,
		"redis://127.0.0.1:1/0":                        1,
		"unix:///run/redis.sock":                       1,
		"redis+sentinel://127.0.0.1:1/m":               5,
	} {
		got := builtOption(t, url, func(o *redis.Options) int { return o.DialerRetries },
			func(o *redis.ClusterOptions) int { return o.DialerRetries })
		if got != want {
			t.Errorf("%s: DialerRetries %d, want %d", url, got, want)
		}
	}
}

// builtOption is one setting of the client NewClient builds for url: of
// its options (a single server's or a Sentinel's) or its cluster options.
func builtOption(t *testing.T, url string, single func(*redis.Options) int, cluster func(*redis.ClusterOptions) int) int {
	t.Helper()
	s, err := Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	c := s.NewClient(Tuning{})
	defer c.Close()
	switch v := c.(type) {
	case *redis.Client:
		return single(v.Options())
	case *redis.ClusterClient:
		return cluster(v.Options())
	}
	t.Fatalf("%s: a client of type %T", url, c)
	return 0
}

// TestPipelinePoolSize: a cluster's and a Sentinel client's pipelines run
// on the main pool (go-redis's -1) unless the URL sets pipeline_pool_size;
// a single server's client keeps go-redis's default (0: its own pool).
func TestPipelinePoolSize(t *testing.T) {
	for url, want := range map[string]int{
		"redis://127.0.0.1:1/0":                                  0,
		"redis+cluster://127.0.0.1:1":                            -1,
		"redis+cluster://127.0.0.1:1?pipeline_pool_size=3":       3,
		"redis+sentinel://127.0.0.1:1/m":                         -1,
		"redis+sentinel://127.0.0.1:1/m?pipeline_pool_size=3":    3,
		"redis+sentinel://127.0.0.1:1/m/2?pipeline_pool_size=-1": -1,
	} {
		got := builtOption(t, url, func(o *redis.Options) int { return o.PipelinePoolSize },
			func(o *redis.ClusterOptions) int { return o.PipelinePoolSize })
		if got != want {
			t.Errorf("%s: PipelinePoolSize %d, want %d", url, got, want)
		}
	}
}
