// Package sidecaranswer makes the sidecar's answers to the filter's
// callouts, as the proxy hands them to the filter, for tests and benchmarks
// on every side of the filter: the behaviour table (filtertest), the
// limiter's own benchmarks, the headless host's. It imports the sidecar and
// nothing of the filter, so that the limiter's in-package benchmarks can
// use it too (filtertest imports the limiter).
//
// The result is the one tokenbucket.lua computes, for a bucket holding
// given tokens (Check) or kept over time as the script keeps it (Bucket),
// with the same float64 operations in the same order, and the headers are
// made by the sidecar's own code (server.Answer), so an answer here is
// exactly the real sidecar's, down to the rounding. Importing the sidecar
// is what keeps the two from drifting apart; the filter itself never
// imports it.
package sidecaranswer

import (
	"math"
	"strconv"

	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// Check is the sidecar's answer to a check of cost under plan (capacity,
// rate) whose bucket holds tokens when the script runs.
func Check(plan string, capacity, rate, tokens float64, cost int64) [][2]string {
	return headers(decide(capacity, rate, tokens, cost), planOf(plan, capacity, rate))
}

// planOf is the plan name with capacity and rate, as the sidecar loads it.
func planOf(name string, capacity, rate float64) *plans.Plan {
	return &plans.Plan{Name: name, Capacity: capacity, Rate: rate, LimitHeader: strconv.FormatFloat(capacity, 'f', -1, 64)}
}

// Warm is the sidecar's answer to the filter's warm-up call: a peek (cost
// 0) at a bucket nobody spent from, answered with the sidecar's warm-up
// plan.
func Warm() [][2]string {
	l := server.WarmLimit
	return headers(decide(l.Capacity, l.Rate, l.Capacity, 0), &server.WarmPlan)
}

// Bucket is one client's bucket as tokenbucket.lua keeps it in Redis: the
// tokens and the time (Redis's, in whole microseconds, as TIME gives it) of
// the script's last write, or nothing for a client never seen, which reads
// as full. Its calls run the script's arithmetic, the same float64
// operations in the same order, and write only when the script writes: on
// an admission of a cost above 0 (a denial, a peek and a cost above the
// capacity leave the bucket as it was, but that a denial or a cost above
// the capacity restamps a bucket written at a time after now, Redis's
// clock having stepped back since). The key's expiry is not kept: it
// comes at least a second after the refill has reached the capacity, when
// the bucket reads as full either way.
type Bucket struct {
	Capacity, Rate float64 // tokens, tokens per second

	written bool
	tokens  float64 // as written: %.17g reads back as the same double
	ts      int64   // µs
}

// NewBucket is the bucket of a client never seen under (capacity, rate).
func NewBucket(capacity, rate float64) *Bucket {
	return &Bucket{Capacity: capacity, Rate: rate}
}

// Level is what the script reads the bucket to hold at Redis time now
// (µs): the written tokens refilled for the time since the write, never
// backwards, capped at the capacity.
func (b *Bucket) Level(now int64) float64 {
	if !b.written {
		return b.Capacity
	}
	// Both times are integers below 2^53, so the script's difference of
	// doubles is exact, as this one is.
	elapsed := float64(now - b.ts)
	if elapsed < 0 {
		elapsed = 0
	}
	return math.Min(b.Capacity, b.tokens+elapsed*b.Rate/1000000)
}

// Take runs the script for a call of cost at Redis time now (µs) and
// returns its result, as lua.ParseReply reads it.
func (b *Bucket) Take(now, cost int64) lua.Result {
	r := decide(b.Capacity, b.Rate, b.Level(now), cost)
	switch {
	case r.Allowed && cost > 0:
		b.written, b.tokens, b.ts = true, r.Tokens, now
	case !r.Allowed && b.written && now < b.ts:
		b.ts = now
	}
	return r
}

// Check is the sidecar's answer to a check of cost under plan at Redis time
// now (µs), whose bucket is b (plan's capacity and rate are b's).
func (b *Bucket) Check(plan string, now, cost int64) [][2]string {
	return headers(b.Take(now, cost), planOf(plan, b.Capacity, b.Rate))
}

// headers are the headers of the sidecar's answer for res under p, as the
// proxy hands them to the filter.
func headers(res lua.Result, p *plans.Plan) [][2]string {
	var a server.Answer
	a.Fill(res, p)
	h := [][2]string{{":status", strconv.Itoa(a.Status)}, {"content-length", "0"}}
	for i := range a.Len() {
		name, v := a.Field(i)
		h = append(h, [2]string{name, string(v)})
	}
	return h
}

// decide is the script's answer to a call of cost under (capacity, rate)
// on a bucket that holds tokens (lua.Decide).
func decide(capacity, rate, tokens float64, cost int64) lua.Result {
	return lua.Decide(lua.Limit{Capacity: capacity, Rate: rate}, tokens, cost)
}
