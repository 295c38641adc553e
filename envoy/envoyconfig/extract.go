package envoyconfig

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// defaultStreamIdleTimeout is the connection manager's stream_idle_timeout
// when unset.
const defaultStreamIdleTimeout = 5 * time.Minute

// defaultCircuitBreakerLimit is Envoy's default for each of a cluster's
// circuit breaker thresholds.
const defaultCircuitBreakerLimit = 1024

// defaultSidecarCluster is the filter's sidecar_cluster when its
// configuration does not name one (filter/README.md, configuration).
const defaultSidecarCluster = "ratelimit_sidecar"

// extract builds the Config from a decoded, validated bootstrap.
func extract(b *bootstrapv3.Bootstrap) (*Config, error) {
	c := &Config{Clusters: map[string]Cluster{}}
	if a := b.GetAdmin().GetAddress(); a != nil {
		addr, err := socketAddress(a, "admin.address")
		if err != nil {
			return nil, err
		}
		c.Admin = addr
	}
	for i, cl := range b.GetStaticResources().GetClusters() {
		path := fmt.Sprintf("static_resources.clusters[%d]", i)
		ec, err := extractCluster(cl, path)
		if err != nil {
			return nil, err
		}
		if _, dup := c.Clusters[ec.Name]; dup {
			return nil, fmt.Errorf("%s.name: cluster %q is defined twice", path, ec.Name)
		}
		c.Clusters[ec.Name] = ec
	}

	hcms, err := findHCMs(b.GetStaticResources().GetListeners())
	if err != nil {
		return nil, err
	}
	filterAt, err := wasmListener(hcms)
	if err != nil {
		return nil, err
	}
	for i, h := range hcms {
		addr, err := socketAddress(h.listener.GetAddress(), h.listenerPath+".address")
		if err != nil {
			return nil, err
		}
		routes, err := extractRoutes(h.hcm, h.hcmPath, c.Clusters)
		if err != nil {
			return nil, err
		}
		added, err := responseHeadersToAdd(h.hcm, h.hcmPath, i == filterAt)
		if err != nil {
			return nil, err
		}
		if i == filterAt {
			c.Listener, c.ListenerName, c.Routes = addr, h.listener.GetName(), routes
			c.ResponseHeadersToAdd = added
			c.ListenerIPv4Compat = h.listener.GetAddress().GetSocketAddress().GetIpv4Compat()
			continue
		}
		if err := routerOnly(h); err != nil {
			return nil, err
		}
		c.Listeners = append(c.Listeners, Listener{Name: h.listener.GetName(), Address: addr,
			IPv4Compat: h.listener.GetAddress().GetSocketAddress().GetIpv4Compat(), StatPrefix: h.hcm.GetStatPrefix(), Routes: routes})
	}
	hcm, hcmPath := hcms[filterAt].hcm, hcms[filterAt].hcmPath
	if c.Wasm, err = extractWasm(hcm, hcmPath, c.Clusters); err != nil {
		return nil, err
	}
	if c.CORS, err = extractCORS(hcm, hcmPath); err != nil {
		return nil, err
	}
	c.StreamIdleTimeout = defaultStreamIdleTimeout
	if d := hcm.GetStreamIdleTimeout(); d != nil {
		c.StreamIdleTimeout = d.AsDuration()
	}
	switch hcm.GetPathWithEscapedSlashesAction() {
	case hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT:
		c.EscapedSlashes = UnescapeAndRedirect
	case hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD:
		c.EscapedSlashes = UnescapeAndForward
	case hcmv3.HttpConnectionManager_REJECT_REQUEST:
		c.EscapedSlashes = RejectEscapedSlashes
	}
	c.Proxy100Continue = hcm.GetProxy_100Continue()
	c.AcceptHTTP10 = hcm.GetHttpProtocolOptions().GetAcceptHttp_10()
	switch hcm.GetCommonHttpProtocolOptions().GetHeadersWithUnderscoresAction() {
	case corev3.HttpProtocolOptions_REJECT_REQUEST:
		c.RejectUnderscores = true
	case corev3.HttpProtocolOptions_DROP_HEADER:
		c.DropUnderscores = true
	}
	if c.InternalAddresses, err = internalAddresses(hcm, hcmPath); err != nil {
		return nil, err
	}
	for i, h := range b.GetStatsConfig().GetHistogramBucketSettings() {
		path := fmt.Sprintf("stats_config.histogram_bucket_settings[%d]", i)
		match, err := stringMatcher(h.GetMatch(), path+".match")
		if err != nil {
			return nil, err
		}
		var buckets []float64
		if len(h.GetBuckets()) > 0 {
			// Envoy takes them in any order.
			buckets = slices.Sorted(slices.Values(h.GetBuckets()))
		}
		c.Histograms = append(c.Histograms, HistogramBuckets{Match: match, Buckets: buckets})
	}
	for i, ts := range b.GetStatsConfig().GetStatsTags() {
		path := fmt.Sprintf("stats_config.stats_tags[%d]", i)
		t, err := tagSpecifier(ts, path)
		if err != nil {
			return nil, err
		}
		c.Tags = append(c.Tags, t)
	}
	return c, nil
}

