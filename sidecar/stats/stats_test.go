package stats

import (
	"bytes"
	"strings"
	"testing"
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
	// Two Stats are independent.
	if other := New(); other.Allowed.Get() != 0 {
		t.Errorf("a new Stats shares counters")
	}
}
