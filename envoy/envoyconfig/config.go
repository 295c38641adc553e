// Package envoyconfig reads envoy/envoy.yaml with Envoy's own API types
// (github.com/envoyproxy/go-control-plane) and extracts what the headless
// gateway needs: the listener the proxy-wasm filter runs on and its routes,
// the other listeners (router only, as the stats listener), the admin
// address, the clusters, the filter and the stats configuration (histogram
// buckets and tags).
//
// Load is strict in the way Envoy is: an unknown field, an unknown @type, or
// a value that breaks a rule in Envoy's protos (their generated ValidateAll)
// is an error naming the path of the field. On top of that it checks the
// wiring Envoy checks at start-up (every route's cluster exists, the router
// is the last HTTP filter, listener names are unique) and what the limiter
// needs (exactly one wasm filter, loaded from a local file, with a JSON
// configuration whose sidecar cluster exists).
package envoyconfig

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is the part of an Envoy bootstrap the gateway serves.
type Config struct {
	Listener string // "host:port" of the listener the wasm filter runs on
	// ListenerIPv4Compat is its socket_address's ipv4_compat (ListenNetwork).
	ListenerIPv4Compat bool
	ListenerName       string  // its name
	Admin              string  // "host:port" of the admin interface; "" when the bootstrap has none
	Routes             []Route // the filter's listener's routes; first match wins
	// Listeners are the other listeners, in the file's order: HTTP
	// connection managers whose only HTTP filter is the router.
	Listeners []Listener
	Clusters  map[string]Cluster // by name
	Wasm      Wasm               // the envoy.filters.http.wasm filter
	// CORS is the policy of envoy.filters.http.cors, when that filter
	// comes before the wasm filter and the virtual host gives it a policy
	// (typed_per_filter_config); nil otherwise, and then nothing is done
	// for CORS, as Envoy's filter does nothing without a policy.
	CORS *CORSPolicy
	// ResponseHeadersToAdd are the virtual host's response_headers_to_add,
	// each appended to every response of a request that matched a route
	// (a service's, a direct response, a filter's or the router's local
	// reply), as Envoy's route finalizes a response's headers; not to the
	// CORS filter's answer to a preflight, which Envoy encodes directly.
	ResponseHeadersToAdd []Header
	// StreamIdleTimeout is the connection manager's stream_idle_timeout:
	// how long a stream may go without activity (Envoy's default 5 min
	// when unset; 0: none).
	StreamIdleTimeout time.Duration
	// EscapedSlashes is the connection manager's
	// path_with_escaped_slashes_action: what a %2F, %2f, %5C or %5c in the
	// path does before the filters and the router see it.
	EscapedSlashes EscapedSlashesAction
	// InternalAddresses are the client addresses the connection manager
	// takes for internal (internal_address_config.cidr_ranges): a request
	// from one, without an x-forwarded-for of its own, keeps the x-envoy-*
	// headers that steer the router (x-envoy-retry-on,
	// x-envoy-max-retries, …) and gets x-envoy-internal: true; any other
	// loses them. Unset, Envoy 1.33 and later take none (its changelog
	// for 1.33.0); 1.32 and earlier took 10/8, 172.16/12, 192.168/16,
	// 127.0.0.1, fd00::/8 and ::1, as 1.33 to 1.35 still do with the
	// runtime guard explicit_internal_address_config set to false.
	InternalAddresses []netip.Prefix
	// Proxy100Continue is the connection manager's proxy_100_continue:
	// true passes a request's Expect: 100-continue on, so that its 100
	// Continue comes only once the filters let it through; false (Envoy's
	// default) answers 100 Continue at once, before any filter, and drops
	// the Expect.
	Proxy100Continue bool
	// RejectUnderscores and DropUnderscores are the connection manager's
	// common_http_protocol_options.headers_with_underscores_action
	// (REJECT_REQUEST: a 400 for a request with a header whose name holds
	// an underscore; DROP_HEADER: such headers dropped; neither: ALLOW,
	// Envoy's default).
	RejectUnderscores, DropUnderscores bool
	// AcceptHTTP10 is the connection manager's
	// http_protocol_options.accept_http_10: false (Envoy's default)
	// answers an HTTP/1.0 request 426 before any filter.
	AcceptHTTP10 bool
	// Histograms is stats_config.histogram_bucket_settings, in order.
	Histograms []HistogramBuckets
	// Tags is stats_config.stats_tags, in order.
	Tags []TagSpecifier
}

// EscapedSlashesAction is what the connection manager does with a path
// holding escaped slashes or backslashes (%2F, %2f, %5C, %5c).
type EscapedSlashesAction int