// internalAddresses reads the connection manager's
// internal_address_config: its cidr_ranges, none when the field is unset
// (Envoy 1.33 and later).
func internalAddresses(hcm *hcmv3.HttpConnectionManager, path string) ([]netip.Prefix, error) {
	ranges := []netip.Prefix{}
	for i, r := range hcm.GetInternalAddressConfig().GetCidrRanges() {
		field := fmt.Sprintf("%s.internal_address_config.cidr_ranges[%d]", path, i)
		addr, err := netip.ParseAddr(r.GetAddressPrefix())
		if err != nil {
			return nil, fmt.Errorf("%s.address_prefix: %q is not an IP address", field, r.GetAddressPrefix())
		}
		bits := int(r.GetPrefixLen().GetValue())
		if bits > addr.BitLen() {
			return nil, fmt.Errorf("%s.prefix_len: %d is longer than the address (%d bits)", field, bits, addr.BitLen())
		}
		p, _ := addr.Prefix(bits)
		ranges = append(ranges, p)
	}
	return ranges, nil
}

// tagSpecifier reads one stats_tags entry as Envoy's tag producer takes
// it: a fixed value, or a regex with at least one capture group to be of
// any use.
func tagSpecifier(ts *metricsv3.TagSpecifier, path string) (TagSpecifier, error) {
	t := TagSpecifier{Name: ts.GetTagName()}
	if t.Name == "" {
		return t, fmt.Errorf("%s.tag_name: must not be empty", path)
	}
	if v, ok := ts.GetTagValue().(*metricsv3.TagSpecifier_FixedValue); ok {
		t.FixedValue = v.FixedValue
		return t, nil
	}
	regex := ts.GetRegex()
	if regex == "" {
		return t, fmt.Errorf("%s.regex: empty, which makes Envoy use its built-in regex for tag %q; give the regex here", path, t.Name)
	}
	re, err := regexp.Compile(regex)
	if err != nil {
		return t, fmt.Errorf("%s.regex: %v", path, err)
	}
	t.Regex, t.prefix = re, regexPrefix(regex)
	return t, nil
}

// stringMatcher is Envoy's StringMatcher as a function. A safe_regex must
// match the whole string, as in Envoy.
func stringMatcher(m *matcherv3.StringMatcher, path string) (func(string) bool, error) {
	fold := func(s string) string { return s }
	if m.GetIgnoreCase() {
		fold = strings.ToLower
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		want := fold(p.Exact)
		return func(s string) bool { return fold(s) == want }, nil
	case *matcherv3.StringMatcher_Prefix:
		want := fold(p.Prefix)
		return func(s string) bool { return strings.HasPrefix(fold(s), want) }, nil
	case *matcherv3.StringMatcher_Suffix:
		want := fold(p.Suffix)
		return func(s string) bool { return strings.HasSuffix(fold(s), want) }, nil
	case *matcherv3.StringMatcher_Contains:
		want := fold(p.Contains)
		return func(s string) bool { return strings.Contains(fold(s), want) }, nil
	case *matcherv3.StringMatcher_SafeRegex:
		if _, err := regexp.Compile(p.SafeRegex.GetRegex()); err != nil {
			return nil, fmt.Errorf("%s.safe_regex.regex: %v", path, err)
		}
		re := regexp.MustCompile(`^(?:` + p.SafeRegex.GetRegex() + `)$`)
		return re.MatchString, nil
	}
	return nil, fmt.Errorf("%s: want exact, prefix, suffix, contains or safe_regex", path)
}

