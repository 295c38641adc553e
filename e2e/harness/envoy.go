package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// EnvoyEnv names the environment variable that points the system tests at
// a real Envoy.
const EnvoyEnv = "ENVOY_BIN"

// MinEnvoy is the oldest Envoy release the filter supports (README, "Which
// Envoy"): the first whose proxy-wasm host provides the WASI imports a
// standard-Go module needs.
var MinEnvoy = [2]int{1, 33}

// Envoy is a real Envoy binary found by FindEnvoy.
type Envoy struct {
	Path    string // absolute
	Version string // as --version reports it, e.g. "1.33.14"; "" if it could not be read
}

// FindEnvoy decides which proxy the system tests run the filter in; it is
// the one place that decides it. ENVOY_BIN set to a path (or a command
// name) is that Envoy; ENVOY_BIN set but empty means none (build/gateway
// stands in); ENVOY_BIN unset means the envoy on the PATH, if there is
// one. It returns a zero Envoy when there is none, and an error when
// ENVOY_BIN names something that does not run, or an Envoy older than
// MinEnvoy.
func FindEnvoy(ctx context.Context) (Envoy, error) {
	name, set := os.LookupEnv(EnvoyEnv)
	switch {
	case set && name == "":
		return Envoy{}, nil
	case !set:
		path, err := exec.LookPath("envoy")
		if err != nil {
			return Envoy{}, nil
		}
		name = path
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return Envoy{}, fmt.Errorf("%s=%q: %w", EnvoyEnv, name, err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return Envoy{}, err
	}
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(vctx, path, "--version").CombinedOutput()
	if err != nil {
		return Envoy{}, fmt.Errorf("%s --version: %v\n%s", path, err, out)
	}
	e := Envoy{Path: path, Version: envoyVersion(out)}
	if e.Version == "" {
		return e, nil
	}
	if old, err := olderThan(e.Version, MinEnvoy); err != nil || old {
		if err == nil {
			err = fmt.Errorf("Envoy %s at %s is older than %d.%d, the oldest release the filter supports", e.Version, path, MinEnvoy[0], MinEnvoy[1])
		}
		return e, err
	}
	return e, nil
}

// versionField is the release in Envoy's --version line, which reads
// "envoy  version: <commit>/1.33.14/Clean/RELEASE/BoringSSL".
var versionField = regexp.MustCompile(`version: [0-9a-f]+/([0-9]+\.[0-9]+\.[0-9]+)[-/]`)

func envoyVersion(out []byte) string {
	if m := versionField.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return ""
}

// olderThan reports whether version ("1.33.14") is older than min (major,
// minor).
func olderThan(version string, min [2]int) (bool, error) {
	parts := strings.Split(version, ".")
	if len(parts) < 2 {
		return false, fmt.Errorf("Envoy version %q: want major.minor.patch", version)
	}
	var v [2]int
	for i := range v {
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return false, fmt.Errorf("Envoy version %q: %w", version, err)
		}
		v[i] = n
	}
	return v[0] < min[0] || (v[0] == min[0] && v[1] < min[1]), nil
}

// VMFailures returns how many of the gateway's wasm VMs have failed (a
// trap, an abort, a Go runtime fatal error). build/gateway counts them in
// its admin stats (wasm.vm.<vm_id>.failed); Envoy has no such counter and
// logs each failure as an error line "Wasm VM failed <reason>", which is
// what is counted for it.
func (g *Gateway) VMFailures() (int64, error) {
	if g.Envoy != "" {
		return int64(strings.Count(g.Output(), "Wasm VM failed")), nil
	}
	stats, err := g.Stats()
	if err != nil {
		return 0, err
	}
	var n int64
	for name, v := range stats {
		if strings.HasPrefix(name, "wasm.vm.") && strings.HasSuffix(name, ".failed") {
			n += v
		}
	}
	return n, nil
}

// errEnvoyReload is Reload's answer for a real Envoy.
var errEnvoyReload = errors.New("Envoy applies a changed static bootstrap by a hot restart (--restart-epoch), which the harness does not drive; Reload is build/gateway's SIGHUP")
