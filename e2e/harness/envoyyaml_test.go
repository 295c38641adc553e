package harness

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"sigs.k8s.io/yaml"
)

func shippedEnvoyYAML(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "envoy", "envoy.yaml")
}

// load writes b and reads it back the way the gateway does.
func load(t *testing.T, b *Bootstrap) *envoyconfig.Config {
	t.Helper()
	out, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconfig.Load(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return cfg
}

func TestRouteServices(t *testing.T) {
	src := shippedEnvoyYAML(t)
	shipped, err := envoyconfig.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadBootstrap(src)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"accounts", "orders", "b_2"}
	if err := b.RouteServices(names); err != nil {
		t.Fatal(err)
	}
	got := load(t, b)

	var routes []envoyconfig.Route
	for _, n := range names {
		routes = append(routes, envoyconfig.Route{Prefix: "/" + n, Cluster: n})
	}
	if !reflect.DeepEqual(got.Routes, routes) {
		t.Errorf("routes %+v, want %+v", got.Routes, routes)
	}
	// The shipped services' shape, numbered on from the first one's port.
	shape := shipped.Clusters[shipped.Routes[0].Cluster]
	want := map[string]envoyconfig.Cluster{}
	for name, c := range shipped.Clusters {
		if name != "orders" && name != "billing" {
			want[name] = c // the sidecar's, as shipped
		}
	}
	host, port, err := net.SplitHostPort(shape.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	first, _ := strconv.Atoi(port)
	for i, n := range names {
		want[n] = envoyconfig.Cluster{Name: n, Endpoints: []string{net.JoinHostPort(host, strconv.Itoa(first+i))}, ConnectTimeout: shape.ConnectTimeout, Limits: shape.Limits}
	}
	if !reflect.DeepEqual(got.Clusters, want) {
		t.Errorf("clusters\n%+v\nwant\n%+v", got.Clusters, want)
	}
	if got.Listener != shipped.Listener || got.Admin != shipped.Admin || got.Wasm != shipped.Wasm {
		t.Errorf("listener, admin or filter changed:\n%+v\nwant\n%+v", got, shipped)
	}
}

func TestRouteServicesRejects(t *testing.T) {
	src := shippedEnvoyYAML(t)
	for _, names := range [][]string{nil, {}, {"Orders"}, {"ratelimit_sidecar"}, {"a b"}, {""}, {"a/b"}, {"a", "a"}} {
		b, err := ReadBootstrap(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.RouteServices(names); err == nil {
			t.Errorf("RouteServices(%q) accepted", names)
		}
	}
}

func TestMergeFilterConfig(t *testing.T) {
	src := shippedEnvoyYAML(t)
	shipped, err := envoyconfig.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadBootstrap(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.MergeFilterConfig(`{"mode": "off", "region": null, "breaker": {"failures": 0}}`); err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	if err := json.Unmarshal([]byte(load(t, b).Wasm.Configuration), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(shipped.Wasm.Configuration), &want); err != nil {
		t.Fatal(err)
	}
	want["mode"] = "off"
	delete(want, "region")
	want["breaker"] = map[string]any{"failures": 0.0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("configuration\n%v\nwant\n%v", got, want)
	}
	if err := b.MergeFilterConfig(`[]`); err == nil {
		t.Error("a JSON array accepted as overrides")
	}
}

// The address setters on a bootstrap of another shape than envoy.yaml's:
// no admin section (one is added), a cluster of two endpoints (one is
// left).
func TestAddressSetters(t *testing.T) {
	const src = `static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, port_value: 80}}
  clusters:
  - name: two
    load_assignment:
      cluster_name: two
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 10.0.0.1, port_value: 1}}}
        - endpoint: {address: {socket_address: {address: 10.0.0.2, port_value: 2}}}
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 10.0.0.3, port_value: 3}}}
`
	path := filepath.Join(t.TempDir(), "b.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadBootstrap(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		b.SetListenerAddress("l", "127.0.0.1:8080"),
		b.SetAdminAddress("127.0.0.1:9901"),
		b.SetClusterEndpoint("two", "127.0.0.1:7000"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetClusterEndpoint("three", "127.0.0.1:1"); err == nil {
		t.Error("an unknown cluster accepted")
	}
	if err := b.SetListenerAddress("m", "127.0.0.1:1"); err == nil {
		t.Error("an unknown listener accepted")
	}
	if err := b.SetWasmFilename("/m.wasm"); err == nil {
		t.Error("a module set in a bootstrap without a wasm filter")
	}
	out, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal([]byte(`admin: {address: {socket_address: {address: 127.0.0.1, port_value: 9901}}}
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 127.0.0.1, port_value: 8080}}
  clusters:
  - name: two
    load_assignment:
      cluster_name: two
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 7000}}}
`), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s", out)
	}
}