// listenerHCM is a listener's HTTP connection manager and where both are.
type listenerHCM struct {
	listener              *listenerv3.Listener
	hcm                   *hcmv3.HttpConnectionManager
	listenerPath, hcmPath string
}

// findHCMs finds the HTTP connection manager of every listener, one per
// listener (the gateway does not choose among filter chains).
func findHCMs(listeners []*listenerv3.Listener) ([]listenerHCM, error) {
	if len(listeners) == 0 {
		return nil, fmt.Errorf("static_resources.listeners: no listener has an envoy.filters.network.http_connection_manager filter")
	}
	var found []listenerHCM
	names := map[string]bool{}
	for i, l := range listeners {
		lpath := fmt.Sprintf("static_resources.listeners[%d]", i)
		if name := l.GetName(); name != "" {
			// Envoy refuses a second listener of the same name.
			if names[name] {
				return nil, fmt.Errorf("%s.name: listener %q is defined twice", lpath, name)
			}
			names[name] = true
		}
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(chains[:len(chains):len(chains)], l.GetDefaultFilterChain())
		}
		var mine []listenerHCM
		for j, fc := range chains {
			for k, f := range fc.GetFilters() {
				h := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig() == nil || !f.GetTypedConfig().MessageIs(h) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
					return nil, err
				}
				mine = append(mine, listenerHCM{l, h, lpath, fmt.Sprintf("%s.filter_chains[%d].filters[%d].typed_config", lpath, j, k)})
			}
		}
		switch len(mine) {
		case 0:
			if len(listeners) == 1 {
				return nil, fmt.Errorf("static_resources.listeners: no listener has an envoy.filters.network.http_connection_manager filter")
			}
			return nil, fmt.Errorf("%s: listener %q has no envoy.filters.network.http_connection_manager filter", lpath, l.GetName())
		case 1:
			found = append(found, mine[0])
		default:
			return nil, fmt.Errorf("%s: listener %q has %d HTTP connection managers; the gateway serves one per listener", lpath, l.GetName(), len(mine))
		}
	}
	return found, nil
}

// wasmListener picks the connection manager the wasm filter is in: there
// must be exactly one. With a single connection manager it is that one,
// and extractWasm says what is wrong with its filters.
func wasmListener(hcms []listenerHCM) (int, error) {
	if len(hcms) == 1 {
		return 0, nil
	}
	at := -1
	for i, h := range hcms {
		for _, f := range h.hcm.GetHttpFilters() {
			if f.GetTypedConfig().MessageIs(&wasmfilterv3.Wasm{}) {
				if at >= 0 && at != i {
					return 0, fmt.Errorf("static_resources.listeners: listeners %q and %q both have an envoy.filters.http.wasm filter; the gateway runs it on exactly one", hcms[at].listener.GetName(), h.listener.GetName())
				}
				at = i
			}
		}
	}
	if at < 0 {
		return 0, fmt.Errorf("static_resources.listeners: no listener has an envoy.filters.http.wasm filter (typed_config %s)", "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")
	}
	return at, nil
}

// routerOnly checks a listener without the wasm filter: the router must be
// its one HTTP filter, the only one the gateway runs there.
func routerOnly(h listenerHCM) error {
	path := h.hcmPath + ".http_filters"
	filters := h.hcm.GetHttpFilters()
	for i, f := range filters {
		if !f.GetTypedConfig().MessageIs(&routerv3.Router{}) {
			return fmt.Errorf("%s[%d]: filter %q on listener %q: a listener without the wasm filter may have only the router", path, i, f.GetName(), h.listener.GetName())
		}
	}
	if len(filters) != 1 {
		return fmt.Errorf("%s: listener %q: want the router as its one HTTP filter, got %d filters", path, h.listener.GetName(), len(filters))
	}
	return nil
}

