package e2e_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// TestPlanChangeInForce: a client past its plan whose plan then changes
// (raised in place, moved to a smaller plan, taken out of the file) has the
// change in force at the gateway within the sidecar's poll of the file
// (-plans-poll, 1 s as shipped) and the filter's trust in a deny-cache
// entry (1 s), with envoy.yaml's filter configuration and the sidecar's
// defaults. Before the trust existed, the gateway's deny cache answered a
// client raised from 10 an hour 429 for as long as its entry lasted, up to
// an hour, telling it retry-after 360.
func TestPlanChangeInForce(t *testing.T) {
	const client = "plan-change-client"
	s := startStack(t, stackConfig{
		plans: "plans:\n  slow: {capacity: 10, rate: \"10/h\"}\n  tiny: {capacity: 5, rate: \"5/h\"}\n" +
			"clients:\n  \"" + client + "\": slow\n",
	})
	reloads := func() float64 { return s.sidecarMetric(0, `sidecar_plans_reloads_total{result="ok"}`) }
	// replace writes the plans file aside and renames it over, as
	// deployments do, and returns when the sidecar has loaded it: the
	// time of the write and the time the load was seen.
	replace := func(content string) (written, loaded time.Time) {
		t.Helper()
		n := reloads()
		tmp := filepath.Join(filepath.Dir(s.plans), "plans.new")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, s.plans); err != nil {
			t.Fatal(err)
		}
		written = time.Now()
		testkit.Poll(t, 10*time.Second, "the sidecar loads the new plans", func() bool { return reloads() > n })
		return written, time.Now()
	}
	get := func() reply { return s.do(0, "GET", "/orders/1", "x-api-key", client) }
	// until sends a request every 10 ms until one gets want, for at most
	// 10 s (an hour-long stale denial shows as a failure, not a hang),
	// and returns when the first that got it was sent, how many got other
	// statuses, with which retry-afters at most, and how many were
	// admitted.
	until := func(want int) (at time.Time, others, maxRetry, admitted int) {
		t.Helper()
		end := time.Now().Add(10 * time.Second)
		for time.Now().Before(end) {
			sent := time.Now()
			r := get()
			if r.status == http.StatusOK {
				admitted++
			}
			if r.status == want {
				return sent, others, maxRetry, admitted
			}
			others++
			maxRetry = max(maxRetry, r.retryAfter)
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no %d within 10 s: %d other answers, retry-after up to %d s", want, others, maxRetry)
		return
	}
	// The change is in force at most the sidecar's poll (1 s) after the
	// write, and the entry's trust (1 s) after that; one more second is
	// for the requests' own trips and this shared machine's stalls.
	const bound = 3 * time.Second

	// Spent on slow (10 + 10 an hour): a token is 360 s away, and the
	// gateway's deny cache holds the client.
	for i := 0; i < 10; i++ {
		if r := get(); r.status != http.StatusOK {
			t.Fatalf("request %d of a fresh bucket of 10: status %d", i+1, r.status)
		}
	}
	prev := time.Now()
	if r := get(); r.status != http.StatusTooManyRequests || r.retryAfter != 360 {
		t.Fatalf("the 11th request: status %d retry-after %d, want 429 and 360", r.status, r.retryAfter)
	}
	if !s.cachedDenial(0, prev, "GET", "/orders/1", "x-api-key", client) {
		t.Fatal("the request after the 429 was not answered from the deny cache")
	}

	// Raised in place to 100 + 100/s.
	written, loaded := replace("plans:\n  slow: {capacity: 100, rate: 100}\n  tiny: {capacity: 5, rate: \"5/h\"}\n" +
		"clients:\n  \"" + client + "\": slow\n")
	at, denied, maxRetry, _ := until(http.StatusOK)
	t.Logf("raised: loaded %v after the write, admitted %v after the write (%v after the load); meanwhile %d requests denied, retry-after up to %d s",
		loaded.Sub(written).Round(time.Millisecond), at.Sub(written).Round(time.Millisecond), at.Sub(loaded).Round(time.Millisecond), denied, maxRetry)
	if at.Sub(written) > bound {
		t.Errorf("the raised plan admitted the client %v after the write, want within %v", at.Sub(written), bound)
	}

	// Moved to tiny (5 + 5 an hour) while sending 100 a second on a plan
	// of 100/s: from the load on, the bucket holds at most tiny's 5
	// tokens, and 5 an hour refill less than one in the 10 s this can
	// take, so at most 5 requests sent after the load are admitted.
	written, loaded = replace("plans:\n  slow: {capacity: 100, rate: 100}\n  tiny: {capacity: 5, rate: \"5/h\"}\n" +
		"clients:\n  \"" + client + "\": tiny\n")
	at, _, _, admitted := until(http.StatusTooManyRequests)
	t.Logf("lowered: denied %v after the write (%v after the load), %d admitted after the load",
		at.Sub(written).Round(time.Millisecond), at.Sub(loaded).Round(time.Millisecond), admitted)
	if admitted > 5 {
		t.Errorf("%d requests admitted after the client was moved to a plan of 5, want at most 5", admitted)
	}
	if at.Sub(written) > bound {
		t.Errorf("the lowered plan denied the client %v after the write, want within %v", at.Sub(written), bound)
	}
	// Held in the deny cache again (tiny's next token is 720 s away).
	if !s.cachedDenial(0, at, "GET", "/orders/1", "x-api-key", client) {
		t.Fatal("after the denial: want a 429 from the deny cache")
	}

	// Taken out of the file (no default_plan): 403.
	written, loaded = replace("plans:\n  slow: {capacity: 100, rate: 100}\n")
	at, denied, maxRetry, _ = until(http.StatusForbidden)
	t.Logf("removed: 403 %v after the write (%v after the load); meanwhile %d requests answered 429, retry-after up to %d s",
		at.Sub(written).Round(time.Millisecond), at.Sub(loaded).Round(time.Millisecond), denied, maxRetry)
	if at.Sub(written) > bound {
		t.Errorf("the removed client was answered 403 %v after the write, want within %v", at.Sub(written), bound)
	}
	// And stays so: the 403 removed the gateway's entry.
	for i := 0; i < 3; i++ {
		if r := get(); r.status != http.StatusForbidden {
			t.Fatalf("request %d after the first 403: status %d, want 403", i+1, r.status)
		}
	}
}

