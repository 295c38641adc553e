package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"
)

// Bootstrap is an Envoy bootstrap read for editing. Its methods change the
// parts a test or a benchmark is about; everything else stays as the file
// gives it, so what runs is the deployed envoy.yaml with those changes.
type Bootstrap struct {
	src string // the file it was read from, for errors
	doc map[string]any
}

// ReadBootstrap reads the Envoy bootstrap at path.
func ReadBootstrap(path string) (*Bootstrap, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b := &Bootstrap{src: path}
	if err := yaml.Unmarshal(raw, &b.doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// Marshal returns the bootstrap as YAML. Comments are not kept.
func (b *Bootstrap) Marshal() ([]byte, error) { return yaml.Marshal(b.doc) }

// WithFilterConfig writes a copy of the Envoy bootstrap at src into dir with
// the fields of overrides (a JSON object) set in the wasm filter's plugin
// configuration, and returns its path. See Bootstrap.MergeFilterConfig.
func WithFilterConfig(src, dir, overrides string) (string, error) {
	b, err := ReadBootstrap(src)
	if err != nil {
		return "", err
	}
	if err := b.MergeFilterConfig(overrides); err != nil {
		return "", err
	}
	out, err := b.Marshal()
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "envoy.yaml")
	return dst, os.WriteFile(dst, out, 0o644)
}

// MergeFilterConfig sets the fields of overrides (a JSON object) in the wasm
// filter's plugin configuration. Every field overrides does not name keeps
// the value the bootstrap gives it. A value of JSON null removes the field,
// leaving it to the filter's default.
func (b *Bootstrap) MergeFilterConfig(overrides string) error {
	var patch map[string]json.RawMessage
	if err := json.Unmarshal([]byte(overrides), &patch); err != nil {
		return fmt.Errorf("filter configuration overrides %q: want a JSON object: %w", overrides, err)
	}
	return onlyPluginConfig(b.doc, b.src, func(m map[string]any) error {
		// With nothing to change the text stays as written, even one
		// that is not JSON: the plugin itself is what rejects it.
		if len(patch) == 0 {
			return nil
		}
		text, _ := m["value"].(string)
		cfg := map[string]json.RawMessage{}
		if err := json.Unmarshal([]byte(text), &cfg); err != nil {
			return fmt.Errorf("%s: the plugin configuration is not a JSON object: %w", b.src, err)
		}
		for k, v := range patch {
			if string(v) == "null" {
				delete(cfg, k)
				continue
			}
			cfg[k] = v
		}
		merged, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		m["value"] = string(merged)
		return nil
	})
}

// serviceName is what RouteServices accepts: a path segment and a cluster
// name that need no quoting anywhere.
var serviceName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// RouteServices replaces the bootstrap's services with names: one route per
// name, prefix /NAME to cluster NAME, in the given order, and one cluster
// per name with a single endpoint. The bootstrap's services are the clusters
// its routes go to; the other clusters (the sidecar's) stay as they are.
// Each new route is a copy of the bootstrap's first route and each new
// cluster a copy of that route's cluster, so both keep the file's settings
// (connect timeout, discovery type). The endpoints number on from that
// cluster's, as envoy.yaml numbers its services (127.0.0.1:9001, :9002, …):
// they are placeholders, which StartGateway replaces with the services'
// addresses (SetClusterEndpoint).
//
// The bootstrap must have one HTTP connection manager with the wasm filter,
// with one virtual host whose routes match a prefix and name a cluster.
func (b *Bootstrap) RouteServices(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("services: none")
	}
	for i, n := range names {
		if !serviceName.MatchString(n) {
			return fmt.Errorf("service name %q: want lower-case letters, digits and _, starting with a letter", n)
		}
		if slices.Contains(names[:i], n) {
			return fmt.Errorf("service %q given twice", n)
		}
	}
	vh, err := b.virtualHost()
	if err != nil {
		return err
	}
	routes, _ := vh["routes"].([]any)
	if len(routes) == 0 {
		return fmt.Errorf("%s: the virtual host has no routes", b.src)
	}
	routed := map[string]bool{}
	for i, r := range routes {
		rm, _ := r.(map[string]any)
		action, _ := rm["route"].(map[string]any)
		cluster, _ := action["cluster"].(string)
		match, _ := rm["match"].(map[string]any)
		if _, ok := match["prefix"].(string); !ok || cluster == "" {
			return fmt.Errorf("%s: route %d: want match.prefix and route.cluster", b.src, i)
		}
		routed[cluster] = true
	}
	first := routes[0].(map[string]any)
	shapeName := first["route"].(map[string]any)["cluster"].(string)

	static, _ := b.doc["static_resources"].(map[string]any)
	clusters, _ := static["clusters"].([]any)
	var shape map[string]any
	for _, c := range clusters {
		cm, _ := c.(map[string]any)
		name, _ := cm["name"].(string)
		if name == shapeName {
			shape = cm
		} else if !routed[name] && slices.Contains(names, name) {
			return fmt.Errorf("service %q: %s has a cluster of that name that no route goes to", name, b.src)
		}
	}
	if shape == nil {
		return fmt.Errorf("%s: no cluster %q, which the first route goes to", b.src, shapeName)
	}
	socket, err := firstSocketAddress(shape)
	if err != nil {
		return fmt.Errorf("%s: cluster %q: %w", b.src, shapeName, err)
	}
	port, _ := socket["port_value"].(float64)

	newRoutes := make([]any, len(names))
	newClusters := make([]any, len(names))
	for i, n := range names {
		r := clone(first).(map[string]any)
		r["match"].(map[string]any)["prefix"] = "/" + n
		r["route"].(map[string]any)["cluster"] = n
		newRoutes[i] = r

		c := clone(shape).(map[string]any)
		c["name"] = n
		c["load_assignment"].(map[string]any)["cluster_name"] = n
		// One endpoint: the first of the copy's, renumbered.
		s, _ := oneEndpoint(c)
		s["port_value"] = port + float64(i)
		newClusters[i] = c
	}
	// The new clusters take the place of the first one they replace.
	var kept []any
	for _, c := range clusters {
		name, _ := c.(map[string]any)["name"].(string)
		switch {
		case name == shapeName:
			kept = append(kept, newClusters...)
		case !routed[name]:
			kept = append(kept, c)
		}
	}
	static["clusters"] = kept
	vh["routes"] = newRoutes
	return nil
}

