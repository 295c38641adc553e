// Package shadow compares, request by request and per client, the edge
// limiter's shadow decision with the decision a service's own limiter made
// for the same request. It is the measurement behind the rollout's exit
// criterion: enforce at the edge once the two disagree on under 0.1% of
// requests.
//
// In shadow mode (and for clients outside the canary list) the filter
// forwards every request and says what it would have decided in the
// x-ratelimit-shadow request header (limiter.ShadowHeader): "allow", "deny", or "unknown" when the
// check failed open. A request without the header was not shadowed (the
// edge enforced it, or was off) and is not compared.
package shadow

import (
	"encoding/json"
	"net/http"
	"sort"
	"sync"
)

// ExitCriterion is the largest disagreement rate at which the rollout moves
// from shadow to enforcing at the edge: 0.1%.
const ExitCriterion = 0.001

// Edge is the edge's shadow decision for one request.
type Edge uint8

const (
	EdgeNone    Edge = iota // no header: not shadowed
	EdgeAllow               // "allow"
	EdgeDeny                // "deny"
	EdgeUnknown             // "unknown": the check failed open
	EdgeInvalid             // any other value: not something the filter sends
)

// ParseEdge reads the value of a request's limiter.ShadowHeader ("" when
// it has none).
func ParseEdge(v string) Edge {
	switch v {
	case "":
		return EdgeNone
	case "allow":
		return EdgeAllow
	case "deny":
		return EdgeDeny
	case "unknown":
		return EdgeUnknown
	}
	return EdgeInvalid
}

// Counts is the comparison for one client (or a total).
type Counts struct {
	Agree       int64 // both allowed, or both denied
	EdgeDenied  int64 // the edge would deny; the service allowed
	EdgeAllowed int64 // the edge would allow; the service denied
	Unknown     int64 // the edge could not decide (failed open): not compared
	Invalid     int64 // the header held a value the filter never sends
}

// Compared returns how many requests had a decision on both sides.
func (c Counts) Compared() int64 { return c.Agree + c.EdgeDenied + c.EdgeAllowed }

// Disagree returns how many compared requests were decided differently.
func (c Counts) Disagree() int64 { return c.EdgeDenied + c.EdgeAllowed }

// DisagreementRate returns Disagree/Compared, 0 when nothing was compared.
func (c Counts) DisagreementRate() float64 {
	if n := c.Compared(); n > 0 {
		return float64(c.Disagree()) / float64(n)
	}
	return 0
}

// Plus returns c and o counted together.
func (c Counts) Plus(o Counts) Counts {
	return Counts{Agree: c.Agree + o.Agree, EdgeDenied: c.EdgeDenied + o.EdgeDenied,
		EdgeAllowed: c.EdgeAllowed + o.EdgeAllowed, Unknown: c.Unknown + o.Unknown, Invalid: c.Invalid + o.Invalid}
}

// Minus returns what c counts beyond an earlier reading o of the same
// counts.
func (c Counts) Minus(o Counts) Counts {
	return Counts{Agree: c.Agree - o.Agree, EdgeDenied: c.EdgeDenied - o.EdgeDenied,
		EdgeAllowed: c.EdgeAllowed - o.EdgeAllowed, Unknown: c.Unknown - o.Unknown, Invalid: c.Invalid - o.Invalid}
}

// MarshalJSON writes the counts with their derived totals and rate.
func (c Counts) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Agree            int64   `json:"agree"`
		EdgeDenied       int64   `json:"edge_denied_service_allowed"`
		EdgeAllowed      int64   `json:"edge_allowed_service_denied"`
		Unknown          int64   `json:"edge_unknown"`
		Invalid          int64   `json:"invalid_header"`
		Compared         int64   `json:"compared"`
		Disagree         int64   `json:"disagree"`
		DisagreementRate float64 `json:"disagreement_rate"`
	}{c.Agree, c.EdgeDenied, c.EdgeAllowed, c.Unknown, c.Invalid, c.Compared(), c.Disagree(), c.DisagreementRate()})
}

