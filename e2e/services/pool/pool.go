// Package pool gives a service finite capacity, the way a fixed pool of
// worker threads does: Workers requests are served at once, each holding its
// worker for ServiceTime; up to Queue more wait in line, first come first
// served; past that a request is refused at once. Throughput is therefore
// capped at Workers/ServiceTime, and once arrivals exceed it latency rises
// with the queue, to about ServiceTime*(1+Queue/Workers).
//
// The service time is spent sleeping, not computing, so that a benchmark's
// services cost the machine almost nothing and the latency they add comes
// from the queue, not from CPU contention with the proxy under test.
package pool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// ErrFull is returned when every worker is busy and the queue is full.
var ErrFull = errors.New("pool: every worker busy and the queue full")

// Config shapes a Pool.
type Config struct {
	Workers     int           // served at once; >= 1
	Queue       int           // waiting at most; >= 0 (0: no queue)
	ServiceTime time.Duration // each request holds its worker this long; >= 0
	// Sleep spends the service time; it returns early with ctx's error if
	// ctx ends. Defaults to a timer. Tests replace it to hold workers.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Stats counts what a pool did.
type Stats struct {
	Served    int64 `json:"served"`     // held a worker for the full service time
	Rejected  int64 `json:"rejected"`   // refused: queue full
	Abandoned int64 `json:"abandoned"`  // the caller gave up (context ended)
	InFlight  int64 `json:"in_flight"`  // holding a worker now
	Queued    int64 `json:"queued"`     // waiting now
	MaxQueued int64 `json:"max_queued"` // the longest the queue has been
}

// Pool is a bounded set of workers with a bounded queue. It is safe for
// concurrent use.
type Pool struct {
	c     Config
	slots chan struct{} // one per busy worker

	served, rejected, abandoned atomic.Int64
	inFlight, queued, maxQueued atomic.Int64
}

// New checks c and returns its pool.
func New(c Config) (*Pool, error) {
	if c.Workers < 1 {
		return nil, fmt.Errorf("workers: must be >= 1, got %d", c.Workers)
	}
	if c.Queue < 0 {
		return nil, fmt.Errorf("queue: must be >= 0, got %d", c.Queue)
	}
	if c.ServiceTime < 0 {
		return nil, fmt.Errorf("service time: must be >= 0, got %v", c.ServiceTime)
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	return &Pool{c: c, slots: make(chan struct{}, c.Workers)}, nil
}

// Capacity returns the most requests per second the pool can serve.
func (p *Pool) Capacity() float64 {
	if p.c.ServiceTime == 0 {
		return 0 // unbounded
	}
	return float64(p.c.Workers) / p.c.ServiceTime.Seconds()
}

// Serve waits for a worker, holds it for the service time and releases it.
// It returns ErrFull at once when the queue is full, and ctx's error if ctx
// ends first.
func (p *Pool) Serve(ctx context.Context) error {
	if err := p.acquire(ctx); err != nil {
		return err
	}
	p.inFlight.Add(1)
	err := p.c.Sleep(ctx, p.c.ServiceTime)
	p.inFlight.Add(-1)
	<-p.slots
	if err != nil {
		p.abandoned.Add(1)
		return err
	}
	p.served.Add(1)
	return nil
}

func (p *Pool) acquire(ctx context.Context) error {
	select {
	case p.slots <- struct{}{}:
		return nil
	default:
	}
	n := p.queued.Add(1)
	if n > int64(p.c.Queue) {
		p.queued.Add(-1)
		p.rejected.Add(1)
		return ErrFull
	}
	for {
		m := p.maxQueued.Load()
		if n <= m || p.maxQueued.CompareAndSwap(m, n) {
			break
		}
	}
	defer p.queued.Add(-1)
	// Goroutines blocked sending on a channel are woken in the order they
	// blocked: the queue is first come, first served.
	select {
	case p.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		p.abandoned.Add(1)
		return ctx.Err()
	}
}

// Handler returns next behind the pool: a request waits for a worker,
// holds it for the service time, then next answers it. A full queue gets
// 503 with Retry-After: 1.
func (p *Pool) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch err := p.Serve(r.Context()); {
		case err == nil:
			next.ServeHTTP(w, r)
		case errors.Is(err, ErrFull):
			w.Header().Set("retry-after", "1")
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		default:
			// The client is gone; nobody reads an answer.
		}
	})
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{
		Served:    p.served.Load(),
		Rejected:  p.rejected.Load(),
		Abandoned: p.abandoned.Load(),
		InFlight:  p.inFlight.Load(),
		Queued:    p.queued.Load(),
		MaxQueued: p.maxQueued.Load(),
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
