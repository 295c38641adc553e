// Package rig assembles the system a benchmark scenario measures, from the
// real parts: a redis-server, the sidecar, and any number of fronts — a
// fleet of services (package services) behind its own gateway running
// filter.wasm. A front's bootstrap is envoy/envoy.yaml as shipped, with
// routes and clusters for the front's services and only the filter
// configuration changes its scenario asks for. Two fronts sharing one
// backend run the old design and the new one side by side in the same run.
// Everything a rig starts, Close stops.
package rig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// DefaultServices are the incident's three services.
var DefaultServices = []string{"orders", "billing", "accounts"}

// Backend is the shared part: Redis and the sidecar.
type Backend struct {
	Bin         harness.Binaries
	Dir         string // scratch directory, removed by Close
	Redis       *redisproc.Server
	Sidecar     *harness.Process
	SidecarAddr string
	PlansPath   string

	envoyYAML string // envoy/envoy.yaml, which every front's bootstrap starts from
	fronts    []*Front
}

// OpenPlans is a plans file that admits everything: every check is a
// callout the sidecar allows, the script's writing path.
const OpenPlans = "default_plan: open\nplans:\n  open: {capacity: 1000000000, rate: 1000000000}\n"

// StartBackend starts redis-server and the sidecar with plans (the plans
// file's YAML). sidecarArgs are extra sidecar flags.
func StartBackend(ctx context.Context, bin harness.Binaries, plans string, sidecarArgs ...string) (b *Backend, err error) {
	dir, err := os.MkdirTemp("", "edgelimit-bench-")
	if err != nil {
		return nil, err
	}
	started := &Backend{Bin: bin, Dir: dir}
	b = started
	defer func() {
		if err != nil {
			started.Close() // b is nil by then
		}
	}()
	if b.envoyYAML, err = shippedEnvoyYAML(); err != nil {
		return nil, err
	}
	if b.Redis, err = redisproc.Start(ctx, redisproc.Options{Dir: filepath.Join(dir, "redis")}); err != nil {
		return nil, err
	}
	b.PlansPath = filepath.Join(dir, "plans.yaml")
	if err = os.WriteFile(b.PlansPath, []byte(plans), 0o600); err != nil {
		return nil, err
	}
	b.Sidecar, b.SidecarAddr, err = harness.StartSidecar(ctx, bin, harness.SidecarConfig{
		Redis: b.Redis.URL(), Plans: b.PlansPath, Extra: append([]string{"-log-level", "error"}, sidecarArgs...),
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Close stops every front, the sidecar and Redis, and removes the scratch
// directory.
func (b *Backend) Close() error {
	var errs []error
	for _, f := range b.fronts {
		errs = append(errs, f.close())
	}
	b.fronts = nil
	if b.Sidecar != nil {
		errs = append(errs, b.Sidecar.Stop(5*time.Second))
	}
	if b.Redis != nil {
		errs = append(errs, b.Redis.Stop())
	}
	os.RemoveAll(b.Dir)
	return errors.Join(errs...)
}

// Cost is one per-route cost rule of the filter.
type Cost struct {
	Method     string `json:"method,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
	Cost       int64  `json:"cost"`
}

// Filter is what a front changes in envoy/envoy.yaml's filter
// configuration (filter/README.md, "Configuration"): each field set
// replaces the shipped value and each field left zero keeps it, so the
// zero value runs the filter as shipped. A scenario says beside each field
// it sets why.
type Filter struct {
	Mode          string   // enforce, shadow or off
	TimeoutMs     int      // the callout timeout: only for a scenario about it
	CanaryClients []string // enforced while the rest run in shadow
	Costs         []Cost   // replace the shipped rules
	// BreakerOff turns the filter's circuit breaker off ("breaker":
	// {"failures": 0}): every check makes its callout and waits for its
	// answer or the timeout, however many failed before.
	BreakerOff bool
	// OnFailure is what an enforced request gets when the sidecar cannot
	// answer: "open" (the shipped value) or "local" (the client's last
	// known plan, enforced by the proxy).
	OnFailure string
}

// overrides is f as the fields to merge over the shipped configuration.
func (f Filter) overrides() (string, error) {
	o := map[string]any{}
	if f.Mode != "" {
		o["mode"] = f.Mode
	}
	if f.TimeoutMs != 0 {
		o["timeout_ms"] = f.TimeoutMs
	}
	if len(f.CanaryClients) > 0 {
		o["canary_clients"] = f.CanaryClients
	}
	if len(f.Costs) > 0 {
		o["costs"] = f.Costs
	}
	if f.BreakerOff {
		o["breaker"] = map[string]any{"failures": 0}
	}
	if f.OnFailure != "" {
		o["on_failure"] = f.OnFailure
	}
	b, err := json.Marshal(o)
	return string(b), err
}

// FrontOptions shape a front.
type FrontOptions struct {
	Name     string          // label, also the config file's name
	Services []string        // default DefaultServices
	Fleet    services.Config // every service's shape (Name is set per service)
	Filter   Filter
	// Concurrency is the gateway's worker VMs. Defaults to 2.
	Concurrency int
}

// Front is one design: services behind a gateway.
type Front struct {
	Name    string
	Fleet   *services.Fleet
	Gateway *harness.Gateway
	Config  string // the bootstrap file
}

// StartFront starts a fleet and a gateway in front of it, with its own
// bootstrap. Backend.Close stops it.
func (b *Backend) StartFront(ctx context.Context, o FrontOptions) (f *Front, err error) {
	if o.Services == nil {
		o.Services = DefaultServices
	}
	if o.Concurrency == 0 {
		o.Concurrency = 2
	}
	conf, err := bootstrap(b.envoyYAML, o.Services, o.Filter)
	if err != nil {
		return nil, fmt.Errorf("front %s: %w", o.Name, err)
	}
	started := &Front{Name: o.Name, Config: filepath.Join(b.Dir, "envoy-"+o.Name+".yaml")}
	f = started
	if err := os.WriteFile(f.Config, conf, 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			started.close() // f is nil by then
		}
	}()
	if f.Fleet, err = services.StartFleet(o.Services, o.Fleet); err != nil {
		return nil, fmt.Errorf("front %s: %w", o.Name, err)
	}
	clusters := f.Fleet.Clusters()
	clusters["ratelimit_sidecar"] = b.SidecarAddr
	f.Gateway, err = harness.StartGateway(ctx, b.Bin, harness.GatewayConfig{
		Config: f.Config, Clusters: clusters, Dir: b.Dir, Concurrency: o.Concurrency,
	})
	if err != nil {
		return nil, fmt.Errorf("front %s: %w", o.Name, err)
	}
	b.fronts = append(b.fronts, f)
	return f, nil
}

// shippedEnvoyYAML is envoy/envoy.yaml of the repository the bench runs in.
func shippedEnvoyYAML() (string, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(root, "envoy", "envoy.yaml")
	if _, err := os.Stat(path); err != nil {
		return "", err
	}
	return path, nil
}

// bootstrap renders a front's bootstrap: the Envoy bootstrap at src with
// one route and one cluster per service (/NAME → NAME) in place of its
// own, its sidecar cluster, and its filter configuration changed by f.
// Addresses are placeholders: StartGateway writes the gateway's own
// bootstrap from this one with the fleet's addresses.
func bootstrap(src string, services []string, f Filter) ([]byte, error) {
	b, err := harness.ReadBootstrap(src)
	if err != nil {
		return nil, err
	}
	if err := b.RouteServices(services); err != nil {
		return nil, err
	}
	o, err := f.overrides()
	if err != nil {
		return nil, err
	}
	if err := b.MergeFilterConfig(o); err != nil {
		return nil, err
	}
	return b.Marshal()
}

func (f *Front) close() error {
	var errs []error
	if f.Gateway != nil {
		errs = append(errs, f.Gateway.Stop(10*time.Second))
	}
	if f.Fleet != nil {
		errs = append(errs, f.Fleet.Close())
	}
	return errors.Join(errs...)
}

// Counters returns the filter's wasmcustom.edgelimit.* counters from the
// gateway's admin /stats, without the prefix.
func (f *Front) Counters() (map[string]int64, error) {
	st, err := f.Gateway.Stats()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	const prefix = "wasmcustom.edgelimit."
	for k, v := range st {
		if len(k) > len(prefix) && k[:len(prefix)] == prefix {
			out[k[len(prefix):]] = v
		}
	}
	return out, nil
}

// FailedOpen sums the filter's failed_open counters.
func FailedOpen(c map[string]int64) int64 {
	var n int64
	for k, v := range c {
		if len(k) > len("requests.failed_open.") && k[:len("requests.failed_open.")] == "requests.failed_open." {
			n += v
		}
	}
	return n
}

// SidecarMetrics returns the sidecar's /metrics samples, keyed by the
// series as written (name and labels), e.g.
// `sidecar_decisions_total{result="allowed"}` (testkit.ParseMetrics).
func (b *Backend) SidecarMetrics() (map[string]float64, error) {
	return testkit.GetMetrics("http://" + b.SidecarAddr + "/metrics")
}

// Metric names of the sidecar's decisions.
const (
	SidecarAllowed = `sidecar_decisions_total{result="allowed"}`
	SidecarDenied  = `sidecar_decisions_total{result="denied"}`
)