// wasmFilterType is the @type of the proxy-wasm HTTP filter's
// configuration.
const wasmFilterType = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"

// SetListenerAddress puts the listener named name on hostport.
func (b *Bootstrap) SetListenerAddress(name, hostport string) error {
	static, _ := b.doc["static_resources"].(map[string]any)
	listeners, _ := static["listeners"].([]any)
	var names []string
	for _, x := range listeners {
		l, ok := x.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: a listener is not a mapping", b.src)
		}
		if n, _ := l["name"].(string); n != name {
			names = append(names, n)
			continue
		}
		s, err := ensureSocketAddress(l)
		if err != nil {
			return fmt.Errorf("%s: listener %q: %w", b.src, name, err)
		}
		return setHostPort(s, hostport)
	}
	return fmt.Errorf("%s: no listener %q (listeners: %v)", b.src, name, names)
}

// SetAdminAddress puts the admin interface on hostport, adding an admin
// section if the bootstrap has none.
func (b *Bootstrap) SetAdminAddress(hostport string) error {
	admin, ok := b.doc["admin"].(map[string]any)
	if !ok {
		if b.doc["admin"] != nil {
			return fmt.Errorf("%s: admin is not a mapping", b.src)
		}
		admin = map[string]any{}
		b.doc["admin"] = admin
	}
	s, err := ensureSocketAddress(admin)
	if err != nil {
		return fmt.Errorf("%s: admin: %w", b.src, err)
	}
	return setHostPort(s, hostport)
}

// SetClusterEndpoint makes hostport the only endpoint of the cluster
// named name. The endpoint keeps the shape of the cluster's first one
// (its other fields stay as the file gives them).
func (b *Bootstrap) SetClusterEndpoint(name, hostport string) error {
	cm, err := b.cluster(name)
	if err != nil {
		return err
	}
	s, err := oneEndpoint(cm)
	if err != nil {
		return fmt.Errorf("%s: cluster %q: %w", b.src, name, err)
	}
	return setHostPort(s, hostport)
}

// SetClusterConnectTimeout sets the connect_timeout of the cluster named
// name.
func (b *Bootstrap) SetClusterConnectTimeout(name string, d time.Duration) error {
	cm, err := b.cluster(name)
	if err != nil {
		return err
	}
	cm["connect_timeout"] = strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
	return nil
}

// cluster is the static cluster named name.
func (b *Bootstrap) cluster(name string) (map[string]any, error) {
	static, _ := b.doc["static_resources"].(map[string]any)
	clusters, _ := static["clusters"].([]any)
	var names []string
	for _, c := range clusters {
		cm, _ := c.(map[string]any)
		n, _ := cm["name"].(string)
		if n == name {
			return cm, nil
		}
		names = append(names, n)
	}
	return nil, fmt.Errorf("%s: no cluster %q (clusters: %v)", b.src, name, names)
}

// SetWasmFilename makes path the module of the one proxy-wasm filter
// (vm_config.code.local.filename).
func (b *Bootstrap) SetWasmFilename(path string) error {
	if path == "" {
		return fmt.Errorf("wasm filename: empty")
	}
	var found []map[string]any
	walk(b.doc, func(m map[string]any) {
		if m["@type"] == wasmFilterType {
			found = append(found, m)
		}
	})
	if len(found) != 1 {
		return fmt.Errorf("%s: want exactly one wasm filter, found %d", b.src, len(found))
	}
	cfg, _ := found[0]["config"].(map[string]any)
	vm, _ := cfg["vm_config"].(map[string]any)
	code, _ := vm["code"].(map[string]any)
	local, _ := code["local"].(map[string]any)
	if _, ok := local["filename"].(string); !ok {
		return fmt.Errorf("%s: the wasm filter's module is not a local file (config.vm_config.code.local.filename)", b.src)
	}
	local["filename"] = path
	return nil
}

