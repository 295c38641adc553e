// Package sidecaranswer makes the sidecar's answers to the filter's
// callouts, as the proxy hands them to the filter, for tests and benchmarks
// on every side of the filter: the behaviour table (filtertest), the
// limiter's own benchmarks, the headless host's. It imports the sidecar and
// nothing of the filter, so that the limiter's in-package benchmarks can
// use it too (filtertest imports the limiter).
//
// The result is the one tokenbucket.lua computes, with the same float64
// operations in the same order, and the headers are made by the sidecar's
// own code (server.Answer), so an answer here is exactly the real
// sidecar's, down to the rounding. Importing the sidecar is what keeps the
// two from drifting apart; the filter itself never imports it.
package sidecaranswer

import (
	"math"
	"strconv"
	"time"

	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// Check is the sidecar's answer to a check of cost under plan (capacity,
// rate) whose bucket holds tokens when the script runs.
func Check(plan string, capacity, rate, tokens float64, cost int64) [][2]string {
	p := &plans.Plan{Name: plan, Capacity: capacity, Rate: rate, LimitHeader: strconv.FormatFloat(capacity, 'f', -1, 64)}
	return headers(scriptResult(capacity, rate, tokens, cost), p)
}

// Warm is the sidecar's answer to the filter's warm-up call: a peek (cost
// 0) at a bucket nobody spent from, answered with the sidecar's warm-up
// plan.
func Warm() [][2]string {
	l := server.WarmLimit
	return headers(scriptResult(l.Capacity, l.Rate, l.Capacity, 0), &server.WarmPlan)
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

// scriptResult is what tokenbucket.lua replies, as lua.ParseReply reads it,
// for a bucket holding tokens (already refilled to now).
func scriptResult(capacity, rate, tokens float64, cost int64) lua.Result {
	c := float64(cost)
	var r lua.Result
	switch {
	case c > capacity:
		r.Never = true
	case tokens < c:
		r.RetryMs = (c - tokens) / rate * 1000
	default:
		r.Allowed = true
		if cost > 0 {
			tokens -= c
		}
	}
	r.Tokens = tokens
	r.ResetMs = (capacity - tokens) / rate * 1000
	r.RetryAfter, r.ResetAfter = ceilNs(r.RetryMs), ceilNs(r.ResetMs)
	return r
}

func ceilNs(ms float64) time.Duration {
	ns := math.Ceil(ms * 1e6)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
