// Package safety is the coarse per-client limit a service keeps once client
// limits are enforced at the edge (ADR-002): Factor times the client's plan,
// 10x by default, counted in the service instance's own memory.
//
// It is not the client's limit; the edge is. It is the backstop for when the
// edge fails open (Redis or the sidecar down): a client still cannot send
// any one service instance more than Factor times its plan. Set loose on
// purpose, it never trips while the edge works, so it needs no coordination
// between instances.
package safety

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/clientkey"
)

// DefaultFactor is the multiple of the plan the safety limit allows.
const DefaultFactor = 10

// Plans returns a client's plan; ok is false for a client without one.
type Plans func(client string) (limit bucket.Limit, ok bool)

// Config configures a Limiter.
type Config struct {
	// Plans gives each client's plan. Required. Requests of a client without
	// a plan, or without an API key, pass unlimited: the edge decides those.
	Plans Plans
	// Factor multiplies the plan's capacity and rate. Defaults to
	// DefaultFactor (10).
	Factor float64
	// Client names a request's client. Defaults to clientkey.FromRequest.
	Client func(*http.Request) string
	// Clock reads the time. Defaults to time.Now.
	Clock func() time.Time
}

// Counts is what the limiter did for one client.
type Counts struct {
	Passed int64 `json:"passed"`
	Denied int64 `json:"denied"`
}

// Limiter applies the safety limit. It is safe for concurrent use.
type Limiter struct {
	plans   Plans
	factor  float64
	client  func(*http.Request) string
	buckets *bucket.Buckets

	mu     sync.Mutex
	counts map[string]*Counts
}

// New checks c and returns its limiter.
func New(c Config) (*Limiter, error) {
	if c.Plans == nil {
		return nil, fmt.Errorf("plans: required")
	}
	if c.Factor == 0 {
		c.Factor = DefaultFactor
	}
	if !(c.Factor > 0) || math.IsInf(c.Factor, 1) {
		return nil, fmt.Errorf("factor: must be a finite number > 0, got %v", c.Factor)
	}
	if c.Client == nil {
		c.Client = clientkey.FromRequest
	}
	return &Limiter{
		plans:   c.Plans,
		factor:  c.Factor,
		client:  c.Client,
		buckets: bucket.New(c.Clock),
		counts:  map[string]*Counts{},
	}, nil
}

// Factor returns the multiple of the plan this limiter allows.
func (l *Limiter) Factor() float64 { return l.factor }

// Allow decides one request of client. limited is false when the client has
// no plan (or no key) and the request was not counted against anything.
func (l *Limiter) Allow(client string) (d bucket.Decision, limited bool) {
	if client == "" {
		return bucket.Decision{Allowed: true}, false
	}
	plan, ok := l.plans(client)
	if !ok {
		return bucket.Decision{Allowed: true}, false
	}
	d, err := l.buckets.Take(client, plan.Scale(l.factor), 1)
	if err != nil {
		// A plan this package cannot use is the plan source's bug; the
		// safety limit is a backstop, so it lets the request through
		// rather than failing it.
		return bucket.Decision{Allowed: true}, false
	}
	l.mu.Lock()
	c := l.counts[client]
	if c == nil {
		c = &Counts{}
		l.counts[client] = c
	}
	if d.Allowed {
		c.Passed++
	} else {
		c.Denied++
	}
	l.mu.Unlock()
	return d, true
}

// Handler returns next behind the safety limit: a request over it gets 429
// with Retry-After and never reaches next.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := l.Allow(l.client(r))
		if d.Allowed {
			next.ServeHTTP(w, r)
			return
		}
		Deny(w, d, l.factor)
	})
}

// Deny writes the safety limit's 429 for decision d.
func Deny(w http.ResponseWriter, d bucket.Decision, factor float64) {
	headers, body := Denial(d, factor)
	for _, h := range headers {
		w.Header().Set(h[0], h[1])
	}
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(body)
}

// Denial returns the headers and the body of the safety limit's 429 for
// decision d (Deny's answer, for a server other than net/http's).
func Denial(d bucket.Decision, factor float64) (headers [][2]string, body []byte) {
	headers = [][2]string{{"content-type", "application/json"}, {"x-safety-limit", strconv.FormatFloat(factor, 'g', -1, 64) + "x"}}
	fields := map[string]any{"error": "safety_limit"}
	if !d.Never {
		secs := max(int64(math.Ceil(d.RetryAfter.Seconds())), 1)
		headers = append(headers, [2]string{"retry-after", strconv.FormatInt(secs, 10)})
		fields["retry_after"] = secs
	}
	body, _ = json.Marshal(fields) // a map of a string and an integer always encodes
	return headers, append(body, '\n')
}

// Counts returns a copy of the per-client counts.
func (l *Limiter) Counts() map[string]Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]Counts, len(l.counts))
	for k, v := range l.counts {
		out[k] = *v
	}
	return out
}
