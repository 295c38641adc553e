package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// exactPlans are the plans of the client tests: 0.5 to 10,000 tokens/s.
const exactPlans = `plans:
  slow:  {capacity: 5, rate: 0.5}
  odd:   {capacity: 3, rate: 2.5}
  pro:   {capacity: 200, rate: 100}
  fast:  {capacity: 50, rate: 1000}
  huge:  {capacity: 200, rate: 10000}
  pace:  {capacity: 10, rate: 20}
  pace5: {capacity: 20, rate: 10}
clients:
  c-slow: slow
  c-odd: odd
  c-pro: pro
  c-fast: fast
  c-huge: huge
  c-pace: pace
  c-pace5: pace5
  c-never: pro
  c-warm: pro
`

// exactCosts are cost rules for GET /orders/c<N>/ (cost N) before the
// shipped envoy.yaml's POST /orders rule (cost 5), which the test keeps.
var exactCosts = []cost{
	{PathPrefix: "/orders/c3/", Cost: 3},
	{PathPrefix: "/orders/c50/", Cost: 50},
	{PathPrefix: "/orders/c200/", Cost: 200},
	{PathPrefix: "/orders/c500/", Cost: 500},
	{Method: "POST", PathPrefix: "/orders", Cost: 5},
}

// clientReply is what a client saw, read without failing the test from the
// goroutine of a parallel subtest.
type clientReply struct {
	status int
	header http.Header
	body   []byte
	at     time.Time // when the reply was read
}

// failedOpen reports whether the reply was let through without a decision:
// a 200 without the RateLimit field the filter adds to every answer it
// decided. The exact tests read it from the reply, not from the gateway's
// counters (stack.doDecided), because their clients run in parallel.
func (r clientReply) failedOpen() bool {
	return r.status == http.StatusOK && edgeItem(r.header, "ratelimit") == nil
}

func (s *stack) send(method, path, key string) (clientReply, error) {
	return s.sendVia(0, method, path, key)
}

// sendVia is send through gateway g.
func (s *stack) sendVia(g int, method, path, key string) (clientReply, error) {
	req, err := http.NewRequest(method, "http://"+s.gateways[g].Addr+path, nil)
	if err != nil {
		return clientReply{}, err
	}
	req.Header.Set("x-api-key", key)
	resp, err := s.http.Do(req)
	if err != nil {
		return clientReply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return clientReply{status: resp.StatusCode, header: resp.Header, body: body, at: time.Now()}, err
}

// edgeItem is the filter's item of a RateLimit or RateLimit-Policy field: the
// last one (the filter adds its own after any the service sent), parsed into
// its parameters; nil when the field is absent (the request failed open).
func edgeItem(h http.Header, name string) map[string]string {
	vs := h.Values(name)
	if len(vs) == 0 {
		return nil
	}
	items := strings.Split(strings.Join(vs, ","), ",")
	parts := strings.Split(strings.TrimSpace(items[len(items)-1]), ";")
	m := map[string]string{"": parts[0]}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		m[k] = v
	}
	return m
}

