package envoyconfig

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
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
	wantRoutes := []Route{{"/orders", "orders"}, {"/billing", "billing"}}
	if !reflect.DeepEqual(c.Routes, wantRoutes) {
		t.Errorf("Routes = %+v, want %+v", c.Routes, wantRoutes)
	}
	wantClusters := map[string]Cluster{
		"orders":            {Name: "orders", Endpoints: []string{"127.0.0.1:9001"}, ConnectTimeout: time.Second},
		"billing":           {Name: "billing", Endpoints: []string{"127.0.0.1:9002"}, ConnectTimeout: time.Second},
		"ratelimit_sidecar": {Name: "ratelimit_sidecar", Endpoints: []string{"127.0.0.1:8081"}, ConnectTimeout: 250 * time.Millisecond},
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

// The filter's configuration inside the bootstrap is JSON with the fields
// DESIGN.md documents, pointing at the sidecar cluster. (The filter checks
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
