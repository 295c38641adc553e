// Package chartrender renders the Helm chart as `helm install --dry-run`
// does client-only, through the pieces of Helm that command runs. The
// chart's tests (deploy/charttest) decode what it renders; the alert
// rules' test (deploy/alerttest) evaluates the PrometheusRule's.
package chartrender

import (
	"errors"
	"fmt"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
)

// Release and Namespace are the release the chart is rendered as.
const (
	Release   = "edge"
	Namespace = "gateway"
)

// ErrChart marks a failure of the chart itself (it does not load, it needs
// another Kubernetes, it has hooks), not of the values given.
var ErrChart = errors.New("chart")

// Render renders the chart in dir with vals (release Release in Namespace,
// Kubernetes 1.33): the values coalesced and checked against
// values.schema.json, the templates rendered, NOTES.txt set aside, the
// manifests sorted into install order. Helm's install action would do the
// same and also compile Kubernetes' whole client, which on a fresh machine
// took make test over two minutes more. It returns the manifest as
// `helm template` prints it.
func Render(dir string, vals map[string]any) (string, error) {
	return RenderFor(dir, vals, "1", "33")
}

// RenderFor renders as Render does, for Kubernetes major.minor.0.
func RenderFor(dir string, vals map[string]any, major, minor string) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("%w: load: %v", ErrChart, err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v" + major + "." + minor + ".0", Major: major, Minor: minor}
	if v := ch.Metadata.KubeVersion; v != "" && !chartutil.IsCompatibleRange(v, caps.KubeVersion.String()) {
		return "", fmt.Errorf("%w: it requires Kubernetes %s, not %s", ErrChart, v, caps.KubeVersion)
	}
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return "", err
	}
	values, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: Release, Namespace: Namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return "", err
	}
	files, err := (&engine.Engine{}).Render(ch, values)
	if err != nil {
		return "", err
	}
	for name := range files {
		if strings.HasSuffix(name, "/NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", err
	}
	if len(hooks) != 0 {
		return "", fmt.Errorf("%w: %d hooks; the tests read only the release's manifest", ErrChart, len(hooks))
	}
	var manifest strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&manifest, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return manifest.String(), nil
}