// The actions of path_with_escaped_slashes_action. Envoy's
// IMPLEMENTATION_SPECIFIC_DEFAULT is KEEP_UNCHANGED.
const (
	// KeepEscapedSlashes leaves them as they are (KEEP_UNCHANGED).
	KeepEscapedSlashes EscapedSlashesAction = iota
	// UnescapeAndRedirect unescapes them and, when there were any, answers
	// 307 with the normalized path in location (UNESCAPE_AND_REDIRECT).
	UnescapeAndRedirect
	// UnescapeAndForward unescapes them and goes on (UNESCAPE_AND_FORWARD).
	UnescapeAndForward
	// RejectEscapedSlashes answers 400 when there are any (REJECT_REQUEST).
	RejectEscapedSlashes
)

// TagSpecifier is one entry of stats_config.stats_tags: a tag with a fixed
// value, or one whose value a regex takes from the stat's name.
type TagSpecifier struct {
	Name       string
	Regex      *regexp.Regexp // nil for a fixed value
	FixedValue string
	// prefix is the first name token the regex is anchored to (Envoy's
	// extractRegexPrefix); "" when it has none.
	prefix string
}

// Tag is one tag of a stat: its name and value.
type Tag struct{ Name, Value string }

// TagsFor returns the tag-extracted name and the tags of the stat of that
// full name (for a plugin's, "wasmcustom.<name>"), as Envoy's tag producer
// makes them from stats_config.stats_tags. Every specifier sees the whole
// name. A regex is searched for anywhere in it (Envoy runs custom ones as
// std::regex searches); when it matches, its first capture group is taken
// out of the name and the second, or else the first, is the value. A fixed
// value tags every stat. Of specifiers with the same tag name only the
// first that matches counts. Specifiers anchored to a first token ("^name\.")
// come after the others, as Envoy keeps them apart to try them only on
// names with that token. Envoy's built-in tags are not here
// (envoy/wasmhost/RATIONALE.md, known differences).
func (c *Config) TagsFor(name string) (string, []Tag) {
	var tags []Tag
	var cut [][2]int // ranges to take out of name
	first, _, _ := strings.Cut(name, ".")
	apply := func(t *TagSpecifier) {
		for _, have := range tags {
			if have.Name == t.Name {
				return
			}
		}
		if t.Regex == nil {
			tags = append(tags, Tag{t.Name, t.FixedValue})
			return
		}
		m := t.Regex.FindStringSubmatchIndex(name)
		if m == nil || t.Regex.NumSubexp() < 1 {
			return
		}
		group := func(i int) string {
			if m[2*i] < 0 {
				return "" // a group that took no part in the match
			}
			return name[m[2*i]:m[2*i+1]]
		}
		value := group(1)
		if t.Regex.NumSubexp() >= 2 {
			value = group(2)
		}
		tags = append(tags, Tag{t.Name, value})
		if m[2] >= 0 {
			cut = append(cut, [2]int{m[2], m[3]})
		}
	}
	for i := range c.Tags {
		if c.Tags[i].prefix == "" {
			apply(&c.Tags[i])
		}
	}
	for i := range c.Tags {
		if p := c.Tags[i].prefix; p != "" && p == first && strings.Contains(name, ".") {
			apply(&c.Tags[i])
		}
	}
	if len(cut) == 0 {
		return name, tags
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		if !inRanges(cut, i) {
			b.WriteByte(name[i])
		}
	}
	return b.String(), tags
}

func inRanges(rs [][2]int, i int) bool {
	for _, r := range rs {
		if i >= r[0] && i < r[1] {
			return true
		}
	}
	return false
}

