package charttest

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/deploy/podspec"
)

// binDir is where `make build` puts the binaries (EDGELIMIT_BIN_DIR, which
// the Makefile exports, else the repository's build/).
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("EDGELIMIT_BIN_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "build")
	}
	for _, f := range []string{"sidecar", "gateway", "filter.wasm"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%v: run `make build` in the repository root (or set EDGELIMIT_BIN_DIR)", err)
		}
	}
	return dir
}

// TestRenderedPodOnTheBinaries: what the chart renders is what the built
// binaries accept. The sidecar container's arguments and environment (the
// chart's Secret's values resolved as the kubelet would, the plans
// ConfigMap written where -plans reads it) go through `build/sidecar
// -check`, which refuses an unknown flag or variable and a bad value or
// plans file as the pod would at start; the bootstrap in the Secret goes
// through `build/gateway -check`, which loads it as Envoy's configuration
// and configures the filter with its JSON. With the defaults, and with the
// values an operator changes most.
func TestRenderedPodOnTheBinaries(t *testing.T) {
	bin := binDir(t)
	for _, tt := range []struct {
		name string
		vals map[string]any
	}{
		{"defaults", nil},
		{"dual stack", values("envoy.ipFamily", "DualStack")},
		{"operator values", values(
			"filter.on_failure", "local", "filter.region", "eu-west-1", "filter.mode", "shadow",
			"filter.canary_clients", []any{rawKeys[0]},
			"filter.costs", []any{map[string]any{"method": "POST", "path_prefix": "/orders", "cost": 5}, map[string]any{"method": "DELETE", "cost": 2}},
			"redis.url", "rediss+sentinel://s1:26379,s2:26379/mymaster/0",
			"secrets.keySalt", "pepper", "secrets.redisPassword", "hunter2", "plans.clients", map[string]any{},
			"sidecar.redisTimeout", "3500us", "sidecar.logLevel", "warn", "sidecar.port", 18081, "sidecar.adminPort", 18082,
		)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := render(t, tt.vals)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()

			// The sidecar, as the kubelet starts it, with -check.
			sidecar := podspec.Container(t, r.pod(), "sidecar")
			mounts := map[string]string{} // mount path -> local directory
			for _, m := range sidecar.VolumeMounts {
				v := podspec.Volume(t, r.pod(), m.Name)
				if v.ConfigMap == nil {
					t.Fatalf("sidecar mount %s: volume %s is not a ConfigMap", m.MountPath, m.Name)
				}
				cm := r.configMaps[v.ConfigMap.Name]
				if cm == nil {
					t.Fatalf("volume %s: no ConfigMap %s rendered", m.Name, v.ConfigMap.Name)
				}
				local := filepath.Join(dir, m.Name)
				if err := os.MkdirAll(local, 0o700); err != nil {
					t.Fatal(err)
				}
				for k, data := range cm.Data {
					if err := os.WriteFile(filepath.Join(local, k), []byte(data), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				mounts[m.MountPath] = local
			}
			args := slices.Clone(sidecar.Args)
			for i, a := range args {
				for mp, local := range mounts {
					if rest, ok := strings.CutPrefix(a, mp+"/"); ok {
						args[i] = filepath.Join(local, rest)
					}
				}
			}
			var env []string
			for _, e := range os.Environ() {
				if !strings.HasPrefix(e, "SIDECAR_") {
					env = append(env, e)
				}
			}
			for _, e := range sidecar.Env {
				switch {
				case e.ValueFrom == nil:
					env = append(env, e.Name+"="+e.Value)
				case e.ValueFrom.SecretKeyRef != nil:
					ref := e.ValueFrom.SecretKeyRef
					s := r.secrets[ref.Name]
					if s == nil {
						if ref.Optional != nil && *ref.Optional {
							continue
						}
						t.Fatalf("%s: no Secret %s rendered", e.Name, ref.Name)
					}
					if v, ok := s.Data[ref.Key]; ok {
						env = append(env, e.Name+"="+string(v))
					} else if ref.Optional == nil || !*ref.Optional {
						t.Fatalf("%s: Secret %s has no %s (%v)", e.Name, ref.Name, ref.Key, slices.Sorted(maps.Keys(s.Data)))
					}
				default:
					t.Fatalf("%s: a source the test does not resolve: %+v", e.Name, e.ValueFrom)
				}
			}
			cmd := exec.Command(filepath.Join(bin, "sidecar"), append(args, "-check")...)
			cmd.Env = env
			if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "ok: ") {
				t.Errorf("build/sidecar %s -check: %v\n%s", strings.Join(args, " "), err, out)
			}

			// The bootstrap, loaded as Envoy's configuration, the filter
			// configured with its JSON (the module from the build: the pod's
			// is the same file at the bootstrap's path).
			conf := filepath.Join(dir, "envoy.yaml")
			if err := os.WriteFile(conf, []byte(r.secrets[bootstrapSecret].StringData["envoy.yaml"]), 0o600); err != nil {
				t.Fatal(err)
			}
			gw := exec.Command(filepath.Join(bin, "gateway"), "-check", "-config", conf, "-wasm", filepath.Join(bin, "filter.wasm"))
			if out, err := gw.CombinedOutput(); err != nil || !strings.Contains(string(out), "configuration OK") {
				t.Errorf("build/gateway -check on the bootstrap: %v\n%s", err, out)
			}
		})
	}
}
