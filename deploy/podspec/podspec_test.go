package podspec

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// fatal records a lookup's failure and stops it, as testing.T's Fatalf
// stops the test's goroutine.
type fatal struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(stopped{})
}

// fails runs lookup against a recorder and returns what it failed with,
// or "" when it found what it looked for.
func fails(lookup func(t testing.TB)) (msg string) {
	f := &fatal{}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopped); !ok {
				panic(r)
			}
			msg = f.msg
		}
	}()
	lookup(f)
	return ""
}

func TestLookups(t *testing.T) {
	pod := &corev1.PodSpec{
		Containers: []corev1.Container{
			{Name: "envoy"},
			{
				Name:         "sidecar",
				Args:         []string{"-listen", "127.0.0.1:8081", "-plans"},
				Env:          []corev1.EnvVar{{Name: "SIDECAR_REDIS", Value: "redis://r:6379"}},
				Ports:        []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}},
				VolumeMounts: []corev1.VolumeMount{{Name: "plans", MountPath: "/etc/edgelimit"}},
			},
		},
		Volumes: []corev1.Volume{{Name: "plans"}},
	}
	c := Container(t, pod, "sidecar")
	if c != &pod.Containers[1] {
		t.Fatalf("Container: got %p, want the pod's own %p", c, &pod.Containers[1])
	}
	if v := Volume(t, pod, "plans"); v != &pod.Volumes[0] {
		t.Fatalf("Volume: got %p, want the pod's own %p", v, &pod.Volumes[0])
	}
	if m := Mount(t, c, "plans"); m.MountPath != "/etc/edgelimit" {
		t.Errorf("Mount: %+v", m)
	}
	if a := Arg(t, c, "-listen"); a != "127.0.0.1:8081" {
		t.Errorf("Arg: %q", a)
	}
	if e := Env(t, c, "SIDECAR_REDIS"); e.Value != "redis://r:6379" {
		t.Errorf("Env: %+v", e)
	}
	if p := Port(t, c, intstr.FromString("metrics")); p != 9090 {
		t.Errorf("Port by name: %d", p)
	}
	if p := Port(t, c, intstr.FromInt32(8081)); p != 8081 {
		t.Errorf("Port by number: %d", p)
	}

	for _, tc := range []struct {
		lookup func(t testing.TB)
		want   string
	}{
		{func(t testing.TB) { Container(t, pod, "redis") }, "no container redis"},
		{func(t testing.TB) { Volume(t, pod, "wasm") }, "no volume wasm"},
		{func(t testing.TB) { Mount(t, c, "wasm") }, "sidecar: no mount of wasm"},
		{func(t testing.TB) { Arg(t, c, "-redis") }, "sidecar: no -redis argument"},
		// A flag at the end has no value to give.
		{func(t testing.TB) { Arg(t, c, "-plans") }, "sidecar: no -plans argument"},
		{func(t testing.TB) { Env(t, c, "GOGC") }, "sidecar: no environment variable GOGC"},
		{func(t testing.TB) { Port(t, c, intstr.FromString("admin")) }, "sidecar: no port named admin"},
	} {
		if got := fails(tc.lookup); !strings.HasPrefix(got, tc.want) {
			t.Errorf("failed with %q, want %q", got, tc.want)
		}
	}
}