func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// TestClientHonouringRetryAfter: a client that, on a 429, waits exactly the
// Retry-After it was given and sends the same request again is never
// answered 429 twice in a row, on plans from 0.5 to 10,000 tokens/s and
// costs from 1 to the capacity, through Redis, the sidecar and the gateway
// running envoy.yaml with the real 5 ms callout.
//
// The arithmetic, with no tolerance: Retry-After is whole seconds no
// earlier than the exact wait from the decision (sidecar 429), or from the
// moment the filter received the answer that its cache is built from
// (cached 429), both of which precede the client's reading of the reply;
// the retry reaches Redis after the client waited, and nobody else spends
// from the bucket; Redis's clock and the gateway's are the same host clock.
// So when the retry is decided, at least the cost is back.
//
// A request may fail open (the callout missed its 5 ms, which the shipped
// timeout allows on a loaded machine): it goes through without RateLimit
// fields and is charged nothing, so it changes no later decision. Such
// replies are counted and reported, never taken for decisions: a round
// whose retry failed open tested nothing and is run again (at most
// decidedAttempts times in a row), so every round counted has a retry the
// limiter decided.
func TestClientHonouringRetryAfter(t *testing.T) {
	s := startStack(t, stackConfig{plans: exactPlans, filter: filterConfig{Costs: exactCosts}})
	for _, c := range []struct {
		client, method, path string
		cost, capacity       int64
		rate                 float64
		rounds               int
	}{
		{"c-slow", "GET", "/orders/1", 1, 5, 0.5, 2},          // 2 s per token
		{"c-odd", "GET", "/orders/c3/1", 3, 3, 2.5, 2},        // cost = capacity, 1.2 s refill
		{"c-pro", "POST", "/orders", 5, 200, 100, 3},          // the POST /orders
		{"c-fast", "GET", "/orders/c50/1", 50, 50, 1000, 3},   // cost = capacity, 50 ms refill
		{"c-huge", "GET", "/orders/c200/1", 200, 200, 1e4, 3}, // cost = capacity, 20 ms refill
	} {
		t.Run(c.client, func(t *testing.T) {
			t.Parallel()
			var requests, failedOpen, denials, retries, undecided int
			var errs []string
			for round := 0; round < c.rounds && len(errs) == 0; {
				// Spend until denied (the bucket starts full).
				var r clientReply
				for n := 0; ; n++ {
					var err error
					if r, err = s.send(c.method, c.path, c.client); err != nil {
						t.Fatal(err)
					}
					requests++
					if r.failedOpen() {
						failedOpen++
					}
					if r.status == http.StatusTooManyRequests {
						break
					}
					if r.status != http.StatusOK || n > int(c.capacity/c.cost)+1000 {
						t.Fatalf("round %d: status %d after %d requests, body %s", round, r.status, n, r.body)
					}
				}
				denials++
				errs = append(errs, check429(r, c.cost)...)
				ra := atoi(r.header.Get("retry-after"))
				// Honour it exactly, from the moment the reply was read.
				time.Sleep(time.Until(r.at.Add(time.Duration(ra) * time.Second)))
				r2, err := s.send(c.method, c.path, c.client)
				if err != nil {
					t.Fatal(err)
				}
				requests++
				retries++
				switch {
				case r2.status == http.StatusTooManyRequests:
					errs = append(errs, fmt.Sprintf("round %d: 429 again after waiting retry-after %d s (first: %v %s; second: %v %s)",
						round, ra, r.header.Values("ratelimit"), r.body, r2.header.Values("ratelimit"), r2.body))
				case r2.status != http.StatusOK:
					errs = append(errs, fmt.Sprintf("round %d: retry answered %d", round, r2.status))
				case r2.failedOpen():
					failedOpen++
					if undecided++; undecided == decidedAttempts {
						errs = append(errs, fmt.Sprintf("round %d: the retry failed open %d times in a row", round, undecided))
					}
					continue // the round again: its retry had no decision
				}
				round, undecided = round+1, 0
			}
			for _, e := range errs {
				t.Error(e)
			}
			t.Logf("%s: cost %d of %d at %v/s: %d requests, %d 429s each followed by a retry after Retry-After (%d), %d failed open",
				c.client, c.cost, c.capacity, c.rate, requests, denials, retries, failedOpen)
		})
	}

	// A cost above the capacity can never succeed: no Retry-After (a client
	// honouring one would retry forever), and a problem body saying so.
	// Each of the three replies is one the limiter decided: a request that
	// failed open is no answer to this and is sent again, as stack.doDecided
	// does, and the subtest fails when decidedAttempts in a row failed open.
	t.Run("never", func(t *testing.T) {
		t.Parallel()
		for i := 0; i < 3; i++ {
			var r clientReply
			for attempt := 1; ; attempt++ {
				var err error
				if r, err = s.send("GET", "/orders/c500/1", "c-never"); err != nil {
					t.Fatal(err)
				}
				if !r.failedOpen() {
					break
				}
				if attempt == decidedAttempts {
					t.Fatalf("cost 500 of 200, request %d: failed open %d times in a row, no decision", i, attempt)
				}
				t.Logf("cost 500 of 200, request %d failed open (attempt %d of %d): no decision, sent again", i, attempt, decidedAttempts)
			}
			if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "" {
				t.Fatalf("cost 500 of 200: %d, retry-after %q; want 429 without retry-after", r.status, r.header.Get("retry-after"))
			}
			var p map[string]any
			if err := json.Unmarshal(r.body, &p); err != nil || p["type"] != limiter.QuotaExceededType ||
				!strings.Contains(fmt.Sprint(p["detail"]), "never") || fmt.Sprint(p["violated-policies"]) != "[pro]" {
				t.Fatalf("never body %s (%v)", r.body, err)
			}
		}
	})
}

