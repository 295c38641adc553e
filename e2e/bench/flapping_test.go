package main

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/internal/redisproc"
)

// TestFlappingPausesLastTheirLength runs startFlapping with the fail-open
// bench's flapping phase (failFlapPause in every failFlapEvery) on a real
// redis-server and times, with a PING sent again as soon as the last one
// came back, how long each of ten pauses held Redis's clients.
//
// Numbers: Redis ends a CLIENT PAUSE at the first run of its cron after
// the pause's time is up, and the cron runs hz times a second. At hz 10
// (its default) that is the next 100 ms boundary: a 50 ms pause started
// φ ms after a run holds 100 − φ ms if φ ≤ 50, else 200 − φ, and the next
// one, 150 ms later, starts at φ + 50 (mod 100), so that of two pauses in
// a row one holds 100 ms or more: at least five of ten more than the pause
// and 10 ms (six to eight measured). At flapHz (500) the cron runs every
// 2 ms: a pause may hold 10 ms more than its time (the cron's 2 and 8 for
// a busy 2-core machine to schedule Redis and this test), and up to three
// of ten more than that, for a stall of the shared machine.
func TestFlappingPausesLastTheirLength(t *testing.T) {
	const (
		pauses  = 10
		slack   = 10 * time.Millisecond
		stalled = 3
	)
	s := redisproc.StartT(t, redisproc.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stop, err := startFlapping(ctx, &rig.Backend{Redis: s}, failFlapPause, failFlapEvery)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c := s.Client(t)
	var held []time.Duration
	for len(held) < pauses {
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// A PING sent while a pause is under way waits out its rest; the
		// first one after a pause begins, nearly all of it.
		if d := time.Since(start); d > failFlapPause/2 {
			held = append(held, d)
		}
	}
	stop()
	over := 0
	for _, d := range held {
		if d > failFlapPause+slack {
			over++
		}
	}
	t.Logf("pauses of %v held Redis's clients %v", failFlapPause, held)
	if over > stalled {
		t.Errorf("%d of %d pauses of %v held Redis's clients more than %v longer (%v); at most %d may, for a stall of the machine", over, pauses, failFlapPause, slack, held, stalled)
	}
}
