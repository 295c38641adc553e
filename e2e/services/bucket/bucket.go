// Package bucket is the in-process token bucket a service replica ran for
// each client before the edge limiter (ADR-001). The buckets live in one
// replica's memory, so a client's real limit is the per-replica limit times
// every replica of every service it reaches: the incident the edge limiter
// exists to prevent. The benchmarks run it as the baseline, and the coarse
// safety limit (package safety) reuses it.
//
// The arithmetic is the Redis script's (lua/tokenbucket.lua): a new bucket
// is full, it refills continuously at Rate tokens per second up to
// Capacity, and a call takes cost tokens if the bucket holds them.
package bucket

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Limit is a bucket's shape.
type Limit struct {
	Capacity float64 // tokens in a full bucket: the largest burst
	Rate     float64 // tokens added back per second
}

// Validate reports, naming the field and value, why l cannot shape a
// bucket: both fields must be finite and > 0.
func (l Limit) Validate() error {
	if !(l.Capacity > 0) || math.IsInf(l.Capacity, 1) {
		return fmt.Errorf("capacity: must be a finite number > 0, got %v", l.Capacity)
	}
	if !(l.Rate > 0) || math.IsInf(l.Rate, 1) {
		return fmt.Errorf("rate: must be a finite number > 0, got %v", l.Rate)
	}
	return nil
}

// Scale returns l with both capacity and rate multiplied by f.
func (l Limit) Scale(f float64) Limit { return Limit{Capacity: l.Capacity * f, Rate: l.Rate * f} }

// Decision is the outcome of one Take.
type Decision struct {
	Allowed bool
	Tokens  float64 // left after the call
	// RetryAfter is, when denied, how long until the bucket holds the cost;
	// 0 when allowed, and 0 with Never when the cost exceeds the capacity.
	RetryAfter time.Duration
	Never      bool
}

// Buckets holds one bucket per client. It is safe for concurrent use. A
// bucket that has refilled completely is indistinguishable from a new one,
// so such buckets are dropped once the map has doubled since the last sweep;
// memory therefore tracks the clients active within one refill time.
type Buckets struct {
	now func() time.Time

	mu        sync.Mutex
	m         map[string]*state
	sweepSize int // sweep when len(m) reaches this
}

type state struct {
	tokens float64
	at     time.Time
	limit  Limit // as of the last Take: when the bucket is full again
}

// minSweep is the map size below which no sweep happens.
const minSweep = 1024

// New returns an empty set of buckets reading time from clock (time.Now when
// nil). Tests pass a fake clock.
func New(clock func() time.Time) *Buckets {
	if clock == nil {
		clock = time.Now
	}
	return &Buckets{now: clock, m: map[string]*state{}, sweepSize: minSweep}
}

// Take takes cost tokens from client's bucket, shaped by l, if it holds them.
// A limit that fails Validate, or a negative or NaN cost, is an error and
// changes nothing.
func (b *Buckets) Take(client string, l Limit, cost float64) (Decision, error) {
	if err := l.Validate(); err != nil {
		return Decision{}, err
	}
	if !(cost >= 0) || math.IsInf(cost, 1) {
		return Decision{}, fmt.Errorf("cost: must be a finite number >= 0, got %v", cost)
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.m[client]
	if s == nil {
		if len(b.m) >= b.sweepSize {
			b.sweep(now)
		}
		s = &state{tokens: l.Capacity, at: now}
		b.m[client] = s
	}
	s.limit = l
	// A clock that steps back refills nothing rather than taking tokens.
	if elapsed := now.Sub(s.at); elapsed > 0 {
		s.tokens = math.Min(l.Capacity, s.tokens+elapsed.Seconds()*l.Rate)
		s.at = now
	}
	// A plan that shrank leaves no more than the new capacity.
	s.tokens = math.Min(s.tokens, l.Capacity)
	if s.tokens >= cost {
		s.tokens -= cost
		return Decision{Allowed: true, Tokens: s.tokens}, nil
	}
	d := Decision{Tokens: s.tokens}
	if cost > l.Capacity {
		d.Never = true
	} else {
		d.RetryAfter = time.Duration(math.Ceil((cost - s.tokens) / l.Rate * float64(time.Second)))
	}
	return d, nil
}

// Len returns how many clients have a bucket.
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// sweep drops the buckets that are full again by now, then sets the next
// sweep at twice what is left, so that the cost stays amortised.
func (b *Buckets) sweep(now time.Time) {
	for k, s := range b.m {
		if s.tokens+now.Sub(s.at).Seconds()*s.limit.Rate >= s.limit.Capacity {
			delete(b.m, k)
		}
	}
	b.sweepSize = max(minSweep, 2*len(b.m))
}