func extractCluster(cl *clusterv3.Cluster, path string) (Cluster, error) {
	switch t := cl.GetType(); t {
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
	default:
		if cl.GetClusterType() != nil {
			return Cluster{}, fmt.Errorf("%s.cluster_type: cluster %q: custom cluster types are not supported (want type STATIC, STRICT_DNS or LOGICAL_DNS)", path, cl.GetName())
		}
		return Cluster{}, fmt.Errorf("%s.type: cluster %q: %s is not supported (want STATIC, STRICT_DNS or LOGICAL_DNS)", path, cl.GetName(), t)
	}
	ec := Cluster{Name: cl.GetName(), ConnectTimeout: defaultConnectTimeout}
	if d := cl.GetConnectTimeout(); d != nil {
		ec.ConnectTimeout = d.AsDuration()
	}
	ec.Limits = Limits{defaultCircuitBreakerLimit, defaultCircuitBreakerLimit, defaultCircuitBreakerLimit}
	for i, th := range cl.GetCircuitBreakers().GetThresholds() {
		if th.GetPriority() != corev3.RoutingPriority_DEFAULT {
			continue // HIGH: for routes that ask for it, which the gateway has none of
		}
		for _, f := range []struct {
			name string
			dst  *int
			v    *wrapperspb.UInt32Value
		}{{"max_connections", &ec.Limits.MaxConnections, th.GetMaxConnections()},
			{"max_pending_requests", &ec.Limits.MaxPendingRequests, th.GetMaxPendingRequests()},
			{"max_requests", &ec.Limits.MaxRequests, th.GetMaxRequests()}} {
			switch {
			case f.v == nil:
			case f.v.GetValue() == 0:
				return Cluster{}, fmt.Errorf("%s.circuit_breakers.thresholds[%d].%s: 0 would refuse every request of cluster %q", path, i, f.name, cl.GetName())
			default:
				*f.dst = int(f.v.GetValue())
			}
		}
	}
	la := cl.GetLoadAssignment()
	for i, lle := range la.GetEndpoints() {
		for j, lb := range lle.GetLbEndpoints() {
			epath := fmt.Sprintf("%s.load_assignment.endpoints[%d].lb_endpoints[%d].endpoint.address", path, i, j)
			addr, err := socketAddress(lb.GetEndpoint().GetAddress(), epath)
			if err != nil {
				return Cluster{}, err
			}
			ec.Endpoints = append(ec.Endpoints, addr)
		}
	}
	if len(ec.Endpoints) == 0 {
		return Cluster{}, fmt.Errorf("%s.load_assignment: cluster %q has no endpoints", path, cl.GetName())
	}
	return ec, nil
}

// socketAddress formats a core Address as host:port.
func socketAddress(a *corev3.Address, path string) (string, error) {
	sa := a.GetSocketAddress()
	if sa == nil {
		return "", fmt.Errorf("%s: want a socket_address (host and port_value)", path)
	}
	if sa.GetNamedPort() != "" {
		return "", fmt.Errorf("%s.socket_address.named_port: %q is not supported, use port_value", path, sa.GetNamedPort())
	}
	if sa.GetProtocol() != corev3.SocketAddress_TCP {
		return "", fmt.Errorf("%s.socket_address.protocol: %s is not supported, want TCP", path, sa.GetProtocol())
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)), nil
}

