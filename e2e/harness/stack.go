package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/internal/gotool"
)

// Binaries are the built deliverables an end-to-end run starts, and the
// proxy that runs the filter.
type Binaries struct {
	Dir     string
	Filter  string // filter.wasm
	Sidecar string
	Gateway string // build/gateway, the stand-in for Envoy
	// Envoy, when set, is a real Envoy that StartGateway runs in place of
	// Gateway (see FindEnvoy). Build and Locate leave it empty.
	Envoy string
}

// RepoRoot finds the module root by walking up from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Build builds the filter, the sidecar and the gateway into dir as the
// Makefile does (the filter through gotool.BuildWasm, wasm-opt included);
// the go tool's build cache and wasm-opt's make a second call cheap.
func Build(ctx context.Context, dir string) (Binaries, error) {
	b := Binaries{
		Dir:     dir,
		Filter:  filepath.Join(dir, "filter.wasm"),
		Sidecar: filepath.Join(dir, "sidecar"),
		Gateway: filepath.Join(dir, "gateway"),
	}
	root, err := RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	if err := gotool.BuildWasm(ctx, root, "./filter", b.Filter); err != nil {
		return Binaries{}, err
	}
	for _, s := range [][2]string{{b.Sidecar, "./sidecar"}, {b.Gateway, "./envoy/gateway"}} {
		if err := gotool.Run(ctx, root, nil, "build", "-trimpath", "-o", s[0], s[1]); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// Locate returns the binaries in dir if all exist (as `make build` leaves
// them), else builds them into dir.
func Locate(ctx context.Context, dir string) (Binaries, error) {
	b := Binaries{
		Dir:     dir,
		Filter:  filepath.Join(dir, "filter.wasm"),
		Sidecar: filepath.Join(dir, "sidecar"),
		Gateway: filepath.Join(dir, "gateway"),
	}
	for _, f := range []string{b.Filter, b.Sidecar, b.Gateway} {
		if _, err := os.Stat(f); err != nil {
			return Build(ctx, dir)
		}
	}
	return b, nil
}

// SidecarConfig is how StartSidecar runs build/sidecar.
type SidecarConfig struct {
	Redis string // redis URL
	Plans string // plans file path
	Extra []string
}

// StartSidecar starts the sidecar on a free loopback port and waits until
// /readyz says it can decide.
func StartSidecar(ctx context.Context, b Binaries, c SidecarConfig) (*Process, string, error) {
	return startReady(ctx, "sidecar", func(addr string) []string {
		return append([]string{b.Sidecar, "-listen", addr, "-redis", c.Redis, "-plans", c.Plans}, c.Extra...)
	}, func(addr string) string { return "http://" + addr + "/readyz" })
}

// GatewayConfig is how StartGateway runs a gateway: build/gateway, or
// the real Envoy of Binaries.Envoy.
type GatewayConfig struct {
	Config   string            // the Envoy bootstrap to start from (envoy/envoy.yaml, or a variant of it)
	Clusters map[string]string // cluster name → host:port, its only endpoint
	Wasm     string            // filter.wasm; default the binaries'
	// Dir is where the gateway's own bootstrap is written. When empty,
	// StartGateway makes a temporary directory, removed by Stop or Kill.
	Dir string
	// Concurrency is the proxy's worker threads (VMs), Envoy's
	// --concurrency and build/gateway's -concurrency. Default 2, the
	// stand-in's default, given to Envoy too (whose own default is the
	// machine's core count).
	Concurrency int
	// AccessLog asks for the access log envoy.yaml configures (one line
	// per request on stdout). Envoy writes it whenever the bootstrap has
	// it; build/gateway only with its -access-log flag.
	AccessLog bool
	// Extra are further flags of build/gateway (-poll-oneoff, -cpuprofile,
	// ...). Envoy has none of them: StartGateway refuses them with a real
	// Envoy.
	Extra []string
}

// Gateway is a running gateway: build/gateway or a real Envoy.
type Gateway struct {
	*Process
	Addr      string // the HTTP listener (the wasm filter's)
	Admin     string // the admin listener
	Bootstrap string // the bootstrap file it runs, written by StartGateway
	// Listeners are the configuration's other listeners (envoy.yaml's
	// stats), by name.
	Listeners map[string]string
	// Envoy is the real Envoy binary it runs; "" for build/gateway.
	Envoy  string
	ownDir string // a directory StartGateway made, removed at Stop or Kill
}

// StartGateway writes the gateway's bootstrap (c.Config with every
// listener and the admin on free loopback ports, the clusters that reach
// the admin following it, c.Clusters' endpoints and the module's absolute
// path; see RenderBootstrap), starts the proxy on it and waits until its
// admin /ready answers 200. The proxy is the real Envoy of b.Envoy when
// set, else build/gateway; both take only the file and the number of
// workers, as Envoy's command line gives them.
func StartGateway(ctx context.Context, b Binaries, c GatewayConfig) (*Gateway, error) {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		g, err := LaunchGateway(b, c)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err = WaitHTTP(wctx, g.Process, "http://"+g.Admin+"/ready", http.StatusOK)
		cancel()
		if err == nil {
			return g, nil
		}
		g.Kill()
		last = err
		// The ports were free when picked; another process may have
		// taken one since. Envoy says "Address already in use".
		if !strings.Contains(strings.ToLower(g.Output()), "address already in use") {
			break
		}
	}
	return nil, last
}

// LaunchGateway is StartGateway without the wait: it writes the bootstrap,
// starts the proxy and returns at once, for a test of a proxy that must
// refuse to start.
func LaunchGateway(b Binaries, c GatewayConfig) (*Gateway, error) {
	if b.Envoy != "" && len(c.Extra) > 0 {
		return nil, fmt.Errorf("gateway flags %q are build/gateway's; Envoy (%s) has none of them", c.Extra, b.Envoy)
	}
	if c.Wasm == "" {
		c.Wasm = b.Filter
	}
	cfg, err := envoyconfig.Load(c.Config)
	if err != nil {
		return nil, err
	}
	a := GatewayAddrs{Listeners: map[string]string{}}
	for _, p := range []*string{&a.Listen, &a.Admin} {
		if *p, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	for _, l := range cfg.Listeners {
		if a.Listeners[l.Name], err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	out, err := RenderBootstrap(c, a)
	if err != nil {
		return nil, err
	}
	g := &Gateway{Addr: a.Listen, Admin: a.Admin, Listeners: a.Listeners, Envoy: b.Envoy}
	dir := c.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "edgelimit-gateway-"); err != nil {
			return nil, err
		}
		g.ownDir = dir
	}
	f, err := os.CreateTemp(dir, "envoy-*.yaml")
	if err == nil {
		g.Bootstrap = f.Name()
		_, err = f.Write(out)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		bin, args, env := gatewayCommand(b, c, g.Bootstrap)
		g.Process, err = StartProcessEnv(filepath.Base(bin), env, bin, args...)
	}
	if err != nil {
		g.removeDir()
		return nil, err
	}
	return g, nil
}

// gatewayCommand is the command line of a gateway running the bootstrap
// at file: Envoy's, or the same for build/gateway under its flag names;
// env is what it adds to the environment: for Envoy, libevent's precise
// clock for its timers, as the compose file and the chart run it
// (envoy/README.md, "The callout timeout's clock").
func gatewayCommand(b Binaries, c GatewayConfig, file string) (bin string, args, env []string) {
	n := c.Concurrency
	if n == 0 {
		n = 2
	}
	if b.Envoy != "" {
		// A base id of its own, picked by Envoy, so that Envoys started
		// side by side do not share hot-restart memory; warnings and
		// errors only (the plugin's error lines among them). The access
		// log is the bootstrap's, on stdout.
		return b.Envoy, []string{"-c", file, "--concurrency", strconv.Itoa(n), "--use-dynamic-base-id", "--log-level", "warn"},
			[]string{"EVENT_PRECISE_TIMER=1"}
	}
	args = []string{"-config", file, "-concurrency", strconv.Itoa(n)}
	if c.AccessLog {
		args = append(args, "-access-log")
	}
	return b.Gateway, append(args, c.Extra...), nil
}

// GatewayAddrs are where a gateway's bootstrap puts its sockets.
type GatewayAddrs struct {
	Listen    string            // the listener the wasm filter runs on
	Admin     string            // the admin interface
	Listeners map[string]string // every other listener, by name
}

// RenderBootstrap returns the bootstrap a gateway of c runs: c.Config with
// its listeners and its admin interface at a's addresses, each cluster
// whose endpoint is the file's admin address (envoy.yaml's envoy_admin,
// behind the stats listener) at the new admin address, each of c.Clusters
// with that one endpoint, and the module (c.Wasm) at its absolute path.
// Everything else, the filter's configuration included, is c.Config's.
func RenderBootstrap(c GatewayConfig, a GatewayAddrs) ([]byte, error) {
	cfg, err := envoyconfig.Load(c.Config)
	if err != nil {
		return nil, err
	}
	bs, err := ReadBootstrap(c.Config)
	if err != nil {
		return nil, err
	}
	if err := bs.SetListenerAddress(cfg.ListenerName, a.Listen); err != nil {
		return nil, err
	}
	for _, l := range cfg.Listeners {
		addr, ok := a.Listeners[l.Name]
		if !ok {
			return nil, fmt.Errorf("gateway: no address for listener %q", l.Name)
		}
		if err := bs.SetListenerAddress(l.Name, addr); err != nil {
			return nil, err
		}
	}
	if err := bs.SetAdminAddress(a.Admin); err != nil {
		return nil, err
	}
	for name, cl := range cfg.Clusters {
		if _, set := c.Clusters[name]; !set && cfg.Admin != "" && slices.Equal(cl.Endpoints, []string{cfg.Admin}) {
			if err := bs.SetClusterEndpoint(name, a.Admin); err != nil {
				return nil, err
			}
		}
	}
	names := make([]string, 0, len(c.Clusters))
	for name := range c.Clusters {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := bs.SetClusterEndpoint(name, c.Clusters[name]); err != nil {
			return nil, err
		}
	}
	if c.Wasm == "" {
		return nil, fmt.Errorf("gateway: no module given")
	}
	module, err := filepath.Abs(c.Wasm)
	if err != nil {
		return nil, err
	}
	if err := bs.SetWasmFilename(module); err != nil {
		return nil, err
	}
	return bs.Marshal()
}

// Stop stops the gateway (see Process.Stop) and removes the directory
// StartGateway made for it, if it made one.
func (g *Gateway) Stop(grace time.Duration) error {
	err := g.Process.Stop(grace)
	g.removeDir()
	return err
}

// Kill ends the gateway at once (see Process.Kill) and removes the
// directory StartGateway made for it, if it made one.
func (g *Gateway) Kill() {
	g.Process.Kill()
	g.removeDir()
}

func (g *Gateway) removeDir() {
	if g.ownDir != "" {
		os.RemoveAll(g.ownDir)
	}
}

// Stats returns the gateway's admin /stats as name → value, for the lines
// that have a numeric value.
func (g *Gateway) Stats() (map[string]int64, error) {
	resp, err := http.Get("http://" + g.Admin + "/stats")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	stats := map[string]int64{}
	for _, line := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		var v int64
		if _, err := fmt.Sscan(val, &v); err == nil {
			stats[name] = v
		}
	}
	return stats, nil
}

// startReady starts a server on a free port, retrying with a new port if the
// one picked was taken meanwhile.
func startReady(ctx context.Context, name string, argv func(addr string) []string, readyURL func(addr string) string) (*Process, string, error) {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		addr, err := FreeAddr()
		if err != nil {
			return nil, "", err
		}
		a := argv(addr)
		p, err := StartProcess(name, a[0], a[1:]...)
		if err != nil {
			return nil, "", err
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = WaitHTTP(wctx, p, readyURL(addr), http.StatusOK)
		cancel()
		if err == nil {
			return p, addr, nil
		}
		p.Kill()
		last = err
		if !strings.Contains(p.Output(), "address already in use") {
			break
		}
	}
	return nil, "", last
}
