// Package podspec finds the parts of a Kubernetes pod by name, for the
// tests of deploy/'s manifests (deploy/charttest, deploy/meshtest): each
// lookup fails the test, naming what is missing, instead of returning
// nothing.
package podspec

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Container is pod's container called name.
func Container(t testing.TB, pod *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	return named(t, pod.Containers, name, func(c *corev1.Container) string { return c.Name }, "no container")
}

// Volume is pod's volume called name.
func Volume(t testing.TB, pod *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	return named(t, pod.Volumes, name, func(v *corev1.Volume) string { return v.Name }, "no volume")
}

// Mount is c's mount of the volume called volume.
func Mount(t testing.TB, c *corev1.Container, volume string) corev1.VolumeMount {
	t.Helper()
	return *named(t, c.VolumeMounts, volume, func(m *corev1.VolumeMount) string { return m.Name }, c.Name+": no mount of")
}

// Arg is the argument that follows flag in c's args.
func Arg(t testing.TB, c *corev1.Container, flag string) string {
	t.Helper()
	for i, a := range c.Args {
		if a == flag && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
	}
	t.Fatalf("%s: no %s argument in %q", c.Name, flag, c.Args)
	return ""
}

// Env is c's environment variable called name.
func Env(t testing.TB, c *corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	return *named(t, c.Env, name, func(e *corev1.EnvVar) string { return e.Name }, c.Name+": no environment variable")
}

// Port is the port number p stands for in c: p itself when it is a
// number, else the number of c's port of that name.
func Port(t testing.TB, c *corev1.Container, p intstr.IntOrString) int {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	return int(named(t, c.Ports, p.StrVal, func(cp *corev1.ContainerPort) string { return cp.Name }, c.Name+": no port named").ContainerPort)
}

// named is the element of s that nameOf calls name, in s's own array. When
// there is none it fails the test: missing, then the name.
func named[T any](t testing.TB, s []T, name string, nameOf func(*T) string, missing string) *T {
	t.Helper()
	for i := range s {
		if nameOf(&s[i]) == name {
			return &s[i]
		}
	}
	t.Fatalf("%s %s", missing, name)
	return nil
}