func extractRoutes(hcm *hcmv3.HttpConnectionManager, path string, clusters map[string]Cluster) ([]Route, error) {
	if len(hcm.GetUpgradeConfigs()) > 0 {
		return nil, fmt.Errorf("%s.upgrade_configs: upgrades are not supported (the gateway tunnels no connection; without upgrade_configs an upgrade is refused, 403, as Envoy refuses it)", path)
	}
	if hcm.GetLocalReplyConfig() != nil {
		return nil, fmt.Errorf("%s.local_reply_config: not supported (the gateway sends the filter's replies as it made them; in Envoy a body_format or mapper would rewrite their bodies and content-type, the problem+json and the gRPC-Web trailer frame alike)", path)
	}
	rc := hcm.GetRouteConfig()
	if rc == nil {
		return nil, fmt.Errorf("%s: want an inline route_config (rds and scoped_routes are not supported)", path)
	}
	path += ".route_config"
	// Response headers are added on the virtual host alone
	// (responseHeadersToAdd), and removed nowhere.
	const elsewhere = "not supported (give the headers to add on the virtual host)"
	if len(rc.GetResponseHeadersToAdd()) > 0 {
		return nil, fmt.Errorf("%s.response_headers_to_add: %s", path, elsewhere)
	}
	if len(rc.GetResponseHeadersToRemove()) > 0 {
		return nil, fmt.Errorf("%s.response_headers_to_remove: not supported", path)
	}
	vhosts := rc.GetVirtualHosts()
	if len(vhosts) != 1 {
		return nil, fmt.Errorf("%s.virtual_hosts: want exactly 1 virtual host (the gateway does not match on Host), got %d", path, len(vhosts))
	}
	path += ".virtual_hosts[0]"
	if vhosts[0].GetRetryPolicy() != nil {
		return nil, fmt.Errorf("%s.retry_policy: retries are not supported (the gateway sends a request once; Envoy would send one the filter charged once to the service again)", path)
	}
	if len(vhosts[0].GetResponseHeadersToRemove()) > 0 {
		return nil, fmt.Errorf("%s.response_headers_to_remove: not supported", path)
	}
	var routes []Route
	for i, r := range vhosts[0].GetRoutes() {
		rpath := fmt.Sprintf("%s.routes[%d]", path, i)
		if len(r.GetResponseHeadersToAdd()) > 0 {
			return nil, fmt.Errorf("%s.response_headers_to_add: %s", rpath, elsewhere)
		}
		if len(r.GetResponseHeadersToRemove()) > 0 {
			return nil, fmt.Errorf("%s.response_headers_to_remove: not supported", rpath)
		}
		var rt Route
		switch m := r.GetMatch().GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Prefix:
			rt.Prefix = m.Prefix
		case *routev3.RouteMatch_Path:
			rt.Path = m.Path
		default:
			return nil, fmt.Errorf("%s.match: only prefix and path matches are supported", rpath)
		}
		if len(r.GetMatch().GetHeaders()) > 0 || len(r.GetMatch().GetQueryParameters()) > 0 {
			return nil, fmt.Errorf("%s.match: header and query parameter matches are not supported", rpath)
		}
		if cs := r.GetMatch().GetCaseSensitive(); cs != nil && !cs.GetValue() {
			return nil, fmt.Errorf("%s.match.case_sensitive: case-insensitive matches are not supported", rpath)
		}
		switch action := r.GetAction().(type) {
		case *routev3.Route_Route:
			if action.Route.GetRetryPolicy() != nil {
				return nil, fmt.Errorf("%s.route.retry_policy: retries are not supported (the gateway sends a request once; Envoy would send one the filter charged once to the service again)", rpath)
			}
			if len(action.Route.GetUpgradeConfigs()) > 0 {
				return nil, fmt.Errorf("%s.route.upgrade_configs: upgrades are not supported (the gateway tunnels no connection; without upgrade_configs an upgrade is refused, 403, as Envoy refuses it)", rpath)
			}
			// The gateway keeps Envoy's defaults for every route: the
			// route timeout of 15 s to the end of the response and the
			// connection manager's stream_idle_timeout. Taken and
			// ignored, a streaming route's timeout: 0s would pass -check
			// and its streams still be cut at 15 s.
			if action.Route.GetTimeout() != nil {
				return nil, fmt.Errorf("%s.route.timeout: per-route timeouts are not supported (the gateway gives every route Envoy's default, 15 s to the end of its response)", rpath)
			}
			if action.Route.GetIdleTimeout() != nil {
				return nil, fmt.Errorf("%s.route.idle_timeout: per-route timeouts are not supported (the gateway applies the connection manager's stream_idle_timeout to every route)", rpath)
			}
			cluster := action.Route.GetCluster()
			if cluster == "" {
				return nil, fmt.Errorf("%s.route: want a cluster name (weighted_clusters and cluster_header are not supported)", rpath)
			}
			// Envoy rejects a static route to an undefined cluster
			// (route_config.validate_clusters defaults to true for inline routes).
			if _, ok := clusters[cluster]; !ok {
				return nil, fmt.Errorf("%s.route.cluster: cluster %q is not defined in static_resources.clusters", rpath, cluster)
			}
			rt.Cluster = cluster
		case *routev3.Route_DirectResponse:
			d, err := directResponse(action.DirectResponse, rpath+".direct_response")
			if err != nil {
				return nil, err
			}
			rt.Direct = d
		default:
			return nil, fmt.Errorf("%s: only route (to a cluster) and direct_response actions are supported", rpath)
		}
		routes = append(routes, rt)
	}
	if len(routes) == 0 {
		return nil, fmt.Errorf("%s.routes: no routes", path)
	}
	return routes, nil
}

