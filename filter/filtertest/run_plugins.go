package filtertest

import (
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// ---- two plugin configurations in one VM ----

// Envoy keeps a worker's VM across a listener update that changes only the
// plugin's configuration (same vm_id and code) and starts the new
// configuration beside the old one as a second root context: both are live
// until the old listener has drained and its root context is deleted. Each
// stream follows the configuration of its own root context, callout
// answers come back to the root that asked, and the filter defines its
// metrics once per VM (Envoy keeps every id it hands out for the VM's
// life).
func (r runner) twoPlugins(t *testing.T) {
	a := r.host(t, `{"api_key_header": "x-key-a", "costs": [{"path_prefix": "/", "cost": 3}]}`)
	b, ok := a.AddPlugin(`{"api_key_header": "x-key-b", "region": "eu-b", "on_missing_key": "allow"}`)
	if !ok {
		t.Fatalf("second configuration rejected; logs:\n%s", strings.Join(a.Logs(), "\n"))
	}
	if n := len(logged(a, "edgelimit: configured: mode=")); n != 2 {
		t.Errorf("%d start-up lines, want one per configuration: %q", n, a.Logs())
	}
	definedOnce := func() {
		t.Helper()
		for _, name := range limiter.MetricNames() {
			if n := a.MetricDefinitions(name); n != 1 {
				t.Errorf("metric %s defined %d times in the VM, want once", name, n)
			}
		}
	}
	definedOnce()

	// Each stream reads its own plugin's key header and costs.
	sa, ca := waiting(t, a, get("", Header{"x-key-a", "key-a"}))
	if got := header(t, ca.Headers, "x-ratelimit-cost"); got != "3" {
		t.Errorf("first configuration's callout cost %q, want 3", got)
	}
	absent(t, ca.Headers, "x-ratelimit-region")
	sb, cb := waiting(t, b, get("", Header{"x-key-b", "key-b"}))
	if got := header(t, cb.Headers, "x-api-key"); got != "key-b" {
		t.Errorf("second configuration's callout key %q, want key-b", got)
	}
	if got := header(t, cb.Headers, "x-ratelimit-cost"); got != "1" {
		t.Errorf("second configuration's callout cost %q, want 1", got)
	}
	if got := header(t, cb.Headers, "x-ratelimit-region"); got != "eu-b" {
		t.Errorf("second configuration's region %q, want eu-b", got)
	}
	// One configuration's key header is no key to the other: the first
	// rejects a missing key, the second lets it through.
	s, _ := send(a, get("", Header{"x-key-b", "key-b"}))
	reply(t, s, 401)
	s.Done()
	s, _ = send(b, get("", Header{"x-key-a", "key-a"}))
	wentOn(t, s)
	s.Done()

	// The answers come back to the root context that asked. key-b, and
	// key-c and key-d below, are each checked once: firstAllow.
	sb.RespondCallout(firstAllow, nil)
	wentOn(t, sb)
	sa.RespondCallout(SidecarAnswer("basic", 10, 0.5, 0, 3), nil)
	reply(t, sa, 429)
	sa.Done()
	sb.Done()
	a.Tick()
	b.Tick()
	counters(t, a, map[string]int64{limiter.MetricAllowed: 1, limiter.MetricDenied: 1, limiter.MetricMissingKey: 2})

	// The old configuration drains and goes; the new one carries on.
	a.Remove()
	s, c := waiting(t, b, get("", Header{"x-key-b", "key-c"}))
	if got := header(t, c.Headers, "x-ratelimit-region"); got != "eu-b" {
		t.Errorf("after the removal: region %q, want eu-b", got)
	}
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	s.Done()
	b.Tick()

	// A configuration the filter refuses leaves the VM serving the one it
	// has.
	if _, ok := b.AddPlugin(`{"timeout_ms": -3}`); ok {
		t.Error("an invalid configuration was accepted")
	}
	s, _ = waiting(t, b, get("", Header{"x-key-b", "key-d"}))
	s.RespondCallout(firstAllow, nil)
	wentOn(t, s)
	s.Done()
	counters(t, b, map[string]int64{limiter.MetricAllowed: 3, limiter.MetricDenied: 1, limiter.MetricMissingKey: 2})
	definedOnce()
}
