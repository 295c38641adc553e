package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"sigs.k8s.io/yaml"
)

// statsAt is where renderShipped puts envoy.yaml's stats listener.
const statsAt = "127.0.0.1:40006"

// renderShipped renders the bootstrap StartGateway would write for
// envoy/envoy.yaml with the given addresses (the stats listener at
// statsAt).
func renderShipped(t *testing.T, clusters map[string]string, module, listen, admin string) []byte {
	t.Helper()
	out, err := RenderBootstrap(GatewayConfig{Config: shippedEnvoyYAML(t), Clusters: clusters, Wasm: module},
		GatewayAddrs{Listen: listen, Admin: admin, Listeners: map[string]string{"stats": statsAt}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The bootstrap a gateway runs, read by the stand-in's own (strict)
// parser: the listener, the admin, every cluster and the module are where
// the test put them, and the rest is envoy.yaml's.
func TestRenderBootstrapLands(t *testing.T) {
	shipped, err := envoyconfig.Load(shippedEnvoyYAML(t))
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]string{"orders": "127.0.0.1:40001", "billing": "127.0.0.1:40002", "ratelimit_sidecar": "127.0.0.1:40003"}
	module := filepath.Join(t.TempDir(), "filter.wasm")
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, renderShipped(t, clusters, module, "127.0.0.1:40004", "127.0.0.1:40005"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := envoyconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Listener != "127.0.0.1:40004" || got.Admin != "127.0.0.1:40005" {
		t.Errorf("listener %s, admin %s; want 127.0.0.1:40004 and 127.0.0.1:40005", got.Listener, got.Admin)
	}
	if got.Wasm.Filename != module {
		t.Errorf("module %q, want %q", got.Wasm.Filename, module)
	}
	want := *shipped
	want.Listener, want.Admin = got.Listener, got.Admin
	want.Listeners = slices.Clone(shipped.Listeners)
	want.Listeners[0].Address = statsAt
	want.Wasm.Filename = module
	want.Clusters = map[string]envoyconfig.Cluster{}
	for name, c := range shipped.Clusters {
		c.Endpoints = []string{clusters[name]}
		if name == "envoy_admin" { // behind the stats listener: follows the admin
			c.Endpoints = []string{"127.0.0.1:40005"}
		}
		want.Clusters[name] = c
	}
	// Histogram matchers are functions: compared by what they match.
	if len(got.Histograms) != len(shipped.Histograms) {
		t.Fatalf("%d histogram settings, want envoy.yaml's %d", len(got.Histograms), len(shipped.Histograms))
	}
	const latency = "wasmcustom.edgelimit.callout.latency_us"
	if !reflect.DeepEqual(got.BucketsFor(latency), shipped.BucketsFor(latency)) {
		t.Errorf("%s buckets %v, want envoy.yaml's %v", latency, got.BucketsFor(latency), shipped.BucketsFor(latency))
	}
	// So are the CORS policy's origin matchers.
	if got.CORS == nil || shipped.CORS == nil {
		t.Fatalf("CORS policy %v, want envoy.yaml's %v", got.CORS, shipped.CORS)
	}
	for _, origin := range []string{"https://app.example.com", "https://other.example"} {
		if got.CORS.Allowed(origin) != shipped.CORS.Allowed(origin) {
			t.Errorf("CORS policy allows %s: %t, envoy.yaml's %t", origin, got.CORS.Allowed(origin), shipped.CORS.Allowed(origin))
		}
	}
	gotCORS, wantCORS := *got.CORS, *shipped.CORS
	gotCORS.AllowOrigins, wantCORS.AllowOrigins = nil, nil
	if !reflect.DeepEqual(gotCORS, wantCORS) {
		t.Errorf("CORS policy %+v, want envoy.yaml's %+v", gotCORS, wantCORS)
	}
	got.Histograms, want.Histograms = nil, nil
	got.CORS, want.CORS = nil, nil
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("the rendered bootstrap reads\n%+v\nwant envoy.yaml's with the test's addresses\n%+v", *got, want)
	}
}

// The rendered bootstrap is envoy.yaml field for field except at the
// addresses, ports and the module path: the filter's configuration, the
// routes, the timeouts and the limits stay the shipped ones.
func TestRenderBootstrapChangesOnlyAddresses(t *testing.T) {
	clusters := map[string]string{"orders": "127.0.0.1:40001", "billing": "127.0.0.1:40002", "ratelimit_sidecar": "127.0.0.1:40003"}
	rendered := renderShipped(t, clusters, "/abs/filter.wasm", "127.0.0.1:40004", "127.0.0.1:40005")
	raw, err := os.ReadFile(shippedEnvoyYAML(t))
	if err != nil {
		t.Fatal(err)
	}
	var before, after any
	if err := yaml.Unmarshal(raw, &before); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(rendered, &after); err != nil {
		t.Fatal(err)
	}
	// Where a change may be: a socket address's host or port, the one
	// endpoint of a cluster, and the module's file name.
	socket := `\.address\.socket_address\.(address|port_value)$`
	allowed := []*regexp.Regexp{
		regexp.MustCompile(`^admin` + socket),
		regexp.MustCompile(`^static_resources\.listeners\[[0-9]+\]` + socket),
		regexp.MustCompile(`^static_resources\.clusters\[[0-9]+\]\.load_assignment\.endpoints\[0\]\.lb_endpoints\[0\]\.endpoint` + socket),
		regexp.MustCompile(`\.vm_config\.code\.local\.filename$`),
	}
	diffs := diffPaths(before, after, "")
	for _, d := range diffs {
		if !slices.ContainsFunc(allowed, func(re *regexp.Regexp) bool { return re.MatchString(d) }) {
			t.Errorf("the rendered bootstrap differs from envoy.yaml at %s", d)
		}
	}
	// And every port did change (the hosts were 127.0.0.1 already, but
	// for the listeners' 0.0.0.0), and the module's path: the two
	// listeners, the admin, the test's clusters, envoy_admin (following
	// the admin) and the module.
	var changed int
	for _, d := range diffs {
		if strings.HasSuffix(d, ".port_value") || strings.HasSuffix(d, ".filename") {
			changed++
		}
	}
	if want := 3 + len(clusters) + 1 + 1; changed != want {
		t.Errorf("%d ports and paths changed, want %d:\n%s", changed, want, strings.Join(diffs, "\n"))
	}
}

// diffPaths returns the paths (a.b[0].c) at which a and b, decoded YAML,
// differ.
func diffPaths(a, b any, path string) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			return []string{path}
		}
		var out []string
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		for k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			out = append(out, diffPaths(av[k], bv[k], p)...)
		}
		slices.Sort(out)
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return []string{path}
		}
		var out []string
		for i := range av {
			out = append(out, diffPaths(av[i], bv[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	default:
		if !reflect.DeepEqual(a, b) {
			return []string{path}
		}
		return nil
	}
}

func TestRenderBootstrapRejects(t *testing.T) {
	src := shippedEnvoyYAML(t)
	ok := map[string]string{"orders": "127.0.0.1:1"}
	for _, tt := range []struct {
		name          string
		c             GatewayConfig
		listen, admin string
		stats         string // the stats listener's address; "" gives none
	}{
		{"unknown cluster", GatewayConfig{Config: src, Wasm: "f.wasm", Clusters: map[string]string{"payments": "127.0.0.1:1"}}, "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"},
		{"cluster without a port", GatewayConfig{Config: src, Wasm: "f.wasm", Clusters: map[string]string{"orders": "127.0.0.1"}}, "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"},
		{"cluster at port 0", GatewayConfig{Config: src, Wasm: "f.wasm", Clusters: map[string]string{"orders": "127.0.0.1:0"}}, "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"},
		{"listener without a host", GatewayConfig{Config: src, Wasm: "f.wasm", Clusters: ok}, ":2", "127.0.0.1:3", "127.0.0.1:4"},
		{"admin port out of range", GatewayConfig{Config: src, Wasm: "f.wasm", Clusters: ok}, "127.0.0.1:2", "127.0.0.1:70000", "127.0.0.1:4"},
		{"no module", GatewayConfig{Config: src, Clusters: ok}, "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"},
		{"no address for the stats listener", GatewayConfig{Config: src, Wasm: "f.wasm", Clusters: ok}, "127.0.0.1:2", "127.0.0.1:3", ""},
		{"no such file", GatewayConfig{Config: filepath.Join(t.TempDir(), "none.yaml"), Wasm: "f.wasm"}, "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"},
	} {
		a := GatewayAddrs{Listen: tt.listen, Admin: tt.admin, Listeners: map[string]string{}}
		if tt.stats != "" {
			a.Listeners["stats"] = tt.stats
		}
		if _, err := RenderBootstrap(tt.c, a); err == nil {
			t.Errorf("%s: rendered", tt.name)
		}
	}
}

// A module path is made absolute: Envoy resolves a relative one against
// its working directory, which is not the test's.
func TestRenderBootstrapAbsoluteModule(t *testing.T) {
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, renderShipped(t, nil, "build/filter.wasm", "127.0.0.1:2", "127.0.0.1:3"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs("build/filter.wasm")
	if cfg.Wasm.Filename != want {
		t.Errorf("module %q, want %q", cfg.Wasm.Filename, want)
	}
}

// Envoy and build/gateway get the same two things, the file and the
// worker count, each under its own flag names; Envoy also gets a base id
// of its own, and libevent's precise clock as the deployments give it.
// Stand-in flags never reach Envoy.
func TestGatewayCommand(t *testing.T) {
	b := Binaries{Gateway: "/b/gateway", Filter: "/b/filter.wasm"}
	bin, args, env := gatewayCommand(b, GatewayConfig{}, "/t/envoy.yaml")
	if want := []string{"-config", "/t/envoy.yaml", "-concurrency", "2"}; bin != b.Gateway || !slices.Equal(args, want) || env != nil {
		t.Errorf("stand-in: %s %q adding %q to its environment, want %s %q adding nothing", bin, args, env, b.Gateway, want)
	}
	_, args, _ = gatewayCommand(b, GatewayConfig{Concurrency: 3, AccessLog: true, Extra: []string{"-poll-oneoff", "noevents"}}, "/t/envoy.yaml")
	if want := []string{"-config", "/t/envoy.yaml", "-concurrency", "3", "-access-log", "-poll-oneoff", "noevents"}; !slices.Equal(args, want) {
		t.Errorf("stand-in with options: %q, want %q", args, want)
	}
	b.Envoy = "/usr/local/bin/envoy"
	bin, args, env = gatewayCommand(b, GatewayConfig{AccessLog: true}, "/t/envoy.yaml")
	if want := []string{"-c", "/t/envoy.yaml", "--concurrency", "2", "--use-dynamic-base-id", "--log-level", "warn"}; bin != b.Envoy || !slices.Equal(args, want) {
		t.Errorf("Envoy: %s %q, want %s %q", bin, args, b.Envoy, want)
	}
	if want := []string{"EVENT_PRECISE_TIMER=1"}; !slices.Equal(env, want) {
		t.Errorf("Envoy's environment adds %q, want %q", env, want)
	}
	if _, err := LaunchGateway(b, GatewayConfig{Config: shippedEnvoyYAML(t), Extra: []string{"-cpuprofile", "x"}}); err == nil || !strings.Contains(err.Error(), "build/gateway's") {
		t.Errorf("stand-in flags with Envoy: %v, want them refused", err)
	}
}

// fakeEnvoy writes an executable named envoy into dir that prints
// version as Envoy's --version does.
func fakeEnvoy(t *testing.T, dir, version string) string {
	t.Helper()
	path := filepath.Join(dir, "envoy")
	script := "#!/bin/sh\nprintf '\\nenvoy  version: 0123abcd/" + version + "/Clean/RELEASE/BoringSSL\\n\\n'\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFindEnvoy(t *testing.T) {
	ctx := context.Background()
	onPath := fakeEnvoy(t, t.TempDir(), "1.40.0")
	t.Setenv("PATH", filepath.Dir(onPath))

	// Unset: the envoy on the PATH. (t.Setenv first, so that the
	// environment's own ENVOY_BIN is back after the test.)
	t.Setenv(EnvoyEnv, "")
	os.Unsetenv(EnvoyEnv)
	if e, err := FindEnvoy(ctx); err != nil || e.Path != onPath || e.Version != "1.40.0" {
		t.Errorf("ENVOY_BIN unset: %+v, %v; want the PATH's %s, 1.40.0", e, err, onPath)
	}
	// Set but empty: none, whatever the PATH has.
	t.Setenv(EnvoyEnv, "")
	if e, err := FindEnvoy(ctx); err != nil || e.Path != "" {
		t.Errorf("ENVOY_BIN empty: %+v, %v; want none", e, err)
	}
	// A path: that one.
	minimum := fakeEnvoy(t, t.TempDir(), "1.33.14")
	t.Setenv(EnvoyEnv, minimum)
	if e, err := FindEnvoy(ctx); err != nil || e.Path != minimum || e.Version != "1.33.14" {
		t.Errorf("ENVOY_BIN=%s: %+v, %v", minimum, e, err)
	}
	// Older than the minimum, or not there: an error, never the stand-in.
	t.Setenv(EnvoyEnv, fakeEnvoy(t, t.TempDir(), "1.32.12"))
	if _, err := FindEnvoy(ctx); err == nil || !strings.Contains(err.Error(), "older than 1.33") {
		t.Errorf("Envoy 1.32.12: %v, want it refused as older than 1.33", err)
	}
	t.Setenv(EnvoyEnv, filepath.Join(t.TempDir(), "envoy"))
	if _, err := FindEnvoy(ctx); err == nil {
		t.Error("ENVOY_BIN naming no file: accepted")
	}
	// Nothing on the PATH either: none.
	os.Unsetenv(EnvoyEnv)
	t.Setenv("PATH", t.TempDir())
	if e, err := FindEnvoy(ctx); err != nil || e.Path != "" {
		t.Errorf("no Envoy anywhere: %+v, %v; want none", e, err)
	}
}
