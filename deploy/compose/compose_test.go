// Package compose holds compose.yaml to the files it runs: envoy/envoy.yaml
// (read with package envoyconfig, as the gateway reads it) and
// deploy/Dockerfile. Docker is not needed: nothing here starts a container.
package compose

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"sigs.k8s.io/yaml"
)

type composeFile struct {
	Services map[string]service `json:"services"`
}

type service struct {
	Image       string            `json:"image"`
	Restart     string            `json:"restart"`
	Build       *build            `json:"build"`
	NetworkMode string            `json:"network_mode"`
	WorkingDir  string            `json:"working_dir"`
	Command     []string          `json:"command"`
	Ports       []string          `json:"ports"`
	Volumes     []string          `json:"volumes"`
	Environment map[string]string `json:"environment"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
}

type build struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
	Target     string `json:"target"`
}

func load(t *testing.T) (composeFile, *envoyconfig.Config, string) {
	t.Helper()
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconfig.Load("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	return c, cfg, string(dockerfile)
}

// stage returns the text of a Dockerfile stage.
func stage(t *testing.T, dockerfile, name string) string {
	t.Helper()
	i := strings.Index(dockerfile, " AS "+name+"\n")
	if i < 0 {
		t.Fatalf("deploy/Dockerfile has no stage %s", name)
	}
	s := dockerfile[i:]
	if j := strings.Index(s, "\nFROM "); j >= 0 {
		s = s[:j]
	}
	return s
}

func flag(t *testing.T, s service, name string) string {
	t.Helper()
	i := slices.Index(s.Command, name)
	if i < 0 || i+1 == len(s.Command) {
		t.Fatalf("command %q has no %s", s.Command, name)
	}
	return s.Command[i+1]
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The processes listen where envoy.yaml's clusters and listeners say, the
// built targets exist, and the module lands where Envoy loads it.
func TestComposeRunsEnvoyYAML(t *testing.T) {
	c, cfg, dockerfile := load(t)
	for name, s := range c.Services {
		if s.Build == nil {
			continue
		}
		if s.Build.Context != "../.." || s.Build.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("%s: build %+v, want deploy/Dockerfile from the repository root", name, s.Build)
		}
		stage(t, dockerfile, s.Build.Target)
	}
	// The sidecar and the services, in the pod's namespace, on the
	// clusters' endpoints.
	for name, cluster := range map[string]string{"sidecar": "ratelimit_sidecar", "orders": "orders", "billing": "billing"} {
		s := c.Services[name]
		if s.NetworkMode != "service:pod" {
			t.Errorf("%s: network_mode %q, want the pod's namespace", name, s.NetworkMode)
		}
		if got, want := flag(t, s, "-listen"), cfg.Clusters[cluster].Endpoints; !slices.Equal([]string{got}, want) {
			t.Errorf("%s listens on %s, envoy.yaml's cluster %s is %v", name, got, cluster, want)
		}
	}
	// The pod publishes the edge listener and the stats listener.
	pod := c.Services["pod"]
	for _, addr := range []string{cfg.Listener, cfg.Listeners[0].Address} {
		p := port(t, addr)
		if !slices.ContainsFunc(pod.Ports, func(s string) bool { return strings.HasSuffix(s, ":"+p+":"+p) || s == p+":"+p }) {
			t.Errorf("pod publishes %v, not envoy.yaml's %s", pod.Ports, addr)
		}
	}
	if slices.ContainsFunc(pod.Ports, func(s string) bool { return strings.Contains(s, port(t, cfg.Admin)) }) {
		t.Errorf("pod publishes %v, the admin's port among them", pod.Ports)
	}
	// filter.wasm: the filter target copies it into the volume Envoy
	// mounts as build/ in its working directory.
	envoy := c.Services["envoy"]
	copyCmd := regexp.MustCompile(`(?m)^CMD \["cp", "\S+", "(\S+)"\]$`).FindStringSubmatch(stage(t, dockerfile, "filter"))
	if copyCmd == nil {
		t.Fatal("the filter stage has no cp command")
	}
	volumeAt := func(s service, vol string) string {
		for _, v := range s.Volumes {
			if name, rest, ok := strings.Cut(v, ":"); ok && name == vol {
				at, _, _ := strings.Cut(rest, ":")
				return at
			}
		}
		t.Fatalf("no volume %s in %v", vol, s.Volumes)
		return ""
	}
	copied := path.Join(volumeAt(envoy, "wasm"), path.Base(copyCmd[1]))
	if path.Dir(copyCmd[1]) != volumeAt(c.Services["filter"], "wasm") {
		t.Errorf("the filter target copies to %s, its service mounts the volume on %s", copyCmd[1], volumeAt(c.Services["filter"], "wasm"))
	}
	if loaded := path.Join(envoy.WorkingDir, cfg.Wasm.Filename); loaded != copied {
		t.Errorf("Envoy loads %s, the module is at %s", loaded, copied)
	}
	if got := flag(t, envoy, "-c"); path.Join(envoy.WorkingDir, got) != volumeAt(envoy, "../../envoy/envoy.yaml") {
		t.Errorf("envoy -c %s is not the mounted envoy.yaml", got)
	}
	// Envoy's timers on libevent's precise clock, which libevent turns on
	// when the variable is there, whatever its value (envoy/README.md,
	// "The callout timeout's clock").
	if _, ok := envoy.Environment["EVENT_PRECISE_TIMER"]; !ok {
		t.Errorf("envoy's environment %v has no EVENT_PRECISE_TIMER", envoy.Environment)
	}
}

// Envoy's workers are set, as the chart sets them, not left to Envoy's
// default of one per hardware thread of the Docker host, each with its own
// wasm VM and its own warm connections to the sidecar: they must all fit
// in the callout cluster's connection limit.
func TestComposeSetsEnvoyWorkers(t *testing.T) {
	c, cfg, _ := load(t)
	workers, err := strconv.Atoi(flag(t, c.Services["envoy"], "--concurrency"))
	if err != nil || workers < 1 {
		t.Fatalf("envoy --concurrency %q: want a number of workers", flag(t, c.Services["envoy"], "--concurrency"))
	}
	filter, err := limiter.Parse([]byte(cfg.Wasm.Configuration))
	if err != nil {
		t.Fatal(err)
	}
	sidecar, ok := cfg.Clusters[filter.SidecarCluster]
	if !ok {
		t.Fatalf("envoy.yaml has no cluster %s", filter.SidecarCluster)
	}
	if warm := workers * int(filter.WarmConnections); warm > sidecar.Limits.MaxConnections {
		t.Errorf("%d workers x %d warm connections = %d, past %s's max_connections %d",
			workers, filter.WarmConnections, warm, sidecar.Name, sidecar.Limits.MaxConnections)
	}
}

// Every service that keeps running has a health check on what it serves,
// and Envoy starts after the sidecar and the services are healthy.
func TestComposeHealthchecks(t *testing.T) {
	c, cfg, dockerfile := load(t)
	entrypoint := func(target string) string {
		m := regexp.MustCompile(`(?m)^ENTRYPOINT \["(\S+)"\]$`).FindStringSubmatch(stage(t, dockerfile, target))
		if m == nil {
			t.Fatalf("stage %s has no ENTRYPOINT", target)
		}
		return m[1]
	}
	// The distroless images probe themselves: `<binary> healthcheck URL`.
	for name, listen := range map[string]string{
		"sidecar": flag(t, c.Services["sidecar"], "-admin-listen"),
		"orders":  flag(t, c.Services["orders"], "-listen"),
		"billing": flag(t, c.Services["billing"], "-listen"),
	} {
		s := c.Services[name]
		if s.Healthcheck == nil {
			t.Errorf("%s: no health check", name)
			continue
		}
		test := s.Healthcheck.Test
		if len(test) != 4 || test[0] != "CMD" || test[1] != entrypoint(s.Build.Target) || test[2] != "healthcheck" {
			t.Errorf("%s: health check %q, want CMD %s healthcheck URL", name, test, entrypoint(s.Build.Target))
			continue
		}
		u, err := url.Parse(test[3])
		if err != nil || u.Host != listen {
			t.Errorf("%s: health check on %s, the service listens on %s", name, test[3], listen)
		}
		if name == "sidecar" && u.Path != "/readyz" {
			t.Errorf("sidecar health check on %s, want /readyz (Redis reachable, script loaded)", u.Path)
		}
	}
	if h := c.Services["redis"].Healthcheck; h == nil || !strings.Contains(strings.Join(h.Test, " "), "redis-cli ping") {
		t.Errorf("redis: health check %+v, want redis-cli ping", h)
	}
	// Envoy's: /ready on the stats listener, which passes it to the admin.
	envoy := c.Services["envoy"]
	if envoy.Healthcheck == nil {
		t.Fatal("envoy: no health check")
	}
	script := envoy.Healthcheck.Test[len(envoy.Healthcheck.Test)-1]
	stats := cfg.Listeners[0]
	if !strings.Contains(script, "/dev/tcp/127.0.0.1/"+port(t, stats.Address)+" ") || !strings.Contains(script, "GET /ready ") {
		t.Errorf("envoy health check %q: want GET /ready on the stats listener's port %s", script, port(t, stats.Address))
	}
	if rt := matchRoute(stats.Routes, "/ready"); rt.Cluster != "envoy_admin" {
		t.Errorf("the stats listener sends /ready to %+v, want envoy_admin", rt)
	}

	for svc, deps := range map[string]map[string]string{
		"envoy":   {"pod": "service_started", "filter": "service_completed_successfully", "sidecar": "service_healthy", "orders": "service_healthy", "billing": "service_healthy"},
		"sidecar": {"pod": "service_started", "redis": "service_healthy"},
		"orders":  {"pod": "service_started"},
		"billing": {"pod": "service_started"},
	} {
		got := map[string]string{}
		for name, d := range c.Services[svc].DependsOn {
			got[name] = d.Condition
		}
		if fmt.Sprint(got) != fmt.Sprint(deps) {
			t.Errorf("%s depends on %v, want %v", svc, got, deps)
		}
	}
}

// Docker starts again every service that keeps running when it exits (a
// crash, an OOM kill, the daemon's restart, the host's reboot), unless an
// operator stopped it; Compose's default is never. The one-shot filter
// copy is the exception: it exits when done, and Envoy waits for that.
func TestComposeRestartsServices(t *testing.T) {
	c, _, _ := load(t)
	for name, s := range c.Services {
		want := "unless-stopped"
		if name == "filter" {
			want = ""
		}
		if s.Restart != want {
			t.Errorf("%s: restart %q, want %q", name, s.Restart, want)
		}
	}
}

func matchRoute(routes []envoyconfig.Route, p string) envoyconfig.Route {
	for _, r := range routes {
		if r.Matches(p) {
			return r
		}
	}
	return envoyconfig.Route{}
}

// Envoy's health check script, run by bash as Docker runs it, against a
// server in the test's place: healthy on a 200 from /ready, not on a 503
// (Envoy draining) or when nothing listens.
func TestEnvoyHealthcheckScript(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here to run the script with")
	}
	c, cfg, _ := load(t)
	test := c.Services["envoy"].Healthcheck.Test
	if len(test) != 4 || test[0] != "CMD" || test[1] != "bash" || test[2] != "-c" {
		t.Fatalf("envoy health check %q, want CMD bash -c SCRIPT", test)
	}
	var (
		mu     sync.Mutex
		status = http.StatusOK
		paths  []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		w.WriteHeader(status)
	}))
	defer srv.Close()
	run := func(addr string) error {
		script := strings.Replace(test[3], "/dev/tcp/127.0.0.1/"+port(t, cfg.Listeners[0].Address), "/dev/tcp/127.0.0.1/"+port(t, addr), 1)
		return exec.Command(bash, "-c", script).Run()
	}
	if err := run(srv.Listener.Addr().String()); err != nil {
		t.Errorf("200 from /ready: %v, want healthy", err)
	}
	mu.Lock()
	status = http.StatusServiceUnavailable
	mu.Unlock()
	if err := run(srv.Listener.Addr().String()); err == nil {
		t.Error("503 from /ready: healthy, want not")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(paths, []string{"GET /ready", "GET /ready"}) {
		t.Errorf("requests %v, want GET /ready twice", paths)
	}
	if err := run(testkit.RefusedAddr(t)); err == nil {
		t.Error("nothing listening: healthy, want not")
	}
}