// ensureSocketAddress returns m's address.socket_address, adding an empty
// one if m has no address.
func ensureSocketAddress(m map[string]any) (map[string]any, error) {
	if m["address"] == nil {
		m["address"] = map[string]any{"socket_address": map[string]any{}}
	}
	addr, ok := m["address"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("address is not a mapping")
	}
	if addr["socket_address"] == nil && len(addr) == 0 {
		addr["socket_address"] = map[string]any{}
	}
	s, ok := addr["socket_address"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want address.socket_address")
	}
	return s, nil
}

// setHostPort sets a socket_address to hostport: a host and a port from 1
// to 65535 (a known port, not one the proxy picks).
func setHostPort(s map[string]any, hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("address %q: want host:port: %w", hostport, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if host == "" || err != nil || n == 0 {
		return fmt.Errorf("address %q: want a host and a port from 1 to 65535", hostport)
	}
	s["address"] = host
	s["port_value"] = float64(n)
	return nil
}

// oneEndpoint cuts a cluster's endpoints down to its first one and
// returns that endpoint's socket_address.
func oneEndpoint(cluster map[string]any) (map[string]any, error) {
	s, err := firstSocketAddress(cluster)
	if err != nil {
		return nil, err
	}
	la := cluster["load_assignment"].(map[string]any)
	ep := la["endpoints"].([]any)[0].(map[string]any)
	ep["lb_endpoints"] = ep["lb_endpoints"].([]any)[:1]
	la["endpoints"] = []any{ep}
	return s, nil
}

// firstSocketAddress returns the socket_address of a cluster's first
// endpoint.
func firstSocketAddress(cluster map[string]any) (map[string]any, error) {
	la, _ := cluster["load_assignment"].(map[string]any)
	eps, _ := la["endpoints"].([]any)
	if len(eps) == 0 {
		return nil, fmt.Errorf("no load_assignment.endpoints")
	}
	lbs, _ := eps[0].(map[string]any)["lb_endpoints"].([]any)
	if len(lbs) == 0 {
		return nil, fmt.Errorf("no lb_endpoints")
	}
	lb, _ := lbs[0].(map[string]any)
	ep, _ := lb["endpoint"].(map[string]any)
	addr, _ := ep["address"].(map[string]any)
	s, _ := addr["socket_address"].(map[string]any)
	if _, ok := s["port_value"].(float64); !ok {
		return nil, fmt.Errorf("first endpoint: want endpoint.address.socket_address with a port_value")
	}
	return s, nil
}

// virtualHost returns the one virtual host of the HTTP connection manager
// the wasm filter is in (the services' routes; envoy.yaml's stats listener
// has a connection manager of its own).
func (b *Bootstrap) virtualHost() (map[string]any, error) {
	var hcms []map[string]any
	walk(b.doc, func(m map[string]any) {
		if m["@type"] != "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" {
			return
		}
		wasm := false
		walk(m["http_filters"], func(f map[string]any) {
			wasm = wasm || f["@type"] == "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
		})
		if wasm {
			hcms = append(hcms, m)
		}
	})
	if len(hcms) != 1 {
		return nil, fmt.Errorf("%s: want exactly one HTTP connection manager with the wasm filter, found %d", b.src, len(hcms))
	}
	rc, _ := hcms[0]["route_config"].(map[string]any)
	vhs, _ := rc["virtual_hosts"].([]any)
	if len(vhs) != 1 {
		return nil, fmt.Errorf("%s: want one virtual host in the HTTP connection manager's route_config, found %d", b.src, len(vhs))
	}
	vh, ok := vhs[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: the virtual host is not a mapping", b.src)
	}
	return vh, nil
}

// clone deep-copies a value decoded from YAML (maps, slices and scalars).
func clone(v any) any {
	switch v := v.(type) {
	case map[string]any:
		c := make(map[string]any, len(v))
		for k, e := range v {
			c[k] = clone(e)
		}
		return c
	case []any:
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = clone(e)
		}
		return c
	default:
		return v
	}
}

// onlyPluginConfig calls edit on the one StringValue (the plugin
// configuration) of doc, and fails unless there is exactly one.
func onlyPluginConfig(doc map[string]any, src string, edit func(map[string]any) error) error {
	var found []map[string]any
	walk(doc, func(m map[string]any) {
		if m["@type"] == "type.googleapis.com/google.protobuf.StringValue" {
			found = append(found, m)
		}
	})
	if len(found) != 1 {
		return fmt.Errorf("%s: want exactly one StringValue plugin configuration, found %d", src, len(found))
	}
	return edit(found[0])
}

func walk(v any, visit func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		visit(v)
		for _, c := range v {
			walk(c, visit)
		}
	case []any:
		for _, c := range v {
			walk(c, visit)
		}
	}
}
