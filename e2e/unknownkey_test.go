package e2e_test

import (
	"fmt"
	"net/http"
	"strconv"
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
	// A request that failed open (its callout missed the 5 ms) runs the
	// sequence again with a fresh unknown key (decidedRun). A filter that
	// counted the sidecar's 403 as a failure to fail open on would do so in
	// every run, and fail the test after decidedAttempts.
	s.decidedRun(t, "an unknown key's requests", func(run int) error {
		unknown := "not-a-listed-client-" + strconv.Itoa(run)
		for i := 0; i < 5; i++ {
			if r := s.do(0, "GET", "/orders/1", "x-api-key", unknown); r.status != http.StatusForbidden {
				return fmt.Errorf("unknown key, request %d: status %d, want 403 (the sidecar's answer)", i, r.status)
			}
		}
		if got := s.received(unknown); got != 0 {
			return fmt.Errorf("services received %d requests of an unknown key", got)
		}
		return nil
	})
}