// UnmarshalJSON reads what MarshalJSON wrote (derived fields are ignored).
func (c *Counts) UnmarshalJSON(b []byte) error {
	var v struct {
		Agree       int64 `json:"agree"`
		EdgeDenied  int64 `json:"edge_denied_service_allowed"`
		EdgeAllowed int64 `json:"edge_allowed_service_denied"`
		Unknown     int64 `json:"edge_unknown"`
		Invalid     int64 `json:"invalid_header"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = Counts{v.Agree, v.EdgeDenied, v.EdgeAllowed, v.Unknown, v.Invalid}
	return nil
}

// Counter accumulates comparisons. It is safe for concurrent use; the
// replicas of a service share one.
type Counter struct {
	mu sync.Mutex
	m  map[string]*Counts
}

// NewCounter returns an empty counter.
func NewCounter() *Counter { return &Counter{m: map[string]*Counts{}} }

// Record compares one request of client: the edge's shadow decision and
// whether the service's own limiter allowed it. Requests the edge did not
// shadow (EdgeNone) are not recorded.
func (c *Counter) Record(client string, edge Edge, serviceAllowed bool) {
	if edge == EdgeNone {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.m[client]
	if n == nil {
		n = &Counts{}
		c.m[client] = n
	}
	switch {
	case edge == EdgeUnknown:
		n.Unknown++
	case edge == EdgeInvalid:
		n.Invalid++
	case (edge == EdgeAllow) == serviceAllowed:
		n.Agree++
	case edge == EdgeDeny:
		n.EdgeDenied++
	default:
		n.EdgeAllowed++
	}
}

// Report is a snapshot of the comparison.
type Report struct {
	Total   Counts            `json:"total"`
	Clients map[string]Counts `json:"clients"`
}

// Report returns a snapshot.
func (c *Counter) Report() Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Report{Clients: make(map[string]Counts, len(c.m))}
	for k, v := range c.m {
		r.Clients[k] = *v
		r.Total = r.Total.Plus(*v)
	}
	return r
}

// Merge returns the reports added together, per client and in total: one
// report for several services.
func Merge(reports ...Report) Report {
	out := Report{Clients: map[string]Counts{}}
	for _, r := range reports {
		for k, v := range r.Clients {
			c := out.Clients[k]
			c = c.Plus(v)
			out.Clients[k] = c
		}
		out.Total = out.Total.Plus(r.Total)
	}
	return out
}

// MeetsExitCriterion reports whether the total disagreement is under
// ExitCriterion with at least one request compared. Requests the edge did
// not decide (Unknown) are not compared and do not count either way: the
// caller judges whether there were few enough of them for the rate to
// stand for the step (README.md, "Rolling out").
func (r Report) MeetsExitCriterion() bool {
	return r.Total.Compared() > 0 && r.Total.DisagreementRate() < ExitCriterion
}

// Worst returns up to n clients with the most disagreements, most first
// (ties by name), for a report that points at where the two limiters differ.
func (r Report) Worst(n int) []string {
	names := make([]string, 0, len(r.Clients))
	for k, v := range r.Clients {
		if v.Disagree() > 0 {
			names = append(names, k)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := r.Clients[names[i]].Disagree(), r.Clients[names[j]].Disagree()
		if a != b {
			return a > b
		}
		return names[i] < names[j]
	})
	if len(names) > n {
		names = names[:n]
	}
	return names
}

// Handler serves the report as JSON, with the exit criterion and whether it
// is met.
func (c *Counter) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, c.Report())
	})
}

// WriteJSON writes rep as the JSON document Handler serves.
func WriteJSON(w http.ResponseWriter, rep Report) {
	w.Header().Set("content-type", "application/json")
	json.NewEncoder(w).Encode(struct {
		Report
		ExitCriterion float64 `json:"exit_criterion"`
		Meets         bool    `json:"meets_exit_criterion"`
	}{rep, ExitCriterion, rep.MeetsExitCriterion()})
}
