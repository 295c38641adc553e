package rig

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
)

// TestBootstrapLoads: the generated bootstrap passes the same strict load
// (Envoy's own API types and validation) the gateway applies.
func TestBootstrapLoads(t *testing.T) {
	tests := []struct {
		name     string
		services []string
		filter   Filter
		want     map[string]any
	}{
		{"defaults", DefaultServices, Filter{}, map[string]any{"mode": "enforce", "timeout_ms": 5.0, "canary_clients": []any{}, "breaker": nil}},
		{"breaker off", DefaultServices, Filter{BreakerOff: true}, map[string]any{"mode": "enforce", "breaker": map[string]any{"failures": 0.0}}},
		{"canary", []string{"orders"}, Filter{Mode: "enforce", CanaryClients: []string{"k\"1", "k2"}, TimeoutMs: 7},
			map[string]any{"mode": "enforce", "timeout_ms": 7.0, "canary_clients": []any{"k\"1", "k2"}}},
		{"off with costs", []string{"a", "b_2"}, Filter{Mode: "off", Costs: []Cost{{Method: "POST", PathPrefix: "/a", Cost: 3}}},
			map[string]any{"mode": "off", "costs": []any{map[string]any{"method": "POST", "path_prefix": "/a", "cost": 3.0}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Bootstrap(tt.services, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			os.WriteFile(path, b, 0o600)
			cfg, err := envoyconfig.Load(path)
			if err != nil {
				t.Fatalf("%v\n%s", err, b)
			}
			if len(cfg.Routes) != len(tt.services) {
				t.Fatalf("routes %+v", cfg.Routes)
			}
			for i, s := range tt.services {
				if cfg.Routes[i] != (envoyconfig.Route{Prefix: "/" + s, Cluster: s}) {
					t.Errorf("route %d: %+v", i, cfg.Routes[i])
				}
				if _, ok := cfg.Clusters[s]; !ok {
					t.Errorf("no cluster %s", s)
				}
			}
			if _, ok := cfg.Clusters["ratelimit_sidecar"]; !ok || !cfg.Wasm.FailOpen {
				t.Errorf("sidecar cluster or fail_open missing: %+v", cfg.Wasm)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(cfg.Wasm.Configuration), &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.want {
				if !reflect.DeepEqual(got[k], v) {
					t.Errorf("%s = %#v, want %#v", k, got[k], v)
				}
			}
		})
	}
}

func TestBootstrapRejectsBadNames(t *testing.T) {
	for _, s := range [][]string{nil, {"Orders"}, {"ratelimit_sidecar"}, {"a b"}, {""}} {
		if _, err := Bootstrap(s, Filter{}); err == nil {
			t.Errorf("Bootstrap(%q) accepted", s)
		}
	}
}
