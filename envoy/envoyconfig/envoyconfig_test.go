package envoyconfig

import (
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/limiter"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// realConfig is the bootstrap users deploy; these tests hold it to what the
// gateway and the filter expect.
const realConfig = "../../envoy/envoy.yaml"

func TestLoadRealConfig(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listener != "0.0.0.0:10000" {
		t.Errorf("Listener = %q, want 0.0.0.0:10000", c.Listener)
	}
	if c.Admin != "127.0.0.1:9901" {
		t.Errorf("Admin = %q, want 127.0.0.1:9901 (loopback only)", c.Admin)
	}
	if c.StreamIdleTimeout != 10*time.Second {
		t.Errorf("StreamIdleTimeout = %v, want 10s (a failed module must not hang paused clients for Envoy's default 5 min)", c.StreamIdleTimeout)
	}
	if c.ListenerName != "edge" {
		t.Errorf("ListenerName = %q, want edge", c.ListenerName)
	}
	if !c.RejectUnderscores || c.DropUnderscores {
		t.Error("headers_with_underscores_action is not REJECT_REQUEST (x_api_key must not reach a service that reads it as x-api-key)")
	}
	if !c.Proxy100Continue {
		t.Error("Proxy100Continue = false, want true (a denied client that sent Expect: 100-continue must get its 429 before it uploads)")
	}
	if c.InternalAddresses == nil || len(c.InternalAddresses) > 0 {
		t.Errorf("InternalAddresses = %v, want none (no client may steer the router with x-envoy-* headers)", c.InternalAddresses)
	}
	// Envoy's edge guidance. Each stream is a callout sent as its headers
	// arrive: unset, one connection may hold 1024 streams (2^31-1 before
	// Envoy 1.36), as many checks at one instant as ratelimit_sidecar's
	// max_requests, past which every client's callouts fail open. The
	// gateway serves HTTP/1.1 only, so Config has no use for these: they
	// are read from the decoded bootstrap.
	type h2Limits struct{ maxConcurrentStreams, streamWindow, connectionWindow uint32 }
	h2 := edgeHCM(t).GetHttp2ProtocolOptions()
	got := h2Limits{h2.GetMaxConcurrentStreams().GetValue(), h2.GetInitialStreamWindowSize().GetValue(), h2.GetInitialConnectionWindowSize().GetValue()}
	if want := (h2Limits{100, 64 << 10, 1 << 20}); got != want {
		t.Errorf("http2_protocol_options = %+v, want %+v (Envoy's edge guidance: a connection's checks in flight at most a tenth of the sidecar cluster's max_requests, its buffers bounded)", got, want)
	}
	if sc := c.Clusters["ratelimit_sidecar"]; int(got.maxConcurrentStreams)*10 > sc.Limits.MaxRequests {
		t.Errorf("max_concurrent_streams %d is more than a tenth of ratelimit_sidecar's max_requests %d: a few connections' bursts fill it", got.maxConcurrentStreams, sc.Limits.MaxRequests)
	}
	wantRoutes := []Route{{Prefix: "/orders", Cluster: "orders"}, {Prefix: "/billing", Cluster: "billing"}}
	if !reflect.DeepEqual(c.Routes, wantRoutes) {
		t.Errorf("Routes = %+v, want %+v", c.Routes, wantRoutes)
	}
	wantListeners := []Listener{{Name: "stats", Address: "0.0.0.0:9902", StatPrefix: "stats", Routes: []Route{
		{Path: "/stats/prometheus", Cluster: "envoy_admin"},
		{Path: "/ready", Cluster: "envoy_admin"},
		{Prefix: "/", Direct: &DirectResponse{Status: 404}},
	}}}
	if !reflect.DeepEqual(c.Listeners, wantListeners) {
		t.Errorf("Listeners = %+v, want %+v", c.Listeners, wantListeners)
	}
	wantClusters := map[string]Cluster{
		"orders":            {Name: "orders", Endpoints: []string{"127.0.0.1:9001"}, ConnectTimeout: time.Second, Limits: Limits{1024, 1024, 1024}},
		"billing":           {Name: "billing", Endpoints: []string{"127.0.0.1:9002"}, ConnectTimeout: time.Second, Limits: Limits{1024, 1024, 1024}},
		"ratelimit_sidecar": {Name: "ratelimit_sidecar", Endpoints: []string{"127.0.0.1:8081"}, ConnectTimeout: 250 * time.Millisecond, Limits: Limits{1024, 1024, 1024}},
		"envoy_admin":       {Name: "envoy_admin", Endpoints: []string{"127.0.0.1:9901"}, ConnectTimeout: 250 * time.Millisecond, Limits: Limits{1024, 1024, 1024}},
	}
	if !reflect.DeepEqual(c.Clusters, wantClusters) {
		t.Errorf("Clusters = %+v, want %+v", c.Clusters, wantClusters)
	}
	w := c.Wasm
	w.Configuration = ""
	wantWasm := Wasm{
		Name: "edge_ratelimit", RootID: "edge_ratelimit", VMID: "edge_ratelimit",
		Runtime: "envoy.wasm.runtime.v8", Filename: "build/filter.wasm", FailOpen: true,
	}
	if w != wantWasm {
		t.Errorf("Wasm = %+v, want %+v", w, wantWasm)
	}
}

// The stats listener is how Prometheus and health checks reach the admin,
// which stays on loopback: its routes go to a cluster whose every endpoint
// is the admin's address, for read-only paths only, and anything else is
// answered 404 by the listener itself.
func TestRealConfigStatsListener(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	if host, _, _ := strings.Cut(c.Admin, ":"); host != "127.0.0.1" {
		t.Fatalf("admin on %s, want loopback", c.Admin)
	}
	if len(c.Listeners) != 1 || c.Listeners[0].Name != "stats" {
		t.Fatalf("Listeners = %+v, want the stats listener only", c.Listeners)
	}
	readOnly := map[string]bool{"/stats/prometheus": true, "/ready": true}
	routes := c.Listeners[0].Routes
	for _, r := range routes[:len(routes)-1] {
		if !readOnly[r.Path] {
			t.Errorf("route %+v: want an exact path among %v", r, readOnly)
		}
		if eps := c.Clusters[r.Cluster].Endpoints; len(eps) == 0 || slices.ContainsFunc(eps, func(e string) bool { return e != c.Admin }) {
			t.Errorf("route %+v goes to %v, want only the admin %s", r, eps, c.Admin)
		}
	}
	last := routes[len(routes)-1]
	if last.Prefix != "/" || last.Direct == nil || last.Direct.Status != 404 {
		t.Errorf("last route %+v, want every other path answered 404 directly", last)
	}
	for _, p := range []string{"/stats", "/config_dump", "/quitquitquit", "/stats/prometheusx", "/ready/x"} {
		for _, r := range routes {
			if r.Matches(p) {
				if r.Direct == nil {
					t.Errorf("%s reaches the admin through %+v", p, r)
				}
				break
			}
		}
	}
}

// Prefix and path routes match as Envoy's do: a path route ignores the
// query string and nothing else.
func TestRouteMatches(t *testing.T) {
	for _, tc := range []struct {
		r    Route
		path string
		want bool
	}{
		{Route{Prefix: "/orders"}, "/orders", true},
		{Route{Prefix: "/orders"}, "/orders/1?x=y", true},
		{Route{Prefix: "/orders"}, "/ordersx", true},
		{Route{Prefix: "/orders"}, "/Orders", false},
		{Route{Prefix: "/"}, "/anything", true},
		{Route{Path: "/ready"}, "/ready", true},
		{Route{Path: "/ready"}, "/ready?x", true},
		{Route{Path: "/ready"}, "/ready/", false},
		{Route{Path: "/ready"}, "/readyz", false},
		{Route{Path: "/ready"}, "/READY", false},
		{Route{Path: "/stats/prometheus"}, "/stats/prometheus?usedonly&filter=edgelimit", true},
	} {
		if got := tc.r.Matches(tc.path); got != tc.want {
			t.Errorf("%+v matches %q = %t, want %t", tc.r, tc.path, got, tc.want)
		}
	}
}

// A second listener of router and direct responses loads beside the
// filter's; a direct response keeps its inline body.
func TestLoadSecondListener(t *testing.T) {
	base, err := os.ReadFile("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(string(base), "  clusters:\n", `  - name: stats
    address: {socket_address: {address: 0.0.0.0, port_value: 9902}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: metrics
          route_config:
            virtual_hosts:
            - name: admin
              domains: ["*"]
              routes:
              - {match: {path: /stats/prometheus}, route: {cluster: orders}}
              - {match: {prefix: /gone}, direct_response: {status: 410, body: {inline_string: "gone\n"}}}
              - {match: {prefix: /bytes}, direct_response: {status: 200, body: {inline_bytes: b2s=}}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
`, 1)
	c, err := parse([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	want := []Listener{{Name: "stats", Address: "0.0.0.0:9902", StatPrefix: "metrics", Routes: []Route{
		{Path: "/stats/prometheus", Cluster: "orders"},
		{Prefix: "/gone", Direct: &DirectResponse{Status: 410, Body: "gone\n"}},
		{Prefix: "/bytes", Direct: &DirectResponse{Status: 200, Body: "ok"}},
	}}}
	if !reflect.DeepEqual(c.Listeners, want) {
		t.Errorf("Listeners = %+v, want %+v", c.Listeners, want)
	}
	if c.Listener != "0.0.0.0:10000" || c.ListenerName != "edge" || c.Wasm.RootID != "edge_ratelimit" {
		t.Errorf("the filter's listener: %s %s, wasm %+v", c.ListenerName, c.Listener, c.Wasm)
	}
}

// The filter's configuration inside the bootstrap is JSON with the fields
// filter/README.md documents, pointing at the sidecar cluster. (The filter checks
// its own rules at start-up; this checks the values the deployment relies on.)
func TestRealConfigFilterJSON(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	var fc struct {
		SidecarCluster   string          `json:"sidecar_cluster"`
		SidecarAuthority string          `json:"sidecar_authority"`
		TimeoutMS        float64         `json:"timeout_ms"`
		APIKeyHeader     string          `json:"api_key_header"`
		Mode             string          `json:"mode"`
		CanaryClients    []string        `json:"canary_clients"`
		OnMissingKey     string          `json:"on_missing_key"`
		Region           string          `json:"region"`
		Costs            json.RawMessage `json:"costs"`
	}
	dec := json.NewDecoder(strings.NewReader(c.Wasm.Configuration))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		t.Fatalf("filter configuration: %v\n%s", err, c.Wasm.Configuration)
	}
	if _, ok := c.Clusters[fc.SidecarCluster]; !ok || fc.SidecarCluster != "ratelimit_sidecar" {
		t.Errorf("sidecar_cluster = %q, want the defined cluster ratelimit_sidecar", fc.SidecarCluster)
	}
	if fc.TimeoutMS != 5 {
		t.Errorf("timeout_ms = %v, want 5 (the design's fail-open bound)", fc.TimeoutMS)
	}
	if fc.Mode != "enforce" {
		t.Errorf("mode = %q, want enforce", fc.Mode)
	}
	if fc.SidecarAuthority == "" || fc.Region == "" {
		t.Errorf("sidecar_authority = %q, region = %q: want both set", fc.SidecarAuthority, fc.Region)
	}
	var costs []map[string]any
	if err := json.Unmarshal(fc.Costs, &costs); err != nil || len(costs) == 0 {
		t.Errorf("costs = %s: want a non-empty list of rules (%v)", fc.Costs, err)
	}
}

func TestOverride(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Override("127.0.0.1:0", map[string]string{
		"orders":            "127.0.0.1:4001",
		"ratelimit_sidecar": "localhost:4003",
	}, "/tmp/x/filter.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listener != "127.0.0.1:0" {
		t.Errorf("Listener = %q", c.Listener)
	}
	if got := c.Clusters["orders"].Endpoints; !reflect.DeepEqual(got, []string{"127.0.0.1:4001"}) {
		t.Errorf("orders endpoints = %v", got)
	}
	if got := c.Clusters["ratelimit_sidecar"].Endpoints; !reflect.DeepEqual(got, []string{"localhost:4003"}) {
		t.Errorf("ratelimit_sidecar endpoints = %v", got)
	}
	if got := c.Clusters["billing"].Endpoints; !reflect.DeepEqual(got, []string{"127.0.0.1:9002"}) {
		t.Errorf("billing endpoints = %v, want unchanged", got)
	}
	if c.Wasm.Filename != "/tmp/x/filter.wasm" {
		t.Errorf("Wasm.Filename = %q", c.Wasm.Filename)
	}
}

// Each file under testdata/invalid is testdata/valid.yaml with one thing
// broken; Load must refuse it with exactly this message (after the file
// name), which names the field and the problem.
var invalidCases = []struct{ name, want string }{
	{"bad_duration", "static_resources.clusters[2].connect_timeout: invalid google.protobuf.Duration value \"250ms\""},
	{"bad_enum", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.codec_type: unknown value \"AUTOMATIC\" of envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.CodecType (one of AUTO, HTTP1, HTTP2, HTTP3)"},
	{"bad_type", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.@type: unknown type \"type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasmm\" (known: envoy.extensions.access_loggers.stream.v3.StderrAccessLog, envoy.extensions.access_loggers.stream.v3.StdoutAccessLog, envoy.extensions.filters.http.cors.v3.Cors, envoy.extensions.filters.http.cors.v3.CorsPolicy, envoy.extensions.filters.http.router.v3.Router, envoy.extensions.filters.http.wasm.v3.Wasm, envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, google.protobuf.StringValue)"},
	{"cors_after_wasm", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[1]: the CORS filter \"envoy.filters.http.cors\" comes after the wasm filter; the gateway runs it only before, where it answers a preflight before the rate limiter sees it"},
	{"cors_policy_per_route", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0]: a per-route cors or typed_per_filter_config is not supported; give the policy on the virtual host"},
	{"cluster_without_endpoints", "static_resources.clusters[1].load_assignment: cluster \"billing\" has no endpoints"},
	{"configuration_missing", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration: missing; want a google.protobuf.StringValue holding the filter's JSON"},
	{"duplicate_cluster", "static_resources.clusters[1].name: cluster \"orders\" is defined twice"},
	{"duplicate_key", "YAML: yaml: unmarshal errors:\n  line 14: key \"stat_prefix\" already set in map"},
	{"empty", "empty: want an Envoy bootstrap (admin, static_resources, …)"},
	{"eds_cluster", "static_resources.clusters[1].type: cluster \"billing\": EDS is not supported (want STATIC, STRICT_DNS or LOGICAL_DNS)"},
	{"fail_open_and_policy", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config: only one of fail_open or failure_policy can be set"},
	{"filter_config_default_sidecar_missing", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration.value: sidecar_cluster: cluster \"ratelimit_sidecar\" is not defined in static_resources.clusters"},
	{"filter_config_not_json", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration.value: not valid JSON: invalid character '}' looking for beginning of object key string"},
	{"filter_config_not_object", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration.value: want a JSON object, got a list"},
	{"filter_config_unknown_sidecar", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration.value: sidecar_cluster: cluster \"ratelimit\" is not defined in static_resources.clusters"},
	{"missing_cluster", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[1].route.cluster: cluster \"shipping\" is not defined in static_resources.clusters"},
	{"missing_type", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[1].typed_config.@type: missing \"@type\""},
	{"h2_window_too_small", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http2_protocol_options.initial_stream_window_size: value must be inside range [65535, 2147483647]"},
	{"negative_port", "admin.address.socket_address.port_value: invalid value for uint32 field portValue: -1"},
	{"negative_timeout", "static_resources.clusters[2].connect_timeout: value must be greater than 0s"},
	{"no_listener", "static_resources.listeners: no listener has an envoy.filters.network.http_connection_manager filter"},
	{"no_router", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0]: the last HTTP filter must be the router (envoy.filters.http.router), got \"envoy.filters.http.wasm\""},
	{"object_for_message_list", "static_resources.listeners[0].filter_chains[0].filters: want a list, got an object"},
	{"port_out_of_range", "static_resources.clusters[1].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value: value must be less than or equal to 65535"},
	{"rds", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config: want an inline route_config (rds and scoped_routes are not supported)"},
	{"regex_route", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[1].match: only prefix and path matches are supported"},
	{"duplicate_listener", "static_resources.listeners[1].name: listener \"edge\" is defined twice"},
	{"two_wasm_listeners", "static_resources.listeners: listeners \"edge\" and \"stats\" both have an envoy.filters.http.wasm filter; the gateway runs it on exactly one"},
	{"no_wasm_listener", "static_resources.listeners: no listener has an envoy.filters.http.wasm filter (typed_config type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm)"},
	{"listener_without_router", "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.http_filters: listener \"stats\": want the router as its one HTTP filter, got 0 filters"},
	{"listener_without_hcm", "static_resources.listeners[1]: listener \"stats\" has no envoy.filters.network.http_connection_manager filter"},
	{"direct_response_file", "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].direct_response.body: only inline_string and inline_bytes are supported"},
	{"case_insensitive_route", "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].match.case_sensitive: case-insensitive matches are not supported"},
	{"remote_code", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.vm_config.code: want a local file (code.local.filename); remote code is not supported"},
	{"router_not_last", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0]: the router filter \"envoy.filters.http.router\" must be the last HTTP filter"},
	{"unknown_field", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.stat_prefx: unknown field \"stat_prefx\" in envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"},
	{"unknown_field_in_wasm", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.rootid_: unknown field \"rootid_\" in envoy.extensions.wasm.v3.PluginConfig"},
	{"wasm_missing", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters: no envoy.filters.http.wasm filter (typed_config type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm)"},
	{"circuit_breaker_zero", "static_resources.clusters[2].circuit_breakers.thresholds[0].max_requests: 0 would refuse every request of cluster \"ratelimit_sidecar\""},
	{"stats_tags_bad_regex", "stats_config.stats_tags[0].regex: error parsing regexp: missing closing ): `^wasmcustom\\.(x`"},
	{"stats_tags_default_regex", "stats_config.stats_tags[0].regex: empty, which makes Envoy use its built-in regex for tag \"envoy.cluster_name\"; give the regex here"},
	{"stats_tags_no_name", "stats_config.stats_tags[0].tag_name: must not be empty"},
	{"histogram_bad_regex", "stats_config.histogram_bucket_settings[0].match.safe_regex.regex: error parsing regexp: missing closing ): `wasmcustom\\.(lat`"},
	{"wrong_shape", "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].domains: want a list, got a string"},
}

// A cluster's circuit breaker is its DEFAULT-priority thresholds, each
// field as set or Envoy's 1024; HIGH-priority thresholds do not apply.
func TestCircuitBreakerThresholds(t *testing.T) {
	base, err := os.ReadFile("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(string(base), "  - name: orders\n", `  - name: orders
    circuit_breakers:
      thresholds:
      - {priority: HIGH, max_connections: 1, max_pending_requests: 1, max_requests: 1}
      - {max_connections: 7, max_requests: 9}
`, 1)
	c, err := parse([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Clusters["orders"].Limits, (Limits{MaxConnections: 7, MaxPendingRequests: 1024, MaxRequests: 9}); got != want {
		t.Errorf("orders limits = %+v, want %+v", got, want)
	}
	if got, want := c.Clusters["billing"].Limits, (Limits{1024, 1024, 1024}); got != want {
		t.Errorf("billing limits = %+v, want Envoy's defaults %+v", got, want)
	}
	if c.StreamIdleTimeout != 5*time.Minute {
		t.Errorf("StreamIdleTimeout = %v unset, want Envoy's default 5m", c.StreamIdleTimeout)
	}
}

// The shipped bootstrap gives the filter's callout latency its own buckets
// in microseconds, sorted, every 500 µs up to the callout's timeout; other
// histograms keep Envoy's defaults.
func TestRealConfigHistogramBuckets(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	b := c.BucketsFor("wasmcustom.edgelimit.callout.latency_us")
	if !slices.IsSorted(b) || len(b) == 0 || b[0] >= 1000 {
		t.Errorf("callout latency buckets = %v, want sorted, some below 1 ms (the histogram counts µs)", b)
	}
	// Every 500 µs from 1 ms up to the callout's timeout, where a check
	// that is about to fail open shows.
	var filter struct {
		TimeoutMs float64 `json:"timeout_ms"`
	}
	if err := json.Unmarshal([]byte(c.Wasm.Configuration), &filter); err != nil || filter.TimeoutMs == 0 {
		t.Fatalf("timeout_ms of the filter's configuration: %v", err)
	}
	for us := 1000.0; us <= filter.TimeoutMs*1000; us += 500 {
		if !slices.Contains(b, us) {
			t.Errorf("callout latency buckets = %v, want %v µs among them", b, us)
		}
	}
	if b := c.BucketsFor("wasmcustom.edgelimit.other"); b != nil {
		t.Errorf("another histogram's buckets = %v, want nil (the defaults)", b)
	}
}

// The shipped bootstrap's stats_tags make the filter's request counters
// one Prometheus family with the decision, and for a request that failed
// open the reason, as labels; every other metric of the filter keeps its
// name and has no tags.
func TestRealConfigStatsTags(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	reasons := 0
	for _, name := range limiter.MetricNames() {
		full := "wasmcustom." + name
		extracted, tags := c.TagsFor(full)
		var want []Tag
		wantName := full
		if rest, ok := strings.CutPrefix(name, "edgelimit.requests."); ok {
			wantName = "wasmcustom.edgelimit.requests"
			want = []Tag{{"decision", rest}}
			if reason, ok := strings.CutPrefix(rest, "failed_open."); ok {
				want = []Tag{{"decision", "failed_open"}, {"reason", reason}}
				reasons++
			}
		}
		if extracted != wantName || !slices.Equal(tags, want) {
			t.Errorf("TagsFor(%q) = %q, %v; want %q, %v", full, extracted, tags, wantName, want)
		}
	}
	if reasons == 0 {
		t.Error("no failed_open counter among the filter's metrics")
	}
}

// Tags are taken as Envoy's tag producer takes them: every specifier sees
// the whole name; a regex matches anywhere, its first group leaves the
// name and its second (else its first) is the value; a fixed value tags
// every stat; of specifiers with the same tag name the first that matches
// wins; specifiers anchored to a first token come after the others.
func TestStatsTags(t *testing.T) {
	base, err := os.ReadFile("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(base) + `stats_config:
  stats_tags:
  - {tag_name: kind, regex: '^wasmcustom\.app\.((\w+)\.)'}
  - {tag_name: where, regex: '(\.at_(\w+))'}
  - {tag_name: env, fixed_value: prod}
  - {tag_name: where, regex: '(\.in_(\w+))'}
  - {tag_name: code, regex: 'rq(_(\d+))?$'}
  - {tag_name: tier, regex: '\.(gold)$'}
`
	c, err := parse([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		extracted string
		tags      []Tag
	}{
		// The anchored kind comes after the unanchored where and env;
		// the parts taken out overlap on a dot, taken out once.
		"wasmcustom.app.hits.at_edge.total": {"wasmcustom.app..total", []Tag{{"where", "edge"}, {"env", "prod"}, {"kind", "hits"}}},
		// The first where that matches wins; the second is not tried.
		"wasmcustom.x.at_a.in_b": {"wasmcustom.x.in_b", []Tag{{"where", "a"}, {"env", "prod"}}},
		"wasmcustom.x.in_b":      {"wasmcustom.x", []Tag{{"env", "prod"}, {"where", "b"}}},
		// A group that took no part: an empty value, nothing taken out.
		"cluster.s.rq":     {"cluster.s.rq", []Tag{{"env", "prod"}, {"code", ""}}},
		"cluster.s.rq_200": {"cluster.s.rq", []Tag{{"env", "prod"}, {"code", "200"}}},
		// One group: it is both what is taken out and the value.
		"wasmcustom.plan.gold": {"wasmcustom.plan.", []Tag{{"env", "prod"}, {"tier", "gold"}}},
	} {
		got, tags := c.TagsFor(name)
		if got != want.extracted || !slices.Equal(tags, want.tags) {
			t.Errorf("TagsFor(%q) = %q, %v; want %q, %v", name, got, tags, want.extracted, want.tags)
		}
	}
	for regex, prefix := range map[string]string{
		`^wasmcustom\.(\w+)`: "wasmcustom", `^cluster(?=\.)x`: "cluster", `^up$`: "up", `^up`: "", `^\.x`: "", `x\.`: "", `^a_b\w`: "",
	} {
		if got := regexPrefix(regex); got != prefix {
			t.Errorf("regexPrefix(%q) = %q, want %q", regex, got, prefix)
		}
	}
}

// Each kind of StringMatcher picks histograms as Envoy's does; the first
// setting that matches wins; buckets come sorted whatever their order.
func TestHistogramBucketMatchers(t *testing.T) {
	base, err := os.ReadFile("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(base) + `stats_config:
  histogram_bucket_settings:
  - {match: {exact: wasmcustom.a}, buckets: [3, 1, 2]}
  - {match: {prefix: wasmcustom.p.}, buckets: [10]}
  - {match: {suffix: _ms, ignore_case: true}, buckets: [20]}
  - {match: {contains: mid}, buckets: [30]}
  - {match: {safe_regex: {regex: "wasmcustom\\.r[0-9]"}}, buckets: [40]}
  - {match: {prefix: wasmcustom.a}, buckets: [50]}
`
	c, err := parse([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]float64{
		"wasmcustom.a":     {1, 2, 3},
		"wasmcustom.ab":    {50},
		"wasmcustom.p.x":   {10},
		"wasmcustom.x_MS":  {20},
		"wasmcustom.a_mid": {30}, // contains comes before the second prefix
		"wasmcustom.x_mid": {30},
		"wasmcustom.r7":    {40},
		"wasmcustom.r7x":   nil, // a regex matches the whole name
		"wasmcustom.other": nil,
	} {
		if got := c.BucketsFor(name); !slices.Equal(got, want) {
			t.Errorf("BucketsFor(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestLoadInvalid(t *testing.T) {
	if _, err := Load("testdata/valid.yaml"); err != nil {
		t.Fatalf("the base of every invalid case must load: %v", err)
	}
	for _, tc := range invalidCases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "invalid", tc.name+".yaml")
			c, err := Load(path)
			if err == nil {
				t.Fatalf("Load(%s) = %+v, want an error", path, c)
			}
			if want := path + ": " + tc.want; err.Error() != want {
				t.Errorf("Load(%s) error:\n got  %s\n want %s", path, err, want)
			}
		})
	}
}

// Every fixture has a case and every case a fixture.
func TestInvalidFixturesCovered(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk, inTable []string
	for _, f := range files {
		onDisk = append(onDisk, strings.TrimSuffix(filepath.Base(f), ".yaml"))
	}
	for _, tc := range invalidCases {
		inTable = append(inTable, tc.name)
	}
	slices.Sort(inTable)
	if !slices.Equal(onDisk, inTable) {
		t.Errorf("fixtures %v\ncases    %v", onDisk, inTable)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"))
	if !os.IsNotExist(err) {
		t.Errorf("Load(absent) error = %v, want a not-exist error", err)
	}
}

func TestOverrideListeners(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.OverrideListeners(map[string]string{"stats": "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners[0].Address; got != "127.0.0.1:0" {
		t.Errorf("stats listener on %s, want 127.0.0.1:0", got)
	}
	for _, tc := range []struct {
		addrs map[string]string
		want  string
	}{
		{map[string]string{"metrics": "127.0.0.1:0"}, `listener "metrics": not in the configuration (other listeners: stats)`},
		{map[string]string{"edge": "127.0.0.1:0"}, `listener "edge": the wasm filter's listener; its address is the listen address`},
		{map[string]string{"stats": "9902"}, `listener "stats" address "9902": want host:port: address 9902: missing port in address`},
	} {
		c, err := Load(realConfig)
		if err != nil {
			t.Fatal(err)
		}
		before := slices.Clone(c.Listeners)
		if err := c.OverrideListeners(tc.addrs); err == nil || err.Error() != tc.want {
			t.Errorf("OverrideListeners(%v) = %v, want %s", tc.addrs, err, tc.want)
		}
		if !reflect.DeepEqual(c.Listeners, before) {
			t.Errorf("a failed OverrideListeners changed the listeners: %+v", c.Listeners)
		}
	}
}

// Moving the admin moves the cluster that reaches it (envoy_admin) and no
// other; a cluster given its own endpoint first stays there.
func TestMoveAdmin(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MoveAdmin("127.0.0.1:4901"); err != nil {
		t.Fatal(err)
	}
	if c.Admin != "127.0.0.1:4901" {
		t.Errorf("Admin = %s", c.Admin)
	}
	if got := c.Clusters["envoy_admin"].Endpoints; !slices.Equal(got, []string{"127.0.0.1:4901"}) {
		t.Errorf("envoy_admin endpoints = %v, want the moved admin", got)
	}
	if got := c.Clusters["ratelimit_sidecar"].Endpoints; !slices.Equal(got, []string{"127.0.0.1:8081"}) {
		t.Errorf("ratelimit_sidecar endpoints = %v, want unchanged", got)
	}

	c, _ = Load(realConfig)
	if err := c.Override("", map[string]string{"envoy_admin": "127.0.0.1:5000"}, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveAdmin("127.0.0.1:4901"); err != nil {
		t.Fatal(err)
	}
	if got := c.Clusters["envoy_admin"].Endpoints; !slices.Equal(got, []string{"127.0.0.1:5000"}) {
		t.Errorf("envoy_admin endpoints = %v, want the overridden 127.0.0.1:5000", got)
	}
	if err := c.MoveAdmin("127.0.0.1:0"); err == nil || err.Error() != `admin address "127.0.0.1:0": port 0: want a number from 1 to 65535` {
		t.Errorf("MoveAdmin to port 0: %v", err)
	}
}

func TestOverrideErrors(t *testing.T) {
	cases := []struct {
		name     string
		listen   string
		clusters map[string]string
		want     string
	}{
		{"listen not host:port", "10000", nil, `listen address "10000": want host:port: address 10000: missing port in address`},
		{"listen port not a number", "127.0.0.1:http", nil, `listen address "127.0.0.1:http": port "http": want a number from 0 to 65535`},
		{"listen port too big", "127.0.0.1:65536", nil, `listen address "127.0.0.1:65536": port "65536": want a number from 0 to 65535`},
		{"unknown cluster", "", map[string]string{"shipping": "127.0.0.1:1"}, `cluster "shipping": not in the configuration (clusters: billing, envoy_admin, orders, ratelimit_sidecar)`},
		{"cluster port 0", "", map[string]string{"orders": "127.0.0.1:0"}, `cluster "orders" address "127.0.0.1:0": port 0: want a number from 1 to 65535`},
		{"cluster without host", "", map[string]string{"orders": ":9001"}, `cluster "orders" address ":9001": want host:port: missing host`},
		{"first error in name order", "", map[string]string{"zz": "x", "aa": "y"}, `cluster "aa": not in the configuration (clusters: billing, envoy_admin, orders, ratelimit_sidecar)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(realConfig)
			if err != nil {
				t.Fatal(err)
			}
			before := *c
			before.Clusters = maps.Clone(c.Clusters)
			err = c.Override(tc.listen, tc.clusters, "other.wasm")
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Override error = %v, want %s", err, tc.want)
			}
			if !reflect.DeepEqual(*c, before) {
				t.Errorf("a failed Override changed the config: %+v", *c)
			}
		})
	}
}

// Only a StringValue carries the filter's JSON; anything else is refused
// with the type it got. (knownTypes lets no other type reach this through a
// file today; this guards the day it grows.)
func TestConfigurationText(t *testing.T) {
	s, _ := anypb.New(wrapperspb.String(`{"mode":"shadow"}`))
	got, err := configurationText(s, "p")
	if err != nil || got != `{"mode":"shadow"}` {
		t.Errorf("StringValue: got %q, %v", got, err)
	}
	b, _ := anypb.New(wrapperspb.Bytes([]byte(`{}`)))
	_, err = configurationText(b, "p")
	want := `p.@type: "type.googleapis.com/google.protobuf.BytesValue"; want type.googleapis.com/google.protobuf.StringValue holding the filter's JSON`
	if err == nil || err.Error() != want {
		t.Errorf("BytesValue: error %v, want %s", err, want)
	}
}

// The filter reads an empty configuration, or one of whitespace only, as
// every default (filter/README.md): the bootstrap check takes it as the
// empty object, whose sidecar cluster is the default one.
func TestCheckFilterJSON(t *testing.T) {
	withDefault := map[string]Cluster{"ratelimit_sidecar": {}}
	withOther := map[string]Cluster{"sidecar": {}}
	tests := []struct {
		text     string
		clusters map[string]Cluster
		want     string // "" for no error
	}{
		{``, withDefault, ""},
		{" \n\t\r\n", withDefault, ""},
		{`{}`, withDefault, ""},
		{`{"sidecar_cluster": "sidecar"}`, withOther, ""},
		{``, withOther, `p: sidecar_cluster: cluster "ratelimit_sidecar" is not defined in static_resources.clusters`},
		{"\n", withOther, `p: sidecar_cluster: cluster "ratelimit_sidecar" is not defined in static_resources.clusters`},
		{`null`, withDefault, `p: want a JSON object, got null`},
		{` {`, withDefault, `p: not valid JSON: unexpected end of JSON input`},
	}
	for _, tt := range tests {
		err := checkFilterJSON(tt.text, "p", tt.clusters)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("checkFilterJSON(%q) = %q, want %q", tt.text, got, tt.want)
		}
	}
}

// failure_policy FAIL_OPEN means the same as fail_open: true.
func TestFailurePolicyOpen(t *testing.T) {
	clusters := map[string]Cluster{"ratelimit_sidecar": {}}
	cfg, _ := anypb.New(wrapperspb.String(`{}`))
	for _, tc := range []struct {
		policy wasmv3.FailurePolicy
		open   bool
	}{
		{wasmv3.FailurePolicy_UNSPECIFIED, false},
		{wasmv3.FailurePolicy_FAIL_CLOSED, false},
		{wasmv3.FailurePolicy_FAIL_RELOAD, false},
		{wasmv3.FailurePolicy_FAIL_OPEN, true},
	} {
		pc := &wasmv3.PluginConfig{
			Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
				Runtime: "envoy.wasm.runtime.v8",
				Code:    codeFile("f.wasm"),
			}},
			Configuration: cfg,
			FailurePolicy: tc.policy,
		}
		w, err := pluginConfig(pc, "p", clusters)
		if err != nil {
			t.Fatalf("%v: %v", tc.policy, err)
		}
		if w.FailOpen != tc.open {
			t.Errorf("%v: FailOpen = %v, want %v", tc.policy, w.FailOpen, tc.open)
		}
	}
}

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{
		"StaticResources":      "static_resources",
		"Clusters[0]":          "clusters[0]",
		"Http2ProtocolOptions": "http2_protocol_options",
		"PortValue":            "port_value",
		"Name":                 "name",
		"Ipv4Compat":           "ipv4_compat",
		"Routes[12]":           "routes[12]",
	} {
		if got := snakeCase(in); got != want {
			t.Errorf("snakeCase(%q) = %q, want %q", in, got, want)
		}
	}
}

// Load never panics, and what it accepts is self-consistent: every route
// and the filter's sidecar point at defined clusters with endpoints.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	seeds = append(seeds, filepath.Join("testdata", "valid.yaml"), realConfig)
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parse(data)
		if err != nil {
			return
		}
		if c.Listener == "" || len(c.Routes) == 0 || c.Wasm.Filename == "" {
			t.Fatalf("accepted an incomplete config: %+v", c)
		}
		routes := slices.Clone(c.Routes)
		for _, l := range c.Listeners {
			routes = append(routes, l.Routes...)
		}
		for _, r := range routes {
			if (r.Direct == nil) == (r.Cluster == "") {
				t.Fatalf("route %+v: want a cluster or a direct response", r)
			}
			if r.Direct == nil && len(c.Clusters[r.Cluster].Endpoints) == 0 {
				t.Fatalf("route %+v to a cluster without endpoints", r)
			}
		}
		var fc map[string]any
		if err := json.Unmarshal([]byte(c.Wasm.Configuration), &fc); err != nil {
			t.Fatalf("accepted a filter configuration that is not JSON: %v", err)
		}
	})
}

func codeFile(name string) *corev3.AsyncDataSource {
	return &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{
		Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: name}},
	}}
}

