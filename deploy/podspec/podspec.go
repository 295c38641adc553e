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
	c := named(pod.Containers, name, func(c *corev1.Container) string { return c.Name })
	if c == nil {
		t.Fatalf("no container %s", name)
	}
	return c
}

// Volume is pod's volume called name.
func Volume(t testing.TB, pod *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	v := named(pod.Volumes, name, func(v *corev1.Volume) string { return v.Name })
	if v == nil {
		t.Fatalf("no volume %s", name)
	}
	return v
}

// Mount is c's mount of the volume called volume.
func Mount(t testing.TB, c *corev1.Container, volume string) corev1.VolumeMount {
	t.Helper()
	m := named(c.VolumeMounts, volume, func(m *corev1.VolumeMount) string { return m.Name })
	if m == nil {
		t.Fatalf("%s: no mount of %s", c.Name, volume)
		return corev1.VolumeMount{}
	}
	return *m
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
	e := named(c.Env, name, func(e *corev1.EnvVar) string { return e.Name })
	if e == nil {
		t.Fatalf("%s: no environment variable %s", c.Name, name)
		return corev1.EnvVar{}
	}
	return *e
}

// Port is the port number p stands for in c: p itself when it is a
// number, else the number of c's port of that name.
func Port(t testing.TB, c *corev1.Container, p intstr.IntOrString) int {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	if cp := named(c.Ports, p.StrVal, func(cp *corev1.ContainerPort) string { return cp.Name }); cp != nil {
		return int(cp.ContainerPort)
	}
	t.Fatalf("%s: no port named %s", c.Name, p.StrVal)
	return 0
}

// named is the element of s that nameOf calls name, in s's own array, or
// nil.
func named[T any](s []T, name string, nameOf func(*T) string) *T {
	for i := range s {
		if nameOf(&s[i]) == name {
			return &s[i]
		}
	}
	return nil
}
