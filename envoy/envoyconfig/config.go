// Package envoyconfig reads envoy/envoy.yaml with Envoy's own API types
// (github.com/envoyproxy/go-control-plane) and extracts what the headless
// gateway needs: the listener, the admin address, the routes, the clusters
// and the proxy-wasm filter.
//
// Load is strict in the way Envoy is: an unknown field, an unknown @type, or
// a value that breaks a rule in Envoy's protos (their generated ValidateAll)
// is an error naming the path of the field. On top of that it checks the
// wiring Envoy checks at start-up (every route's cluster exists, the router
// is the last HTTP filter) and what the limiter needs (exactly one wasm
// filter, loaded from a local file, with a JSON configuration whose sidecar
// cluster exists).
package envoyconfig

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is the part of an Envoy bootstrap the gateway serves.
type Config struct {
	Listener string             // "host:port" of the HTTP listener
	Admin    string             // "host:port" of the admin interface; "" when the bootstrap has none
	Routes   []Route            // first match wins
	Clusters map[string]Cluster // by name
	Wasm     Wasm               // the envoy.filters.http.wasm filter
	// StreamIdleTimeout is the connection manager's stream_idle_timeout:
	// how long a stream may go without activity (Envoy's default 5 min
	// when unset; 0: none).
	StreamIdleTimeout time.Duration
	// Histograms is stats_config.histogram_bucket_settings, in order.
	Histograms []HistogramBuckets
}

// HistogramBuckets is one entry of stats_config.histogram_bucket_settings:
// the bucket bounds of the histograms whose full name Match accepts.
type HistogramBuckets struct {
	Match   func(name string) bool
	Buckets []float64 // ascending; nil: Envoy's defaults
}

// BucketsFor returns the bucket bounds of the histogram of that full name
// (for a plugin's, "wasmcustom.<name>"): those of the first setting that
// matches it, as Envoy picks them, or nil for the defaults.
func (c *Config) BucketsFor(name string) []float64 {
	for _, h := range c.Histograms {
		if h.Match(name) {
			return h.Buckets
		}
	}
	return nil
}

// Route sends requests whose path starts with Prefix to Cluster.
type Route struct {
	Prefix  string
	Cluster string
}

// Cluster is a static upstream cluster.
type Cluster struct {
	Name           string
	Endpoints      []string      // "host:port", in the file's order
	ConnectTimeout time.Duration // Envoy's default 5s when the file sets none
	// Limits is circuit_breakers.thresholds at the DEFAULT priority (the
	// one a plugin's calls and the router's requests use), Envoy's default
	// 1024 where the file sets none.
	Limits Limits
}

// Limits are a cluster's circuit breaker thresholds.
type Limits struct {
	MaxConnections, MaxPendingRequests, MaxRequests int
}

// Wasm is the proxy-wasm HTTP filter's configuration.
type Wasm struct {
	Name, RootID, VMID, Runtime string
	Filename                    string // vm_config.code.local.filename, as written (Envoy resolves it against its working directory)
	Configuration               string // plugin configuration, the StringValue's value
	FailOpen                    bool   // fail_open, or failure_policy FAIL_OPEN
}

// defaultConnectTimeout is Envoy's cluster connect_timeout when unset.
const defaultConnectTimeout = 5 * time.Second

// Override applies the gateway's command-line overrides: listen replaces the
// listener address, each clusters entry (name → host:port) replaces that
// cluster's endpoints with one, and wasmPath replaces the module's file name.
// Empty values change nothing. A cluster name the configuration does not
// define, or an address that is not host:port, is an error and leaves c
// unchanged.
func (c *Config) Override(listen string, clusters map[string]string, wasmPath string) error {
	if listen != "" {
		if err := checkHostPort(listen, true); err != nil {
			return fmt.Errorf("listen address %q: %w", listen, err)
		}
	}
	// Sorted so that the first error reported does not depend on map order.
	names := make([]string, 0, len(clusters))
	for name := range clusters {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, ok := c.Clusters[name]; !ok {
			return fmt.Errorf("cluster %q: not in the configuration (clusters: %s)", name, strings.Join(c.clusterNames(), ", "))
		}
		if err := checkHostPort(clusters[name], false); err != nil {
			return fmt.Errorf("cluster %q address %q: %w", name, clusters[name], err)
		}
	}

	if listen != "" {
		c.Listener = listen
	}
	for _, name := range names {
		cl := c.Clusters[name]
		cl.Endpoints = []string{clusters[name]}
		c.Clusters[name] = cl
	}
	if wasmPath != "" {
		c.Wasm.Filename = wasmPath
	}
	return nil
}

func (c *Config) clusterNames() []string {
	names := make([]string, 0, len(c.Clusters))
	for name := range c.Clusters {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// checkHostPort accepts "host:port" with a non-empty host and a numeric port;
// port 0 (pick a free one) only for a listening address.
func checkHostPort(addr string, listening bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %v", err)
	}
	if host == "" && !listening {
		return fmt.Errorf("want host:port: missing host")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	if n == 0 && !listening {
		return fmt.Errorf("port 0: want a number from 1 to 65535")
	}
	return nil
}