// internal_address_config: unset takes no address for internal, as Envoy
// 1.33 and later do; set, its cidr_ranges and nothing else; a range that
// is not an address fails naming the field.
func TestInternalAddresses(t *testing.T) {
	base, err := os.ReadFile(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	with := func(value string) string {
		return strings.Replace(string(base), "internal_address_config: {}", "internal_address_config: "+value, 1)
	}
	unset := strings.Replace(string(base), "internal_address_config: {}\n", "", 1)
	c, err := parse([]byte(unset))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.InternalAddresses) > 0 {
		t.Errorf("unset: %v, want none", c.InternalAddresses)
	}
	c, err = parse([]byte(with(`{cidr_ranges: [{address_prefix: 10.1.2.3, prefix_len: 16}, {address_prefix: "fd00::", prefix_len: 8}]}`)))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00::/8")}
	if !reflect.DeepEqual(c.InternalAddresses, want) {
		t.Errorf("cidr_ranges: %v, want %v", c.InternalAddresses, want)
	}
	_, err = parse([]byte(with(`{cidr_ranges: [{address_prefix: ten, prefix_len: 8}]}`)))
	if err == nil || !strings.Contains(err.Error(), "internal_address_config.cidr_ranges[0].address_prefix") {
		t.Errorf("a range that is no address: %v, want an error naming the field", err)
	}
}