// check429 holds a 429 to the contract: problem+json naming the policy,
// RateLimit-Policy with q and w, RateLimit with r below the cost, and a
// Retry-After no earlier than t.
func check429(r clientReply, cost int64) []string {
	var errs []string
	pol, rl := edgeItem(r.header, "ratelimit-policy"), edgeItem(r.header, "ratelimit")
	ra := atoi(r.header.Get("retry-after"))
	if pol == nil || rl == nil || pol["q"] == "" || atoi(pol["w"]) < 1 || pol["edgelimit-rate"] == "" {
		errs = append(errs, fmt.Sprintf("429 fields: policy %v, ratelimit %v", r.header.Values("ratelimit-policy"), r.header.Values("ratelimit")))
		return errs
	}
	if ra < 1 || ra < atoi(rl["t"]) {
		errs = append(errs, fmt.Sprintf("retry-after %d earlier than t=%s", ra, rl["t"]))
	}
	if atoi(rl["r"]) >= cost {
		errs = append(errs, fmt.Sprintf("429 with r=%s for cost %d", rl["r"], cost))
	}
	if ct := r.header.Get("content-type"); ct != limiter.ProblemContentType {
		errs = append(errs, "429 content-type "+ct)
	}
	return errs
}

// TestClientPacingFromRateLimit: a client that paces itself from the
// RateLimit field alone (send while r covers the cost, else wait t seconds)
// is never denied and stays within its plan: the tokens it was admitted
// never exceed capacity + rate × the time from its first request to its
// last reply (the bucket starts full; Redis decides every request within
// that span), with no tolerance. Why it is never denied: r is the whole
// tokens left after the decision, so spending them is admitted; t is no
// earlier than the next whole token, and the plans refill at least the
// cost in one second (t ≥ 1). Replies that failed open carry no field: the
// client then counts down its last r itself; they are counted and bounded
// by the design's 1% and the host's stalls (stallBudget), as every test's.
func TestClientPacingFromRateLimit(t *testing.T) {
	s := startStack(t, stackConfig{plans: exactPlans, filter: filterConfig{Costs: exactCosts}})
	// One watch of the vCPUs for both clients, started before anything is
	// sent: starting one runs a process of its own.
	vcpus := watchVCPUs(t)
	// The stack's first callout is each process's first pass over the
	// check path, which on a loaded machine can miss the 5 ms and fail open
	// (RATIONALE.md, "What does a fresh stack's first burst cost?"): another
	// client goes first until one is decided, so that the clients' fail-opens
	// are held to the budget of a warm stack.
	s.doDecided(0, "GET", "/orders/1", "x-api-key", "c-warm")
	for _, c := range []struct {
		client, method, path string
		cost, capacity       int64
		rate                 float64
	}{
		{"c-pace", "GET", "/orders/1", 1, 10, 20},
		{"c-pace5", "POST", "/orders", 5, 20, 10},
	} {
		t.Run(c.client, func(t *testing.T) {
			t.Parallel()
			var undecided undecidedLog
			host := watchHost()
			start := time.Now()
			var admitted, failedOpen, requests int64
			r, wait := c.capacity, int64(1) // nothing known yet: the plan's burst
			for time.Since(start) < 3*time.Second {
				if r < c.cost {
					time.Sleep(time.Duration(max(wait, 1)) * time.Second)
					r = c.cost // what t promises: more quota is back
				}
				sent := time.Now()
				rep, err := s.send(c.method, c.path, c.client)
				if err != nil {
					t.Fatal(err)
				}
				requests++
				item := edgeItem(rep.header, "ratelimit")
				switch {
				case rep.status == http.StatusTooManyRequests:
					t.Fatalf("denied after %d requests pacing from r and t: %v %s", requests, rep.header.Values("ratelimit"), rep.body)
				case rep.status != http.StatusOK:
					t.Fatalf("status %d", rep.status)
				case item == nil:
					failedOpen++
					undecided.add(sent)
					r -= c.cost
				default:
					admitted++
					r, wait = atoi(item["r"]), atoi(item["t"])
				}
			}
			elapsed := time.Since(start).Seconds()
			// The watch runs on for the other client: Sync has it report
			// every stall up to now, as closing it would. Over a few dozen
			// requests the design's 1% is none, so each that failed open
			// must have waited through a stall that breaks a callout.
			vcpus.Sync()
			budget := stallBudget(vcpus, host, requests, undecided.all())
			limit := float64(c.capacity) + c.rate*elapsed
			t.Logf("%s: %d admitted by the limiter (%d tokens) in %.2f s, plan allows %.0f; %d of %d failed open (may %d: %s)",
				c.client, admitted, admitted*c.cost, elapsed, limit, failedOpen, requests, budget.total(), budget.why)
			if float64(admitted*c.cost) > limit {
				t.Errorf("admitted %d tokens, the plan allows %.1f", admitted*c.cost, limit)
			}
			if failedOpen > budget.total() {
				t.Errorf("%d of %d requests failed open, more than %d (%s)", failedOpen, requests, budget.total(), budget.why)
			}
		})
	}
}
