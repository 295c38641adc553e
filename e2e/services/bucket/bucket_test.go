package bucket

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.t.Store(time.Date(2025, 9, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time      { return time.Unix(0, c.t.Load()) }
func (c *fakeClock) add(d time.Duration) { c.t.Add(int64(d)) }

func TestTake(t *testing.T) {
	l := Limit{Capacity: 3, Rate: 2}
	type step struct {
		after   time.Duration // advance the clock first
		cost    float64
		limit   Limit
		allowed bool
		tokens  float64
		retry   time.Duration
		never   bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a new bucket is full and a burst drains it", []step{
			{cost: 1, allowed: true, tokens: 2},
			{cost: 1, allowed: true, tokens: 1},
			{cost: 1, allowed: true, tokens: 0},
			{cost: 1, allowed: false, tokens: 0, retry: 500 * time.Millisecond},
		}},
		{"refill at rate, capped at capacity", []step{
			{cost: 3, allowed: true, tokens: 0},
			{after: 250 * time.Millisecond, cost: 1, allowed: false, tokens: 0.5, retry: 250 * time.Millisecond},
			{after: 250 * time.Millisecond, cost: 1, allowed: true, tokens: 0},
			{after: time.Hour, cost: 0, allowed: true, tokens: 3},
		}},
		{"cost above capacity never passes", []step{
			{cost: 4, allowed: false, tokens: 3, never: true},
			{cost: 3, allowed: true, tokens: 0},
		}},
		{"a denial takes nothing", []step{
			{cost: 2, allowed: true, tokens: 1},
			{cost: 2, allowed: false, tokens: 1, retry: 500 * time.Millisecond},
			{cost: 1, allowed: true, tokens: 0},
		}},
		{"a clock that steps back refills nothing", []step{
			{cost: 3, allowed: true, tokens: 0},
			{after: -time.Second, cost: 1, allowed: false, tokens: 0, retry: 500 * time.Millisecond},
			{after: time.Second + 500*time.Millisecond, cost: 1, allowed: true, tokens: 0},
		}},
		{"a plan that shrinks caps what is left", []step{
			{cost: 1, allowed: true, tokens: 2},
			{cost: 0, limit: Limit{Capacity: 1, Rate: 1}, allowed: true, tokens: 1},
		}},
		{"fractional rates", []step{
			{cost: 3, limit: Limit{Capacity: 3, Rate: 0.1}, allowed: true, tokens: 0},
			{after: 5 * time.Second, cost: 1, limit: Limit{Capacity: 3, Rate: 0.1}, allowed: false, tokens: 0.5, retry: 5 * time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			b := New(clk.now)
			for i, s := range tt.steps {
				clk.add(s.after)
				lim := l
				if s.limit != (Limit{}) {
					lim = s.limit
				}
				d, err := b.Take("alice", lim, s.cost)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if d.Allowed != s.allowed || math.Abs(d.Tokens-s.tokens) > 1e-9 || d.RetryAfter != s.retry || d.Never != s.never {
					t.Fatalf("step %d: got %+v, want allowed=%v tokens=%v retry=%v never=%v", i, d, s.allowed, s.tokens, s.retry, s.never)
				}
			}
		})
	}
}

func TestClientsAreIndependent(t *testing.T) {
	clk := newClock()
	b := New(clk.now)
	l := Limit{Capacity: 1, Rate: 1}
	for _, c := range []string{"a", "b", "c"} {
		if d, _ := b.Take(c, l, 1); !d.Allowed {
			t.Fatalf("first request of %s denied", c)
		}
	}
	if d, _ := b.Take("a", l, 1); d.Allowed {
		t.Fatal("second request of a allowed with an empty bucket")
	}
}

func TestTakeRejectsBadInput(t *testing.T) {
	tests := []struct {
		limit Limit
		cost  float64
		want  string
	}{
		{Limit{0, 1}, 1, "capacity: must be a finite number > 0, got 0"},
		{Limit{math.Inf(1), 1}, 1, "capacity: must be a finite number > 0, got +Inf"},
		{Limit{1, -2}, 1, "rate: must be a finite number > 0, got -2"},
		{Limit{1, math.NaN()}, 1, "rate: must be a finite number > 0, got NaN"},
		{Limit{1, 1}, -1, "cost: must be a finite number >= 0, got -1"},
		{Limit{1, 1}, math.NaN(), "cost: must be a finite number >= 0, got NaN"},
	}
	for _, tt := range tests {
		b := New(nil)
		_, err := b.Take("x", tt.limit, tt.cost)
		if err == nil || err.Error() != tt.want {
			t.Errorf("Take(%+v, %v): error %v, want %q", tt.limit, tt.cost, err, tt.want)
		}
		if b.Len() != 0 {
			t.Errorf("Take(%+v, %v): a rejected call created a bucket", tt.limit, tt.cost)
		}
	}
}

func TestSweepDropsOnlyFullBuckets(t *testing.T) {
	clk := newClock()
	b := New(clk.now)
	slow := Limit{Capacity: 1, Rate: 0.001} // 1000 s to refill
	fast := Limit{Capacity: 1, Rate: 1000}  // 1 ms to refill
	for i := 0; i < minSweep/2; i++ {
		b.Take("slow"+strconv.Itoa(i), slow, 1)
		b.Take("fast"+strconv.Itoa(i), fast, 1)
	}
	clk.add(time.Second)
	b.Take("one more", fast, 1) // the map is at minSweep: this sweeps
	if got, want := b.Len(), minSweep/2+1; got != want {
		t.Fatalf("after the sweep %d buckets, want %d (the slow ones and the new one)", got, want)
	}
	// A swept client starts again from a full bucket, as it would have.
	if d, _ := b.Take("fast0", fast, 1); !d.Allowed {
		t.Fatal("a swept client was denied")
	}
	// A kept client still has its empty bucket.
	if d, _ := b.Take("slow0", slow, 1); d.Allowed {
		t.Fatal("a kept client lost its state")
	}
}

// TestHammer: with the clock frozen, concurrent takers together get exactly
// the capacity, never a token twice.
func TestHammer(t *testing.T) {
	clk := newClock()
	b := New(clk.now)
	const capacity, goroutines, each = 500, 8, 200
	l := Limit{Capacity: capacity, Rate: 1}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if d, _ := b.Take("shared", l, 1); d.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != capacity {
		t.Fatalf("allowed %d, want exactly %d", allowed.Load(), capacity)
	}
}