// upgrade_configs, on the connection manager or on a route, is refused
// naming the field: the gateway tunnels no connection, and refuses every
// upgrade as Envoy does without them.
func TestUpgradeConfigsRefused(t *testing.T) {
	wantRefused(t, "upgrades are not supported", []edit{
		{"          codec_type: AUTO\n", "          codec_type: AUTO\n          upgrade_configs: [{upgrade_type: websocket}]\n", "upgrade_configs"},
		{"route: {cluster: orders}", "route: {cluster: orders, upgrade_configs: [{upgrade_type: websocket}]}", "routes[0].route.upgrade_configs"},
	})
}

// local_reply_config is refused naming the field: the gateway sends the
// filter's replies as the filter made them, where Envoy would rewrite
// their bodies and content-type by it (a gRPC-Web client then finds no
// trailer frame).
func TestLocalReplyConfigRefused(t *testing.T) {
	wantRefused(t, "not supported", []edit{
		{"          codec_type: AUTO\n", "          codec_type: AUTO\n          local_reply_config: {body_format: {text_format: \"%LOCAL_REPLY_BODY%\"}}\n", "local_reply_config"},
	})
}

// A route's timeout or idle_timeout is refused naming the field: the
// gateway applies Envoy's defaults to every route, and a streaming route's
// timeout: 0s, taken and ignored, would still have its streams cut at 15 s.
func TestRouteTimeoutsRefused(t *testing.T) {
	wantRefused(t, "per-route timeouts are not supported", []edit{
		{"route: {cluster: orders}", "route: {cluster: orders, timeout: 0s}", "routes[0].route.timeout"},
		{"route: {cluster: billing}", "route: {cluster: billing, idle_timeout: 3600s}", "routes[1].route.idle_timeout"},
	})
}

