package charttest

import (
	"testing"

	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// TestPodSecurityRestricted: the pod is admitted to a namespace that
// enforces the Pod Security Standards' restricted profile (the level a
// gateway's namespace is likely to run at), with either source of the
// module, as the Kubernetes API server's own admission checks decide it;
// every container's root filesystem is read-only and no service account
// token is mounted (restricted asks for neither, the chart does).
func TestPodSecurityRestricted(t *testing.T) {
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, source := range []string{"initContainer", "imageVolume"} {
		t.Run(source, func(t *testing.T) {
			r, err := render(t, values("wasm.source", source))
			if err != nil {
				t.Fatal(err)
			}
			tmpl := r.deployment.Spec.Template
			lv := api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}
			for _, res := range evaluator.EvaluatePod(lv, &tmpl.ObjectMeta, &tmpl.Spec) {
				if !res.Allowed {
					t.Errorf("restricted: %s: %s", res.ForbiddenReason, res.ForbiddenDetail)
				}
			}
			// Neither binary calls the Kubernetes API: no token is mounted.
			if a := tmpl.Spec.AutomountServiceAccountToken; a == nil || *a {
				t.Errorf("automountServiceAccountToken %v: the pod gets a service account token it has no use for", a)
			}
			for _, c := range append(tmpl.Spec.InitContainers, tmpl.Spec.Containers...) {
				if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("container %s: root filesystem not read-only", c.Name)
				}
			}
		})
	}
}