// TestHotRegionsChangeInForce: a hot client past its region's share whose
// regions change in the plans file (here it is no longer hot: one bucket
// again) has the change in force at the gateway within the same bound as
// a plan change; the gateway's deny cache used to go on denying it by its
// region bucket's entry, the plan's 10 an hour, for 360 s.
//
// The one bucket starts with the tokens the client had left in its region
// buckets (sidecar/README.md, "Hot clients"): us's share of them, which
// falls by half its distance to the floor each second the client asks
// only through eu, holds less than a token from about the third second.
// So the new file raises the plan's rate with the change, to 10 a second:
// whatever was carried, the bucket holds a token 0.1 s after the load,
// and a denial the deny cache still answers by the old entry is the
// cache's.
func TestHotRegionsChangeInForce(t *testing.T) {
	const client = "hot-region-client"
	s := startStack(t, stackConfig{
		plans:          "plans:\n  slow: {capacity: 10, rate: \"10/h\"}\nclients:\n  \"" + client + "\": {plan: slow, regions: [eu, us]}\n",
		gatewayRegions: []string{"eu"},
	})
	get := func() reply { return s.do(0, "GET", "/orders/1", "x-api-key", client) }
	// eu's share, half of 10, is spent after at most 5 requests (the
	// reconciler may move the share toward eu meanwhile, so up to 10).
	admitted := 0
	for i := 0; i < 11; i++ {
		if r := get(); r.status == http.StatusOK {
			admitted++
		} else if r.status != http.StatusTooManyRequests {
			t.Fatalf("request %d: status %d", i+1, r.status)
		}
	}
	if admitted < 5 || admitted > 10 {
		t.Fatalf("%d of 11 admitted through eu, want 5 to 10", admitted)
	}
	cachedBefore := s.stat(counter("denied_cached"))
	testkit.Poll(t, 10*time.Second, "a denial from the deny cache", func() bool {
		get()
		return s.stat(counter("denied_cached")) > cachedBefore
	})

	n := s.sidecarMetric(0, `sidecar_plans_reloads_total{result="ok"}`)
	tmp := filepath.Join(filepath.Dir(s.plans), "plans.new")
	if err := os.WriteFile(tmp, []byte("plans:\n  slow: {capacity: 10, rate: \"10/s\"}\nclients:\n  \""+client+"\": slow\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.plans); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	testkit.Poll(t, 10*time.Second, "the sidecar loads the new plans", func() bool {
		return s.sidecarMetric(0, `sidecar_plans_reloads_total{result="ok"}`) > n
	})
	loaded := time.Now()
	// One bucket again, holding what the client had left and refilling a
	// token in 0.1 s. The bound is TestPlanChangeInForce's: the poll, the
	// trust, a second for the trips and this machine's stalls.
	const bound = 3 * time.Second
	denied, maxRetry := 0, 0
	end := written.Add(10 * time.Second)
	for {
		r := get()
		if r.status == http.StatusOK {
			break
		}
		denied++
		maxRetry = max(maxRetry, r.retryAfter)
		if time.Now().After(end) {
			t.Fatalf("no 200 within 10 s of the write: %d answered %d, retry-after up to %d s", denied, r.status, maxRetry)
		}
		time.Sleep(10 * time.Millisecond)
	}
	at := time.Now()
	t.Logf("regions removed: loaded %v after the write, admitted %v after it (%v after the load); meanwhile %d denied, retry-after up to %d s",
		loaded.Sub(written).Round(time.Millisecond), at.Sub(written).Round(time.Millisecond), at.Sub(loaded).Round(time.Millisecond), denied, maxRetry)
	if at.Sub(written) > bound {
		t.Errorf("admitted %v after the write, want within %v", at.Sub(written), bound)
	}
}
