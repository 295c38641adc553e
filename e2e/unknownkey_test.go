package e2e_test

import (
	"net/http"
	"testing"
)

// A plans file without default_plan means "only the listed clients may
// call": the sidecar answers 403 for any other key. That answer is a
// decision, not a failure, so the request must not go through: it is
// refused at the edge and never reaches a service. (Failing open on it
// would make every unlisted key unlimited, the opposite of what leaving
// out default_plan asks for.)
func TestUnknownKeyWithoutDefaultPlanIsRefused(t *testing.T) {
	s := startStack(t, stackConfig{
		plans: "plans:\n  gold: {capacity: 2, rate: 0.001}\nclients:\n  \"listed-client\": gold\n",
	})
	if r := s.do(0, "GET", "/orders/1", "x-api-key", "listed-client"); r.status != http.StatusOK {
		t.Fatalf("listed client: status %d, want 200", r.status)
	}
	const unknown = "not-a-listed-client"
	before := s.decisions()
	for i := 0; i < 5; i++ {
		r := s.do(0, "GET", "/orders/1", "x-api-key", unknown)
		if r.status != http.StatusForbidden {
			t.Errorf("unknown key, request %d: status %d, want 403 (the sidecar's answer)", i, r.status)
		}
	}
	if got := s.received(unknown); got != 0 {
		t.Errorf("services received %d requests of an unknown key; counters %v", got, s.decisions().minus(before))
	}
	if d := s.decisions().minus(before); d.failedOpen() != 0 {
		t.Errorf("the sidecar's 403 was counted as a failure to fail open on: %v", d)
	}
}