// regexPrefix is the first token of a stat name that regex is anchored
// to: "^" and a token of letters, digits and '_' followed by an escaped
// dot (or a lookahead for one), or by "$" ending the regex; "" otherwise.
func regexPrefix(regex string) string {
	rest, ok := strings.CutPrefix(regex, "^")
	if !ok {
		return ""
	}
	n := 0
	for n < len(rest) && (rest[n] == '_' || rest[n] >= 'a' && rest[n] <= 'z' || rest[n] >= 'A' && rest[n] <= 'Z' || rest[n] >= '0' && rest[n] <= '9') {
		n++
	}
	if n == 0 {
		return ""
	}
	after := rest[n:]
	if strings.HasPrefix(after, `\.`) || strings.HasPrefix(after, `(?=\.)`) || after == "$" {
		return rest[:n]
	}
	return ""
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

// Header is a response header to add: a lower-case name and its value.
type Header struct{ Key, Value string }

// Route is one route of a virtual host: a request it matches goes to
// Cluster, or is answered with Direct.
type Route struct {
	// Exactly one of Prefix and Path is the match: Prefix (match.prefix)
	// matches a path that starts with it; Path (match.path) one that is
	// exactly it once the query string is removed. Both are case sensitive.
	Prefix, Path string
	Cluster      string          // route.cluster; "" for a direct response
	Direct       *DirectResponse // direct_response; nil for a route to a cluster
}

// Matches reports whether the route matches a request's :path, as Envoy
// matches prefix and path routes.
func (r Route) Matches(path string) bool {
	if r.Path != "" {
		p, _, _ := strings.Cut(path, "?")
		return p == r.Path
	}
	return strings.HasPrefix(path, r.Prefix)
}

// DirectResponse is a route's direct_response: Envoy answers the request
// itself with Status and Body (text/plain when there is one).
type DirectResponse struct {
	Status int
	Body   string
}

// Listener is a listener the wasm filter is not on: an HTTP connection
// manager whose only HTTP filter is the router, as a bootstrap exposes
// admin paths on a listener of their own (envoy.yaml's stats listener).
type Listener struct {
	Name       string
	Address    string // "host:port"
	IPv4Compat bool   // its socket_address's ipv4_compat (ListenNetwork)
	StatPrefix string // the connection manager's stat_prefix
	Routes     []Route
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

// CORSPolicy is envoy.extensions.filters.http.cors.v3.CorsPolicy as
// Envoy's CORS filter applies it (cors_filter.cc): a preflight (OPTIONS
// with a non-empty Origin and Access-Control-Request-Method) from an
// allowed origin is answered 200 by the filter, before the filters after
// it; one from another origin goes on unless ForwardNotMatchingPreflights
// is false; every response to a request from an allowed origin, a later
// filter's local reply included, gets Access-Control-Allow-Origin (the
// origin), Access-Control-Allow-Credentials when AllowCredentials and
// Access-Control-Expose-Headers when ExposeHeaders is set.
type CORSPolicy struct {
	AllowOrigins                 []func(string) bool // allow_origin_string_match
	AllowMethods, AllowHeaders   string              // "*" echoes the request's
	ExposeHeaders, MaxAge        string
	AllowCredentials             bool
	AllowPrivateNetworkAccess    bool
	ForwardNotMatchingPreflights bool // Envoy's default: true
}

// Allowed reports whether origin is one of the policy's, as Envoy's
// isOriginAllowed: a matcher that matches "*" allows every origin.
func (p *CORSPolicy) Allowed(origin string) bool {
	for _, m := range p.AllowOrigins {
		if m("*") || m(origin) {
			return true
		}
	}
	return false
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

// OverrideListeners replaces the addresses of the listeners named in addrs
// (name → host:port) among c.Listeners; the filter's own listener is
// Override's listen. An unknown name or a bad address is an error and
// leaves c unchanged.
func (c *Config) OverrideListeners(addrs map[string]string) error {
	names := make([]string, 0, len(addrs))
	for name := range addrs {
		names = append(names, name)
	}
	slices.Sort(names)
	index := map[string]int{}
	for i, l := range c.Listeners {
		index[l.Name] = i
	}
	for _, name := range names {
		if name == c.ListenerName {
			return fmt.Errorf("listener %q: the wasm filter's listener; its address is the listen address", name)
		}
		if _, ok := index[name]; !ok {
			var known []string
			for _, l := range c.Listeners {
				known = append(known, l.Name)
			}
			return fmt.Errorf("listener %q: not in the configuration (other listeners: %s)", name, strings.Join(known, ", "))
		}
		if err := checkHostPort(addrs[name], true); err != nil {
			return fmt.Errorf("listener %q address %q: %w", name, addrs[name], err)
		}
	}
	for _, name := range names {
		c.Listeners[index[name]].Address = addrs[name]
	}
	return nil
}

// MoveAdmin sets the admin address to addr, and with it every cluster
// endpoint that is the admin's address as configured: a cluster that
// reaches the admin (envoy.yaml's envoy_admin, behind the stats listener)
// must follow it, or it would reach whatever else listens there.
func (c *Config) MoveAdmin(addr string) error {
	if err := checkHostPort(addr, false); err != nil {
		return fmt.Errorf("admin address %q: %w", addr, err)
	}
	old := c.Admin
	c.Admin = addr
	if old == "" || old == addr {
		return nil
	}
	for name, cl := range c.Clusters {
		if !slices.Contains(cl.Endpoints, old) {
			continue
		}
		eps := slices.Clone(cl.Endpoints)
		for i, e := range eps {
			if e == old {
				eps[i] = addr
			}
		}
		cl.Endpoints = eps
		c.Clusters[name] = cl
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

// checkHostPort accepts "host:port" with a numeric port, and a non-empty
// host but for a listening address (":port", every address); port 0 (pick
// a free one) only for a listening address.
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

// ListenNetwork is the network net.Listen binds addr on as Envoy binds a
// listener's socket_address: an IPv4 address, an IPv4 socket only
// ("tcp4": 0.0.0.0 takes no IPv6 client, where Go's "tcp" would take both);
// an IPv6 address, an IPv6 socket only ("tcp6", IPV6_V6ONLY), or with
// ipv4_compat one that takes IPv4 clients too ("tcp"); anything else
// (an empty host), "tcp".
func ListenNetwork(addr string, ipv4Compat bool) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "tcp"
	}
	ip, err := netip.ParseAddr(host)
	switch {
	case err != nil:
		return "tcp"
	case ip.Is4():
		return "tcp4"
	case ipv4Compat:
		return "tcp"
	}
	return "tcp6"
}
