package pool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

type idKey struct{}

// gate is a Sleep that holds each worker until the test releases it, and
// records the order in which requests got a worker.
type gate struct {
	release chan struct{}
	started chan int
}

func newGate() *gate { return &gate{release: make(chan struct{}), started: make(chan int, 100)} }

func (g *gate) sleep(ctx context.Context, _ time.Duration) error {
	id, _ := ctx.Value(idKey{}).(int)
	g.started <- id
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitStats polls the pool's stats for up to 10 s until cond holds; a
// failure shows the last stats seen.
func waitStats(t *testing.T, p *Pool, what string, cond func(Stats) bool) {
	t.Helper()
	testkit.PollErr(t, 10*time.Second, what, func() error {
		if s := p.Stats(); !cond(s) {
			return fmt.Errorf("stats %+v", s)
		}
		return nil
	})
}

func TestQueueBoundsAndOrder(t *testing.T) {
	g := newGate()
	p, err := New(Config{Workers: 2, Queue: 3, ServiceTime: time.Second, Sleep: g.sleep})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 10)
	serve := func(id int) {
		go func() { errs <- p.Serve(context.WithValue(context.Background(), idKey{}, id)) }()
	}
	serve(1)
	serve(2)
	waitStats(t, p, "two in flight", func(s Stats) bool { return s.InFlight == 2 })
	// One at a time, so that the order they join the queue is known.
	for id := 3; id <= 5; id++ {
		serve(id)
		want := int64(id - 2)
		waitStats(t, p, "queued", func(s Stats) bool { return s.Queued == want })
	}
	if err := p.Serve(context.Background()); !errors.Is(err, ErrFull) {
		t.Fatalf("sixth request: %v, want ErrFull", err)
	}
	got := []int{<-g.started, <-g.started}
	for i := 0; i < 5; i++ {
		g.release <- struct{}{}
		if i < 3 {
			got = append(got, <-g.started)
		}
	}
	for i := 0; i < 5; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("served request failed: %v", err)
		}
	}
	// The first two in either order, then the queue in arrival order.
	if got[2] != 3 || got[3] != 4 || got[4] != 5 {
		t.Fatalf("workers taken in order %v, want the queue served 3, 4, 5", got)
	}
	s := p.Stats()
	want := Stats{Served: 5, Rejected: 1, MaxQueued: 3}
	if s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
}

func TestAbandonedWhileQueued(t *testing.T) {
	g := newGate()
	p, err := New(Config{Workers: 1, Queue: 1, Sleep: g.sleep})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- p.Serve(context.Background()) }()
	waitStats(t, p, "one in flight", func(s Stats) bool { return s.InFlight == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- p.Serve(ctx) }()
	waitStats(t, p, "one queued", func(s Stats) bool { return s.Queued == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued request: %v, want context.Canceled", err)
	}
	g.release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Abandoned != 1 || s.Served != 1 || s.Queued != 0 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestHandler(t *testing.T) {
	g := newGate()
	p, err := New(Config{Workers: 1, Queue: 0, Sleep: g.sleep})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	first := make(chan *httptest.ResponseRecorder)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		first <- w
	}()
	waitStats(t, p, "one in flight", func(s Stats) bool { return s.InFlight == 1 })
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("retry-after") != "1" {
		t.Fatalf("over capacity: %d %v, want 503 with retry-after 1", w.Code, w.Header())
	}
	g.release <- struct{}{}
	if w := <-first; w.Code != http.StatusOK || w.Body.String() != "ok" {
		t.Fatalf("served: %d %q", w.Code, w.Body.String())
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		c        Config
		err      string
		capacity float64
	}{
		{Config{Workers: 0}, "workers: must be >= 1, got 0", 0},
		{Config{Workers: 1, Queue: -1}, "queue: must be >= 0, got -1", 0},
		{Config{Workers: 1, ServiceTime: -time.Second}, "service time: must be >= 0, got -1s", 0},
		{Config{Workers: 4, ServiceTime: 20 * time.Millisecond}, "", 200},
		{Config{Workers: 4}, "", 0},
	}
	for _, tt := range tests {
		p, err := New(tt.c)
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("New(%+v): %v, want %q", tt.c, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("New(%+v): %v", tt.c, err)
		}
		if got := p.Capacity(); got != tt.capacity {
			t.Errorf("New(%+v).Capacity() = %v, want %v", tt.c, got, tt.capacity)
		}
	}
}

// TestDefaultSleep runs the default timer: a request is served once its
// service time has passed, and a caller that gives up abandons its worker.
func TestDefaultSleep(t *testing.T) {
	p, err := New(Config{Workers: 1, Queue: 1, ServiceTime: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	slow, err := New(Config{Workers: 1, ServiceTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- slow.Serve(ctx) }()
	waitStats(t, slow, "one in flight", func(s Stats) bool { return s.InFlight == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned request: %v, want context.Canceled", err)
	}
	if s, sl := p.Stats(), slow.Stats(); s.Served != 1 || sl.Abandoned != 1 || sl.InFlight != 0 {
		t.Fatalf("stats %+v and %+v", s, sl)
	}
}
