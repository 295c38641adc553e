package stats

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestWritePrometheus(t *testing.T) {
	s := New()
	s.Allowed.Add(3)
	s.Denied.Inc()
	s.Reload(true)
	s.Reload(false)
	s.Reload(false)
	s.ObserveBatch(5)
	s.Latency.Update(0.0012)
	var b bytes.Buffer
	s.WritePrometheus(&b)
	out := b.String()
	for _, want := range []string{
		`sidecar_decisions_total{result="allowed"} 3`,
		`sidecar_decisions_total{result="denied"} 1`,
		`sidecar_decisions_total{result="error"} 0`,
		`sidecar_plans_reloads_total{result="ok"} 1`,
		`sidecar_plans_reloads_total{result="error"} 2`,
		"sidecar_plans_last_reload_successful 0\n", // the last one was refused
		`sidecar_pipeline_batch_size_bucket{le="4"} 0`,
		`sidecar_pipeline_batch_size_bucket{le="8"} 1`,
		`sidecar_decision_duration_seconds_bucket{le="0.001"} 0`,
		`sidecar_decision_duration_seconds_bucket{le="0.0015"} 1`,
		`sidecar_decision_duration_seconds_count 1`,
		`# TYPE sidecar_decisions_total counter`,
		`# TYPE sidecar_decision_duration_seconds histogram`,
		`go_goroutines `,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if got := s.PlansLoadedAt(); time.Since(got) > time.Minute {
		t.Errorf("PlansLoadedAt after an ok reload = %v, want about now", got)
	}
	// Two Stats are independent.
	if other := New(); other.Allowed.Get() != 0 {
		t.Errorf("a new Stats shares counters")
	}
}

func TestBuildInfoAndLoadTime(t *testing.T) {
	s := New()
	var b bytes.Buffer
	s.WritePrometheus(&b)
	for _, want := range []string{
		fmt.Sprintf(`sidecar_build_info{version=%q,goversion=%q} 1`+"\n", BuildVersion(), runtime.Version()),
		"sidecar_plans_last_reload_success_timestamp_seconds 0\n",
		"sidecar_plans_last_reload_successful 1\n",
		"# TYPE sidecar_build_info gauge",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
	s.PlansLoaded(time.Unix(1700000000, 500_000_000))
	b.Reset()
	s.WritePrometheus(&b)
	if want := "sidecar_plans_last_reload_success_timestamp_seconds 1.7000000005e+09\n"; !strings.Contains(b.String(), want) {
		t.Errorf("missing %q in:\n%s", want, b.String())
	}
	// A failed reload leaves the time of the plans in force alone.
	s.Reload(false)
	if got := s.PlansLoadedAt(); !got.Equal(time.Unix(1700000000, 500_000_000)) {
		t.Errorf("PlansLoadedAt after a failed reload = %v", got)
	}
}