// responseHeadersToAdd reads the virtual host's response_headers_to_add
// (extractRoutes refused them anywhere else), on the wasm filter's listener
// (wasm) alone: literal values appended (append_action
// APPEND_IF_EXISTS_OR_ADD, the default); any other form is an error naming
// the field, so that none is silently not done.
func responseHeadersToAdd(hcm *hcmv3.HttpConnectionManager, path string, wasm bool) ([]Header, error) {
	path += ".route_config.virtual_hosts[0]"
	var out []Header
	for i, o := range hcm.GetRouteConfig().GetVirtualHosts()[0].GetResponseHeadersToAdd() {
		hpath := fmt.Sprintf("%s.response_headers_to_add[%d]", path, i)
		if !wasm {
			return nil, fmt.Errorf("%s: not supported (only on the listener of the wasm filter)", hpath)
		}
		if o.GetAppend() != nil || o.GetAppendAction() != corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD || o.GetKeepEmptyValue() {
			return nil, fmt.Errorf("%s: not supported (only append_action APPEND_IF_EXISTS_OR_ADD, without append and keep_empty_value)", hpath)
		}
		h := o.GetHeader()
		if len(h.GetRawValue()) > 0 || strings.Contains(h.GetValue(), "%") {
			return nil, fmt.Errorf("%s.header: not supported (only a literal value: no raw_value, no %%-formatters)", hpath)
		}
		out = append(out, Header{Key: strings.ToLower(h.GetKey()), Value: h.GetValue()})
	}
	return out, nil
}

// directResponse reads a direct_response: its status (Envoy's rules keep it
// within 200-599) and an inline body.
func directResponse(d *routev3.DirectResponseAction, path string) (*DirectResponse, error) {
	if d.GetBodyFormat() != nil {
		return nil, fmt.Errorf("%s.body_format: not supported; give the body as body.inline_string", path)
	}
	out := &DirectResponse{Status: int(d.GetStatus())}
	switch b := d.GetBody().GetSpecifier().(type) {
	case nil:
	case *corev3.DataSource_InlineString:
		out.Body = b.InlineString
	case *corev3.DataSource_InlineBytes:
		out.Body = string(b.InlineBytes)
	default:
		return nil, fmt.Errorf("%s.body: only inline_string and inline_bytes are supported", path)
	}
	return out, nil
}

func extractWasm(hcm *hcmv3.HttpConnectionManager, path string, clusters map[string]Cluster) (Wasm, error) {
	filters := hcm.GetHttpFilters()
	path += ".http_filters"
	if len(filters) == 0 {
		return Wasm{}, fmt.Errorf("%s: empty; want the wasm filter then the router", path)
	}
	var (
		wasm     *wasmfilterv3.Wasm
		wasmPath string
	)
	for i, f := range filters {
		fpath := fmt.Sprintf("%s[%d]", path, i)
		tc := f.GetTypedConfig()
		if tc == nil {
			return Wasm{}, fmt.Errorf("%s: filter %q has no typed_config", fpath, f.GetName())
		}
		last := i == len(filters)-1
		isRouter := tc.MessageIs(&routerv3.Router{})
		// Envoy: the router is terminal and a terminal filter must be last;
		// the last filter must be terminal.
		if isRouter && !last {
			return Wasm{}, fmt.Errorf("%s: the router filter %q must be the last HTTP filter", fpath, f.GetName())
		}
		if last && !isRouter {
			return Wasm{}, fmt.Errorf("%s: the last HTTP filter must be the router (envoy.filters.http.router), got %q", fpath, f.GetName())
		}
		if tc.MessageIs(&corsv3.Cors{}) {
			if wasm != nil {
				return Wasm{}, fmt.Errorf("%s: the CORS filter %q comes after the wasm filter; the gateway runs it only before, where it answers a preflight before the rate limiter sees it", fpath, f.GetName())
			}
			continue
		}
		if !tc.MessageIs(&wasmfilterv3.Wasm{}) {
			continue
		}
		if wasm != nil {
			return Wasm{}, fmt.Errorf("%s: a second wasm filter %q; the gateway runs exactly one", fpath, f.GetName())
		}
		wasm, wasmPath = &wasmfilterv3.Wasm{}, fpath+".typed_config"
		if err := tc.UnmarshalTo(wasm); err != nil {
			return Wasm{}, fmt.Errorf("%s: %w", wasmPath, err)
		}
	}
	if wasm == nil {
		return Wasm{}, fmt.Errorf("%s: no envoy.filters.http.wasm filter (typed_config %s)", path, "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")
	}
	return pluginConfig(wasm.GetConfig(), wasmPath+".config", clusters)
}

