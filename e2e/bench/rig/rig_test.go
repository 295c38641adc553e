package rig

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"sigs.k8s.io/yaml"
)

// TestBootstrap: a front's bootstrap is envoy/envoy.yaml with the front's
// routes and clusters in place of the shipped services and the filter
// configuration changed only where the front asked, and it passes the
// strict load (Envoy's own API types and validation) the gateway applies.
func TestBootstrap(t *testing.T) {
	src, err := shippedEnvoyYAML()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := envoyconfig.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		services []string
		filter   Filter
		changed  map[string]any // the fields that differ from the shipped configuration
	}{
		{"as shipped", DefaultServices, Filter{}, nil},
		{"off", DefaultServices, Filter{Mode: "off"}, map[string]any{"mode": "off"}},
		{"breaker off", DefaultServices, Filter{BreakerOff: true}, map[string]any{"breaker": map[string]any{"failures": 0.0}}},
		{"local on failure", DefaultServices, Filter{OnFailure: "local"}, map[string]any{"on_failure": "local"}},
		{"canary", []string{"orders"}, Filter{CanaryClients: []string{"k\"1", "k2"}},
			map[string]any{"canary_clients": []any{"k\"1", "k2"}}},
		{"timeout and costs", []string{"a", "b_2"}, Filter{TimeoutMs: 250, Costs: []Cost{{Method: "POST", PathPrefix: "/a", Cost: 3}}},
			map[string]any{"timeout_ms": 250.0, "costs": []any{map[string]any{"method": "POST", "path_prefix": "/a", "cost": 3.0}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := bootstrap(src, tt.services, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := envoyconfig.Load(path)
			if err != nil {
				t.Fatalf("%v\n%s", err, b)
			}

			// Routes and clusters: the front's services, shaped like the
			// shipped ones, and the shipped sidecar cluster.
			if len(cfg.Routes) != len(tt.services) {
				t.Fatalf("routes %+v", cfg.Routes)
			}
			shape := shipped.Clusters[shipped.Routes[0].Cluster]
			for i, s := range tt.services {
				if cfg.Routes[i] != (envoyconfig.Route{Prefix: "/" + s, Cluster: s}) {
					t.Errorf("route %d: %+v", i, cfg.Routes[i])
				}
				if c := cfg.Clusters[s]; len(c.Endpoints) != 1 || c.ConnectTimeout != shape.ConnectTimeout {
					t.Errorf("cluster %s: %+v, want one endpoint and a connect timeout of %v", s, c, shape.ConnectTimeout)
				}
			}
			// The shipped clusters no route of the services goes to stay:
			// the sidecar's and the admin's (behind the stats listener).
			kept := len(shipped.Clusters) - len(shipped.Routes)
			if len(cfg.Clusters) != len(tt.services)+kept || cfg.Clusters["envoy_admin"].Name == "" {
				t.Errorf("clusters %+v, want the services', the sidecar's and the admin's", cfg.Clusters)
			}
			if !reflect.DeepEqual(cfg.Clusters["ratelimit_sidecar"], shipped.Clusters["ratelimit_sidecar"]) {
				t.Errorf("sidecar cluster %+v, want the shipped %+v", cfg.Clusters["ratelimit_sidecar"], shipped.Clusters["ratelimit_sidecar"])
			}

			// The filter: envoy.yaml's, and its configuration the shipped
			// one with exactly the requested changes.
			gotWasm, wantWasm := cfg.Wasm, shipped.Wasm
			gotWasm.Configuration, wantWasm.Configuration = "", ""
			if gotWasm != wantWasm {
				t.Errorf("filter %+v, want the shipped %+v", gotWasm, wantWasm)
			}
			got, want := decode(t, cfg.Wasm.Configuration), decode(t, shipped.Wasm.Configuration)
			for k, v := range tt.changed {
				if reflect.DeepEqual(want[k], v) {
					t.Fatalf("%s = %v is what envoy.yaml ships: not a change", k, v)
				}
				want[k] = v
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("filter configuration\n%v\nwant\n%v", got, want)
			}

			// Everything else is envoy.yaml's, field for field.
			if g, w := withoutEdits(t, b), withoutEdits(t, mustRead(t, src)); !reflect.DeepEqual(g, w) {
				t.Errorf("bootstrap differs from envoy.yaml beyond routes, clusters and filter configuration:\n%v\nwant\n%v", g, w)
			}
		})
	}
}

func TestBootstrapRejectsBadNames(t *testing.T) {
	src, err := shippedEnvoyYAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range [][]string{nil, {"Orders"}, {"ratelimit_sidecar"}, {"a b"}, {""}, {"a", "a"}} {
		if _, err := bootstrap(src, s, Filter{}); err == nil {
			t.Errorf("bootstrap(%q) accepted", s)
		}
	}
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return m
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withoutEdits decodes a bootstrap of envoy.yaml's shape with the three
// parts a front changes blanked: the routes, the clusters and the filter's
// configuration text.
func withoutEdits(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	at := func(v any, path ...any) map[string]any {
		for _, p := range path {
			switch p := p.(type) {
			case string:
				v = v.(map[string]any)[p]
			case int:
				v = v.([]any)[p]
			}
		}
		return v.(map[string]any)
	}
	static := at(doc, "static_resources")
	hcm := at(static, "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	at(hcm, "route_config", "virtual_hosts", 0)["routes"] = nil
	wasm := -1
	for i, f := range at(hcm)["http_filters"].([]any) {
		if f.(map[string]any)["name"] == "envoy.filters.http.wasm" {
			wasm = i
		}
	}
	if wasm < 0 {
		t.Fatal("no envoy.filters.http.wasm among the bootstrap's http_filters")
	}
	at(hcm, "http_filters", wasm, "typed_config", "config", "configuration")["value"] = nil
	static["clusters"] = nil
	return doc
}

// TestStartFailuresCleanUp: a backend or front that fails part way (Redis
// or the fleet already started) returns its error and nothing else; its
// clean-up closes what it started, not the nil it returns, which panicked.
func TestStartFailuresCleanUp(t *testing.T) {
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "no-such-binary")
	if b, err := StartBackend(ctx, harness.Binaries{Sidecar: missing}, OpenPlans); err == nil || b != nil {
		t.Fatalf("backend with no sidecar binary: %v, %v", b, err)
	}
	src, err := shippedEnvoyYAML()
	if err != nil {
		t.Fatal(err)
	}
	// The fleet starts, then the gateway cannot.
	b := &Backend{Bin: harness.Binaries{Gateway: missing, Filter: missing}, Dir: t.TempDir(), envoyYAML: src}
	if f, err := b.StartFront(ctx, FrontOptions{Name: "x"}); err == nil || f != nil || len(b.fronts) != 0 {
		t.Fatalf("front with no gateway binary: %v, %v, fronts %d", f, err, len(b.fronts))
	}
}