// edit is a change to envoy.yaml that parse refuses, naming field.
type edit struct{ old, new, field string }

// wantRefused parses envoy.yaml with each edit made and wants an error
// naming the edit's field, followed by why.
func wantRefused(t *testing.T, why string, edits []edit) {
	t.Helper()
	base, err := os.ReadFile(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edits {
		if !strings.Contains(string(base), e.old) {
			t.Fatalf("envoy.yaml has no %q to change", e.old)
		}
		_, err := parse([]byte(strings.Replace(string(base), e.old, e.new, 1)))
		if err == nil || !strings.Contains(err.Error(), e.field+": "+why) {
			t.Errorf("%s: %v, want an error naming the field", e.field, err)
		}
	}
}

// allow_on_headers_stop_iteration: true is refused naming the field: with
// it Envoy would give the plugin a paused request's body, and the plugin's
// Continue (it has no body callback) would send the request on before its
// check. false, as Envoy's default, is accepted.
func TestAllowOnHeadersStopIterationRefused(t *testing.T) {
	base, err := os.ReadFile(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	with := func(v string) string {
		return strings.Replace(string(base), "                fail_open: true\n", "                fail_open: true\n                allow_on_headers_stop_iteration: "+v+"\n", 1)
	}
	if _, err := parse([]byte(with("false"))); err != nil {
		t.Errorf("false: %v", err)
	}
	_, err = parse([]byte(with("true")))
	if err == nil || !strings.Contains(err.Error(), "config.allow_on_headers_stop_iteration: must be false") {
		t.Errorf("true: %v, want an error naming the field", err)
	}
}

// A retry_policy, on the virtual host or a route, is refused naming the
// field: the gateway sends a request once, where Envoy would send a
// request the filter charged once to the service again.
func TestRetryPolicyRefused(t *testing.T) {
	wantRefused(t, "retries are not supported", []edit{
		{"              domains: [\"*\"]\n", "              domains: [\"*\"]\n              retry_policy: {retry_on: 5xx, num_retries: 2}\n", "virtual_hosts[0].retry_policy"},
		{"route: {cluster: orders}", "route: {cluster: orders, retry_policy: {retry_on: 5xx}}", "routes[0].route.retry_policy"},
	})
}

// envoy.yaml runs the CORS filter before the rate limiter with a policy
// that lets a page of its origin send the key and read the rate-limit
// fields of every answer, a 429's Retry-After included.
func TestRealConfigCORS(t *testing.T) {
	c, err := Load(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	p := c.CORS
	if p == nil {
		t.Fatal("no CORS policy")
	}
	if !p.Allowed("https://app.example.com") || p.Allowed("https://evil.example") || p.Allowed("https://app.example.com.evil.example") {
		t.Errorf("origins: want https://app.example.com alone")
	}
	if p.ForwardNotMatchingPreflights {
		t.Error("forward_not_matching_preflights: true, want false (no preflight passed on uncharged)")
	}
	// The key, and what a browser's gRPC-Web client sends.
	for _, h := range []string{"x-api-key", "authorization", "content-type", "x-grpc-web", "x-user-agent", "grpc-timeout"} {
		if !slices.Contains(strings.Split(p.AllowHeaders, ", "), h) {
			t.Errorf("allow_headers %q: no %s", p.AllowHeaders, h)
		}
	}
	for _, h := range []string{"retry-after", "ratelimit", "ratelimit-policy", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset",
		"grpc-status", "grpc-message", "grpc-retry-pushback-ms"} {
		if !slices.Contains(strings.Split(p.ExposeHeaders, ", "), h) {
			t.Errorf("expose_headers %q: no %s", p.ExposeHeaders, h)
		}
	}
	// Access-Control-Allow-Origin depends on Origin, which caches are told.
	if want := []Header{{"vary", "Origin"}}; !slices.Equal(c.ResponseHeadersToAdd, want) {
		t.Errorf("response_headers_to_add %v, want %v", c.ResponseHeadersToAdd, want)
	}
}

// Response headers to add or remove that the gateway would not add or
// remove as Envoy does are refused, naming the field: anywhere but the
// virtual host, on another listener, or not a literal value appended.
func TestResponseHeadersRefused(t *testing.T) {
	const vary = "              response_headers_to_add:\n              - header: {key: vary, value: Origin}\n                append_action: APPEND_IF_EXISTS_OR_ADD\n"
	wantRefused(t, "not supported", []edit{
		{"              - match: {prefix: /orders}\n                route: {cluster: orders}\n",
			"              - match: {prefix: /orders}\n                route: {cluster: orders}\n                response_headers_to_add: [{header: {key: x-a, value: b}}]\n",
			"virtual_hosts[0].routes[0].response_headers_to_add"},
		{"            name: edge_routes\n", "            name: edge_routes\n            response_headers_to_add: [{header: {key: x-a, value: b}}]\n", "route_config.response_headers_to_add"},
		{vary, vary + "              response_headers_to_remove: [server]\n", "virtual_hosts[0].response_headers_to_remove"},
		{"append_action: APPEND_IF_EXISTS_OR_ADD", "append_action: OVERWRITE_IF_EXISTS_OR_ADD", "response_headers_to_add[0]"},
		{"value: Origin}", "value: \"%REQ(origin)%\"}", "response_headers_to_add[0].header"},
		{"            name: stats_routes\n            virtual_hosts:\n            - name: admin\n              domains: [\"*\"]\n",
			"            name: stats_routes\n            virtual_hosts:\n            - name: admin\n              domains: [\"*\"]\n              response_headers_to_add: [{header: {key: x-a, value: b}}]\n",
			"response_headers_to_add[0]"},
	})
}

// edgeHCM is the connection manager of envoy.yaml's edge listener, the
// one the wasm filter is in, as decoded.
func edgeHCM(t *testing.T) *hcmv3.HttpConnectionManager {
	t.Helper()
	raw, err := os.ReadFile(realConfig)
	if err != nil {
		t.Fatal(err)
	}
	b, err := decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	hcms, err := findHCMs(b.GetStaticResources().GetListeners())
	if err != nil {
		t.Fatal(err)
	}
	i, err := wasmListener(hcms)
	if err != nil {
		t.Fatal(err)
	}
	return hcms[i].hcm
}