// extractCORS reads the policy of the connection manager's CORS filter
// (envoy.extensions.filters.http.cors.v3.Cors, which extractWasm has
// placed before the wasm filter) from the virtual host's
// typed_per_filter_config under the filter's name: nil without the filter
// or without a policy. What the gateway does not do as Envoy does is an
// error naming the field: a policy per route, the virtual host's
// deprecated cors field, filter_enabled and shadow_enabled.
func extractCORS(hcm *hcmv3.HttpConnectionManager, path string) (*CORSPolicy, error) {
	name, n := "", 0
	for i, f := range hcm.GetHttpFilters() {
		if !f.GetTypedConfig().MessageIs(&corsv3.Cors{}) {
			continue
		}
		if n++; n > 1 {
			return nil, fmt.Errorf("%s.http_filters[%d]: a second CORS filter %q; the gateway runs at most one", path, i, f.GetName())
		}
		name = f.GetName()
	}
	vh := hcm.GetRouteConfig().GetVirtualHosts()[0]
	vpath := path + ".route_config.virtual_hosts[0]"
	if vh.GetCors() != nil {
		return nil, fmt.Errorf("%s.cors: deprecated; give the policy as typed_per_filter_config[%q] (envoy.extensions.filters.http.cors.v3.CorsPolicy)", vpath, "envoy.filters.http.cors")
	}
	for i, r := range vh.GetRoutes() {
		if r.GetRoute().GetCors() != nil || len(r.GetTypedPerFilterConfig()) > 0 {
			return nil, fmt.Errorf("%s.routes[%d]: a per-route cors or typed_per_filter_config is not supported; give the policy on the virtual host", vpath, i)
		}
	}
	for key := range vh.GetTypedPerFilterConfig() {
		if key != name {
			return nil, fmt.Errorf("%s.typed_per_filter_config[%q]: no CORS filter of that name in http_filters; only the CORS filter's policy is supported", vpath, key)
		}
	}
	if name == "" {
		return nil, nil
	}
	any, ok := vh.GetTypedPerFilterConfig()[name]
	if !ok {
		return nil, nil
	}
	ppath := fmt.Sprintf("%s.typed_per_filter_config[%q]", vpath, name)
	var pol corsv3.CorsPolicy
	if err := any.UnmarshalTo(&pol); err != nil {
		return nil, fmt.Errorf("%s: want envoy.extensions.filters.http.cors.v3.CorsPolicy: %w", ppath, err)
	}
	if pol.GetFilterEnabled() != nil || pol.GetShadowEnabled() != nil {
		return nil, fmt.Errorf("%s: filter_enabled and shadow_enabled are not supported (the policy is always enforced)", ppath)
	}
	out := &CORSPolicy{
		AllowMethods: pol.GetAllowMethods(), AllowHeaders: pol.GetAllowHeaders(),
		ExposeHeaders: pol.GetExposeHeaders(), MaxAge: pol.GetMaxAge(),
		AllowCredentials:             pol.GetAllowCredentials().GetValue(),
		AllowPrivateNetworkAccess:    pol.GetAllowPrivateNetworkAccess().GetValue(),
		ForwardNotMatchingPreflights: pol.GetForwardNotMatchingPreflights() == nil || pol.GetForwardNotMatchingPreflights().GetValue(),
	}
	for i, m := range pol.GetAllowOriginStringMatch() {
		match, err := stringMatcher(m, fmt.Sprintf("%s.allow_origin_string_match[%d]", ppath, i))
		if err != nil {
			return nil, err
		}
		out.AllowOrigins = append(out.AllowOrigins, match)
	}
	return out, nil
}

