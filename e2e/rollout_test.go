package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/e2e/services/shadow"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// The rollout plan of the design document, walked on one running system
// (Redis, sidecar, gateway, two services, each with its own per-client
// limiter in observe mode) by configuration changes only: the gateway's
// file is rewritten and the gateway reloaded (SIGHUP), never restarted.
//
//	step 0  mode off              the filter is deployed and decides nothing
//	step 1  canary                noisy is enforced, everyone else in shadow
//	step 2  shadow for everyone   nothing rejected; the services compare the
//	                              edge's decision with their own limiter
//	step 3  enforce               over-plan clients get 429 at the edge
//
// Every client has the plan below: 10 tokens and a refill so slow (one
// token per 1000 s) that no token comes back during the test. A bucket then
// admits exactly the first 10 requests of a client, which makes every
// decision, the edge's and the services', computable in advance.
func TestRolloutCanaryShadowEnforce(t *testing.T) {
	standInOnly(t, "each step reloads the gateway's configuration with SIGHUP; Envoy applies a changed static bootstrap by a hot restart, which the harness does not drive")
	const capacity = 10
	const plans = "default_plan: free\nplans:\n  free: {capacity: 10, rate: 0.001}\n"
	// The services' limiters observe: each decides every request by the
	// plan, as it did before the edge, and compares its decision with the
	// edge's shadow decision (package shadow), rejecting nothing. That
	// comparison is what step 2 reads.
	s := startStack(t, stackConfig{
		plans:          plans,
		filter:         filterConfig{Mode: "off"},
		serviceLimiter: services.LimiterObserve,
	})
	g := s.gateways[0]
	host := watchHost()
	generation := int64(1)
	// Each step is the change the README's rollout table names, made to
	// the running file: the fields a step does not set keep the file's
	// value, so the two a step is about are always written.
	apply := func(step string, c filterConfig) {
		t.Helper()
		if c.Mode == "" {
			c.Mode = "enforce"
		}
		cfg, err := json.Marshal(struct {
			filterConfig
			CanaryClients []string `json:"canary_clients"`
		}{c, append([]string{}, c.CanaryClients...)})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.SetFilterConfig(string(cfg)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n, err := g.Reload(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if n != generation+1 {
			t.Fatalf("%s: generation %d, want %d", step, n, generation+1)
		}
		generation = n
		t.Logf("%s: gateway reloaded, generation %d, filter configuration %s", step, n, cfg)
	}
	// burst sends n requests of client to path and counts the answers,
	// and the checks among them that failed open.
	failedOpen := 0
	burst := func(client, path string, n int) (ok, denied int) {
		t.Helper()
		before := s.failedOpen()
		defer func() { failedOpen = int(s.failedOpen() - before) }()
		for i := 0; i < n; i++ {
			switch r := s.do(0, "GET", path, "x-api-key", client); r.status {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				denied++
			default:
				t.Fatalf("%s %s: status %d, body %q", client, path, r.status, r.body)
			}
		}
		return ok, denied
	}

	// Step 0: deployed, off. Nothing is checked.
	if ok, _ := burst("noisy-0", "/orders/1", 2*capacity); ok != 2*capacity {
		t.Fatalf("mode off: %d of %d admitted", ok, 2*capacity)
	}
	if got := s.stat(counter("unchecked")); got != 2*capacity {
		t.Fatalf("unchecked = %d, want %d", got, 2*capacity)
	}

	// Step 1: canary. Only noisy is enforced: its first 10 requests are
	// admitted and the other 5 are answered 429 at the edge, never reaching
	// a service. quiet, as far over its plan, passes, and the service sees
	// what the edge would have decided.
	//
	// A check that fails open admits its request whether or not Redis
	// spent a token for it, so each one may add an admission (and, in
	// shadow, turns a decision into "unknown" that may have taken a
	// token); the rollout's fail-opens are bounded together at the end.
	apply("step 1 (canary)", filterConfig{CanaryClients: []string{"noisy"}})
	ok, denied := burst("noisy", "/orders/1", capacity+5)
	if ok < capacity || ok > capacity+failedOpen || ok+denied != capacity+5 {
		t.Errorf("canary noisy: %d admitted, %d denied (%d failed open); want %d and 5", ok, denied, failedOpen, capacity)
	}
	if got := s.received("noisy"); got != int64(ok) {
		t.Errorf("services received %d requests of noisy, want %d (the admitted ones)", got, ok)
	}
	if ok, denied := burst("quiet", "/billing/1", capacity+5); ok != capacity+5 || denied != 0 {
		t.Errorf("canary quiet: %d admitted, %d denied; want all %d admitted", ok, denied, capacity+5)
	}
	if c := s.billing.Stats().Client("quiet"); c.ShadowAllow < int64(capacity-failedOpen) || c.ShadowAllow > capacity ||
		c.ShadowUnknown != int64(failedOpen) || c.ShadowAllow+c.ShadowDeny+c.ShadowUnknown != capacity+5 {
		t.Errorf("billing saw quiet's shadow allow=%d deny=%d unknown=%d (%d failed open), want %d, 5 and 0",
			c.ShadowAllow, c.ShadowDeny, c.ShadowUnknown, failedOpen, capacity)
	}
	// billing's limiter saw the same 15 requests of quiet against the same
	// plan as the edge, so the two agree on each one the edge decided. A
	// check that failed open is not compared, and may shift the edge's
	// later decisions by the token it did or did not spend.
	if c := s.billing.Shadow().Clients["quiet"]; c.Unknown != int64(failedOpen) || c.Compared()+c.Unknown != capacity+5 ||
		c.Invalid != 0 || failedOpen == 0 && c.Agree != capacity+5 {
		t.Errorf("billing's shadow report for quiet %+v (%d failed open), want all %d in agreement", c, failedOpen, capacity+5)
	}
	// noisy was enforced: its requests carry no shadow decision, and the
	// services compare none of them.
	if c, ok := s.orders.Shadow().Clients["noisy"]; ok {
		t.Errorf("orders compared %+v of the canary client noisy, whose requests the edge enforced", c)
	}

	// Step 2: shadow for everyone, and the comparison the services'
	// limiters make with the edge's decisions.
	apply("step 2 (shadow)", filterConfig{Mode: "shadow"})
	earlier := shadow.Merge(s.orders.Shadow(), s.billing.Shadow())
	cmp := compareShadow(t, s, capacity, shadowTraffic())
	// A request whose check failed open carries "unknown" and is not a
	// comparison; the design allows 1% of them, and the host's stalls
	// some more (failOpenBudget).
	if budget := host.failOpenBudget(int64(cmp.total)); int64(cmp.unknown) > budget.total() {
		t.Fatalf("%d of %d requests carried x-ratelimit-shadow: unknown (the sidecar did not decide), more than %d (%s)", cmp.unknown, cmp.total, budget.total(), budget.why)
	}
	if cmp.unmarked != 0 {
		t.Fatalf("%d of %d requests reached their service in shadow mode without %s, or with a value the filter never sends", cmp.unmarked, cmp.total, limiter.ShadowHeader)
	}
	if cmp.edgeMismatch != 0 {
		t.Fatalf("%d shadow decisions differ from the edge bucket's arithmetic", cmp.edgeMismatch)
	}
	// One predicted disagreement (spread's 11th request, at billing). A
	// check that failed open and took no token leaves its client's edge
	// bucket a token above what the services counted: it can take that
	// disagreement away (one of spread's) or add one where the edge
	// admits what a service's bucket refuses (solo's 11th). Each failed
	// open check moves the count by at most one.
	if cmp.total != 1210 || cmp.expected > 1+cmp.unknown || cmp.expected+cmp.unknown < 1 {
		t.Fatalf("the traffic holds %d requests and %d predicted disagreements (%d not compared); shadowTraffic says 1210 and 1, each not compared moving it by at most one", cmp.total, cmp.expected, cmp.unknown)
	}
	// Each service's own report, client by client: the edge's decision
	// each request carried against the decision of the service's bucket.
	reports := map[string]shadow.Report{"orders": s.orders.Shadow(), "billing": s.billing.Shadow()}
	wrong := 0
	var want shadow.Counts
	for _, svc := range []string{"orders", "billing"} {
		for _, client := range slices.Sorted(maps.Keys(cmp.want[svc])) {
			w := cmp.want[svc][client]
			want = want.Plus(w)
			if got := reports[svc].Clients[client]; got != w {
				if wrong++; wrong <= 5 {
					t.Errorf("%s's shadow report for %s: %+v, want %+v", svc, client, got, w)
				}
			}
		}
	}
	if wrong > 5 {
		t.Errorf("… and %d more clients whose reports differ", wrong-5)
	}
	// The step's report, the services' merged as the bench reads them:
	// what they compared during the step, and no more than its traffic.
	after := shadow.Merge(reports["orders"], reports["billing"])
	step := shadow.Report{Total: after.Total.Minus(earlier.Total), Clients: map[string]shadow.Counts{}}
	for client, c := range after.Clients {
		if c != earlier.Clients[client] {
			step.Clients[client] = c.Minus(earlier.Clients[client])
		}
	}
	t.Logf("step 2 (shadow): the services compared %d requests: %d agree, %d disagree (%.3f%%), %d unknown; exit criterion under %.1f%%: %t",
		step.Total.Compared(), step.Total.Agree, step.Total.Disagree(), 100*step.Total.DisagreementRate(), step.Total.Unknown,
		100*shadow.ExitCriterion, step.MeetsExitCriterion())
	if step.Total != want {
		t.Errorf("the services' reports for step 2 total %+v, want %+v", step.Total, want)
	}
	if n := step.Total.Compared() + step.Total.Unknown; n != int64(cmp.total) {
		t.Errorf("the services recorded %d of the %d requests", n, cmp.total)
	}
	// The disagreement the traffic holds is the leak the edge closes: the
	// edge denies what billing's own bucket would have allowed.
	// (A check that failed open can move a client's disagreement to
	// another request, either way.)
	if d := step.Total.Disagree(); d != int64(cmp.expected) || cmp.unknown == 0 && step.Total.EdgeDenied != d {
		t.Fatalf("the services report %d disagreements (%d where the edge would deny), want %d, all where it would deny", d, step.Total.EdgeDenied, cmp.expected)
	}
	if worst := step.Worst(3); cmp.expected > 0 && cmp.unknown == 0 && (len(worst) != 1 || worst[0] != "spread") {
		t.Errorf("clients with disagreements %v; want spread alone", worst)
	}
	// The traffic holds exactly one disagreement in more than 1000
	// requests, so the criterion is met; with ten spread clients instead
	// of one it would not be. One added by a check that failed open puts
	// it at 2 of 1209, past the criterion's 0.1%: then the report must say
	// what the arithmetic does.
	if meets, want := step.MeetsExitCriterion(), float64(cmp.expected)/float64(step.Total.Compared()) < shadow.ExitCriterion; meets != want || cmp.unknown == 0 && !meets {
		t.Errorf("exit criterion met: %v, want %v (%d predicted disagreements of %d compared): %+v", meets, want, cmp.expected, step.Total.Compared(), step.Total)
	}
	if got := s.stat(counter("denied")) + s.stat(counter("denied_cached")); got != int64(denied) {
		t.Errorf("requests denied at the edge so far %d, want noisy's %d from step 1", got, denied)
	}

	// Step 3: enforce for everyone. over-plan gets 429s beyond its 10,
	// and the services see only the admitted ones; noisy and spread, whose
	// buckets are already empty, are refused outright.
	apply("step 3 (enforce)", filterConfig{})
	before := s.received("over-plan")
	ok, denied = burst("over-plan", "/orders/1", capacity+5)
	if ok < capacity || ok > capacity+failedOpen || ok+denied != capacity+5 {
		t.Errorf("enforce over-plan: %d admitted, %d denied (%d failed open); want %d and 5", ok, denied, failedOpen, capacity)
	}
	if got := s.received("over-plan") - before; got != int64(ok) {
		t.Errorf("services received %d requests of over-plan, want %d: a rejected request reached a service", got, ok)
	}
	for _, client := range []string{"noisy", "spread"} {
		before := s.received(client)
		ok, denied := burst(client, "/billing/2", 3)
		if ok > failedOpen || ok+denied != 3 {
			t.Errorf("enforce %s (bucket empty): %d admitted, %d denied (%d failed open); want 0 and 3", client, ok, denied, failedOpen)
		}
		if got := s.received(client) - before; got != int64(ok) {
			t.Errorf("services received %d requests of %s, want the %d admitted: a rejected request reached a service", got, client, ok)
		}
	}
	if ok, _ := burst("steady-1-more", "/billing/3", 3); ok != 3 {
		t.Errorf("enforce: a client within its plan got %d of 3 through", ok)
	}
	// The design's 1% of the rollout's requests may fail open, and the
	// host's share (failOpenBudget), steps 1 and 3 included.
	if n, budget := s.failedOpen(), host.failOpenBudget(int64(cmp.total)); n > budget.total() {
		t.Errorf("%d requests failed open during the rollout, more than %d (%s)", n, budget.total(), budget.why)
	}
	if n := s.stat(harness.StatReloadFailed); n != 0 {
		t.Errorf("reload_failed = %d", n)
	}
}

// request is one request of the shadow traffic: a client calling a
// service.
type request struct {
	client  string
	service string // "orders" or "billing"
}

// shadowTraffic is step 2's traffic, each client's requests in order. It is
// built so that the number of disagreements between the edge's decision and
// the per-service limiters is known in advance:
//
//   - 236 steady clients send 5 requests each, alternating services: within
//     the plan overall and at each service, so every bucket admits them and
//     both sides say allow.
//   - solo sends 15 requests, all to orders: the orders limiter and the edge
//     see the same requests against the same 10-token plan, so both admit
//     the first 10 and refuse the last 5. A client that uses one service
//     never makes them disagree.
//   - spread sends 10 requests to orders, 1 to billing, then 4 to orders.
//     The edge bucket is the client's one limit and is empty after the
//     first 10; billing's own bucket has never been touched, so billing
//     would admit the 11th request the edge refuses: one disagreement.
//     That is the leak the edge removes, each service enforcing the whole
//     plan on its own (the incident's 9x). The last 4 are refused by both
//     (orders' bucket is empty too).
//
// 1210 requests, 1 disagreement: 0.083%, under the 0.1% exit criterion.
func shadowTraffic() [][]request {
	var clients [][]request
	for i := 0; i < 236; i++ {
		var rs []request
		for j := 0; j < 5; j++ {
			rs = append(rs, request{fmt.Sprintf("steady-%d", i), []string{"orders", "billing"}[j%2]})
		}
		clients = append(clients, rs)
	}
	var solo, spread []request
	for i := 0; i < 15; i++ {
		solo = append(solo, request{"solo", "orders"})
	}
	for i := 0; i < 15; i++ {
		svc := "orders"
		if i == 10 {
			svc = "billing"
		}
		spread = append(spread, request{"spread", svc})
	}
	return append(clients, solo, spread)
}

// shadowComparison is step 2's traffic as the edge decided it, and the
// comparison each service should report for it.
type shadowComparison struct {
	// total is the requests sent; unknown, those that carried
	// x-ratelimit-shadow: unknown (the check failed open); unmarked, those
	// that reached their service without the header or with a value the
	// filter never sends.
	total, unknown, unmarked int
	// expected is the number of disagreements the arithmetic predicts;
	// edgeMismatch counts shadow decisions that differ from the edge
	// bucket's arithmetic (the first capacity requests of a client pass).
	expected, edgeMismatch int
	// want is, by service and client, the comparison the service's limiter
	// should report: each request's shadow decision, as the service
	// received it, against the service's own bucket.
	want map[string]map[string]shadow.Counts
}

// compareShadow sends the traffic through gateway 0 (each client's
// requests in order) and works out, per request, what the edge decided
// and what the service's own limiter decides. The decision a request
// carried is read from the service's per-client counts of
// x-ratelimit-shadow values before and after it: requests of one client
// are sent one at a time, so the one count that rose is this request's.
// With no refill to speak of (one token per 1000 s), a bucket admits the
// first capacity requests it sees: the edge has one bucket per client,
// each service one per client of its own.
func compareShadow(t *testing.T, s *stack, capacity int, traffic [][]request) *shadowComparison {
	t.Helper()
	svcs := map[string]*services.Service{"orders": s.orders, "billing": s.billing}
	edgeUsed := map[string]int{}     // requests of the client the edge model has admitted
	serviceUsed := map[request]int{} // requests of the client the service's bucket has admitted
	// unsure are the clients with a check that failed open: Redis may
	// still decide it after the answer was given up on (the sidecar's
	// command was sent), so the model reads their buckets again before
	// each of their requests rather than once.
	unsure := map[string]bool{}
	resync := func(client string) {
		tokens, err := s.tokens(client)
		if err == nil {
			edgeUsed[client] = capacity - int(math.Floor(tokens))
		}
	}
	c := &shadowComparison{want: map[string]map[string]shadow.Counts{"orders": {}, "billing": {}}}
	values := []shadow.Edge{shadow.EdgeAllow, shadow.EdgeDeny, shadow.EdgeUnknown, shadow.EdgeInvalid}
	for _, rs := range traffic {
		for _, r := range rs {
			if unsure[r.client] {
				resync(r.client)
			}
			svc := svcs[r.service]
			var before [4]int64
			for i, v := range values {
				before[i] = svc.Stats().Client(r.client).Shadowed(v)
			}
			if got := s.do(0, "GET", "/"+r.service+"/shadow", "x-api-key", r.client); got.status != http.StatusOK {
				t.Fatalf("shadow mode: %s got %d, body %q", r.client, got.status, got.body)
			}
			seen := shadow.EdgeNone
			for i, v := range values {
				if svc.Stats().Client(r.client).Shadowed(v) == before[i]+1 {
					seen = v
				}
			}
			c.total++
			// The service's bucket decides every request that reaches it,
			// whatever the edge said.
			service := serviceUsed[r] < capacity
			if service {
				serviceUsed[r]++
			}
			w := c.want[r.service][r.client]
			switch {
			case seen == shadow.EdgeNone:
				// Not shadowed: the service compares nothing.
				c.unmarked++
				continue
			case seen == shadow.EdgeInvalid:
				c.unmarked++
				w.Invalid++
			case seen == shadow.EdgeUnknown:
				w.Unknown++
			case (seen == shadow.EdgeAllow) == service:
				w.Agree++
			case seen == shadow.EdgeDeny:
				w.EdgeDenied++
			default:
				w.EdgeAllowed++
			}
			c.want[r.service][r.client] = w
			if seen == shadow.EdgeInvalid {
				continue
			}
			if seen == shadow.EdgeUnknown {
				// Failed open: the sidecar may or may not have spent a
				// token before the answer was given up on. The bucket
				// says which; the model goes on from there.
				c.unknown++
				unsure[r.client] = true
				resync(r.client)
				continue
			}
			edgeModel := edgeUsed[r.client] < capacity
			if edgeModel {
				edgeUsed[r.client]++
			}
			if (seen == shadow.EdgeAllow) != edgeModel {
				c.edgeMismatch++
			}
			if edgeModel != service {
				c.expected++
			}
		}
	}
	return c
}
