package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// workflow is the part of .github/workflows/envoy.yml the test reads.
type workflow struct {
	Jobs map[string]struct {
		Strategy struct {
			Matrix struct {
				Envoy []string `json:"envoy"`
			} `json:"matrix"`
		} `json:"strategy"`
		Steps []struct {
			Uses string            `json:"uses"`
			With map[string]string `json:"with"`
			Run  string            `json:"run"`
		} `json:"steps"`
	} `json:"jobs"`
}

// The Envoy workflow cannot run on this machine (no Docker daemon, no
// Envoy); what can be checked here is that it says what the project
// says: the oldest supported release (README, MinEnvoy) and the one
// deploy/compose pins, by exact tag; Go from go.mod; the module built
// before validation; make test-envoy on the image's own binary.
func TestEnvoyWorkflow(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	read := func(rel string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var wf workflow
	if err := yaml.Unmarshal(read(".github/workflows/envoy.yml"), &wf); err != nil {
		t.Fatal(err)
	}

	minimum := fmt.Sprintf("%d.%d", MinEnvoy[0], MinEnvoy[1])
	if !strings.Contains(string(read("README.md")), "**Envoy "+minimum+" or newer") {
		t.Errorf("README.md does not say Envoy %s is the oldest supported release (harness.MinEnvoy)", minimum)
	}
	pinned := regexp.MustCompile(`image: envoyproxy/envoy:(v[0-9.]+)`).FindSubmatch(read("deploy/compose/compose.yaml"))
	if pinned == nil {
		t.Fatal("deploy/compose/compose.yaml pins no envoyproxy/envoy image")
	}
	tag := regexp.MustCompile(`^v([0-9]+)\.([0-9]+)\.[0-9]+$`)

	for _, name := range []string{"validate", "test-envoy"} {
		job, ok := wf.Jobs[name]
		if !ok {
			t.Errorf("no job %s", name)
			continue
		}
		envoys := job.Strategy.Matrix.Envoy
		var oldest bool
		for _, v := range envoys {
			m := tag.FindStringSubmatch(v)
			if m == nil {
				t.Errorf("%s: Envoy %q is not an exact release tag (vX.Y.Z)", name, v)
				continue
			}
			oldest = oldest || m[1]+"."+m[2] == minimum
		}
		if !oldest || !slices.Contains(envoys, string(pinned[1])) || len(envoys) != 2 {
			t.Errorf("%s: Envoy %v, want a %s.x release and compose's %s", name, envoys, minimum, pinned[1])
		}

		var runs []string
		goFromMod := false
		for _, s := range job.Steps {
			if strings.HasPrefix(s.Uses, "actions/setup-go@") && s.With["go-version-file"] == "go.mod" {
				goFromMod = true
			}
			runs = append(runs, s.Run)
		}
		if !goFromMod {
			t.Errorf("%s: no actions/setup-go step with go-version-file: go.mod", name)
		}
		script := strings.Join(runs, "\n")
		image := "envoyproxy/envoy:${{ matrix.envoy }}"
		var want []string
		switch name {
		case "validate":
			want = []string{"make build/filter.wasm", image, "--mode validate -c envoy/envoy.yaml"}
		case "test-envoy":
			want = []string{"apt-get install", "redis-server", "docker create " + image, "docker cp", `make test-envoy ENVOY_BIN=`}
		}
		at := 0
		for _, w := range want {
			i := strings.Index(script[at:], w)
			if i < 0 {
				t.Errorf("%s: its steps do not run %q (after %q)", name, w, script[:at])
				break
			}
			at += i + len(w)
		}
	}
}