func pluginConfig(pc *wasmv3.PluginConfig, path string, clusters map[string]Cluster) (Wasm, error) {
	if pc == nil {
		return Wasm{}, fmt.Errorf("%s: missing", path)
	}
	vm := pc.GetVmConfig()
	if vm == nil {
		return Wasm{}, fmt.Errorf("%s.vm_config: missing", path)
	}
	local := vm.GetCode().GetLocal()
	if local == nil {
		return Wasm{}, fmt.Errorf("%s.vm_config.code: want a local file (code.local.filename); remote code is not supported", path)
	}
	filename := local.GetFilename()
	if filename == "" {
		return Wasm{}, fmt.Errorf("%s.vm_config.code.local: want filename (inline bytes or strings are not supported)", path)
	}
	w := Wasm{
		Name:     pc.GetName(),
		RootID:   pc.GetRootId(),
		VMID:     vm.GetVmId(),
		Runtime:  vm.GetRuntime(),
		Filename: filename,
	}

	if pc.GetAllowOnHeadersStopIteration().GetValue() {
		// The filter pauses a request on its headers until its check is
		// answered. With this set, Envoy hands the plugin the request's
		// body meanwhile, and a plugin without a body callback (this
		// one) answers Continue to it, which sends the request on to
		// the service before its check: every request with a body
		// would reach a service whatever its decision.
		return Wasm{}, fmt.Errorf("%s.allow_on_headers_stop_iteration: must be false: with true a request's body sends it on to the service before its check is answered", path)
	}

	// Deprecated in the API but the spelling every Envoy >= 1.33 accepts
	// (envoy/envoy.yaml says why it uses it).
	failOpen := pc.GetFailOpen()
	// Envoy refuses a plugin that sets both.
	if failOpen && pc.GetFailurePolicy() != wasmv3.FailurePolicy_UNSPECIFIED {
		return Wasm{}, fmt.Errorf("%s: only one of fail_open or failure_policy can be set", path)
	}
	w.FailOpen = failOpen || pc.GetFailurePolicy() == wasmv3.FailurePolicy_FAIL_OPEN

	cfg, err := configurationText(pc.GetConfiguration(), path+".configuration")
	if err != nil {
		return Wasm{}, err
	}
	if err := checkFilterJSON(cfg, path+".configuration.value", clusters); err != nil {
		return Wasm{}, err
	}
	w.Configuration = cfg
	return w, nil
}

// configurationText is the plugin configuration as the filter receives it.
func configurationText(a *anypb.Any, path string) (string, error) {
	if a == nil {
		return "", fmt.Errorf("%s: missing; want a google.protobuf.StringValue holding the filter's JSON", path)
	}
	var s wrapperspb.StringValue
	if !a.MessageIs(&s) {
		return "", fmt.Errorf("%s.@type: %q; want type.googleapis.com/google.protobuf.StringValue holding the filter's JSON", path, a.GetTypeUrl())
	}
	if err := proto.Unmarshal(a.GetValue(), &s); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return s.GetValue(), nil
}

// checkFilterJSON checks what the bootstrap, not the filter, is responsible
// for: the text is one JSON object, and the cluster the filter calls exists
// (a callout to an undefined cluster fails every time, so the limiter would
// silently fail open on every request). The fields' own rules are the
// filter's to check when it starts. An empty text (or only whitespace) is
// every default to the filter (filter/README.md), as an empty object is.
func checkFilterJSON(text, path string, clusters map[string]Cluster) error {
	if strings.TrimLeft(text, " \t\r\n") == "" {
		text = "{}"
	}
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return fmt.Errorf("%s: not valid JSON: %w", path, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: want a JSON object, got %s", path, jsonKind(v))
	}
	cluster := defaultSidecarCluster
	if raw, ok := obj["sidecar_cluster"]; ok {
		if cluster, ok = raw.(string); !ok {
			return fmt.Errorf("%s: sidecar_cluster: want a string, got %s", path, jsonKind(raw))
		}
	}
	if _, ok := clusters[cluster]; !ok {
		return fmt.Errorf("%s: sidecar_cluster: cluster %q is not defined in static_resources.clusters", path, cluster)
	}
	return nil
}
