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
