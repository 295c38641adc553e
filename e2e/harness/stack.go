package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
)

// Binaries are the built deliverables an end-to-end run starts.
type Binaries struct {
	Dir     string
	Filter  string // filter.wasm
	Sidecar string
	Gateway string
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

// Build builds the filter, the sidecar and the gateway into dir with the go
// tool (its build cache makes a second call cheap).
func Build(ctx context.Context, dir string) (Binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{
		Dir:     dir,
		Filter:  filepath.Join(dir, "filter.wasm"),
		Sidecar: filepath.Join(dir, "sidecar"),
		Gateway: filepath.Join(dir, "gateway"),
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	steps := []struct {
		env  []string
		args []string
	}{
		{[]string{"GOOS=wasip1", "GOARCH=wasm"}, []string{"build", "-buildmode=c-shared", "-o", b.Filter, "./filter"}},
		{nil, []string{"build", "-o", b.Sidecar, "./sidecar"}},
		{nil, []string{"build", "-o", b.Gateway, "./envoy/gateway"}},
	}
	for _, s := range steps {
		cmd := exec.CommandContext(ctx, goBin, s.args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), s.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("go %s: %v\n%s", strings.Join(s.args, " "), err, out)
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

// GatewayConfig is how StartGateway runs build/gateway.
type GatewayConfig struct {
	Config   string            // envoy.yaml
	Clusters map[string]string // cluster name → host:port
	Wasm     string            // filter.wasm; default the binaries'
	Extra    []string
}

// Gateway is a running build/gateway.
type Gateway struct {
	*Process
	Addr  string // the HTTP listener (the wasm filter's)
	Admin string // the admin listener
	// Listeners are the configuration's other listeners (envoy.yaml's
	// stats), by name.
	Listeners map[string]string
}

// StartGateway starts the gateway with a free port for its listener, each
// of the configuration's other listeners and the admin, and waits until its
// admin /ready answers 200. The configuration's clusters that reach the
// admin (envoy.yaml's envoy_admin) follow it to its port.
func StartGateway(ctx context.Context, b Binaries, c GatewayConfig) (*Gateway, error) {
	cfg, err := envoyconfig.Load(c.Config)
	if err != nil {
		return nil, err
	}
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		admin, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		wasm := c.Wasm
		if wasm == "" {
			wasm = b.Filter
		}
		args := []string{"-config", c.Config, "-listen", addr, "-admin", admin, "-wasm", wasm}
		listeners := map[string]string{}
		for _, l := range cfg.Listeners {
			if listeners[l.Name], err = FreeAddr(); err != nil {
				return nil, err
			}
			args = append(args, "-listener", l.Name+"="+listeners[l.Name])
		}
		for name, hp := range c.Clusters {
			args = append(args, "-cluster", name+"="+hp)
		}
		args = append(args, c.Extra...)
		p, err := StartProcess("gateway", b.Gateway, args...)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = WaitHTTP(wctx, p, "http://"+admin+"/ready", http.StatusOK)
		cancel()
		if err == nil {
			return &Gateway{Process: p, Addr: addr, Admin: admin, Listeners: listeners}, nil
		}
		p.Kill()
		last = err
		if !strings.Contains(p.Output(), "address already in use") {
			break
		}
	}
	return nil, last
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
