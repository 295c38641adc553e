package filtertest

import (
	"math"
	"strconv"
	"time"

	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// SidecarAnswer is the sidecar's answer to a check of cost under plan
// (capacity, rate) whose bucket holds tokens when the script runs. The
// result is the one tokenbucket.lua computes, with the same float64
// operations in the same order, and the headers are made by the sidecar's
// own code (server.Answer), so the table's model answers exactly as the real
// sidecar does, down to the rounding.
//
// filtertest is test support; importing the sidecar here is what keeps the
// two from drifting apart. The filter itself never imports it.
func SidecarAnswer(plan string, capacity, rate, tokens float64, cost int64) []Header {
	p := &plans.Plan{Name: plan, Capacity: capacity, Rate: rate, LimitHeader: strconv.FormatFloat(capacity, 'f', -1, 64)}
	return answerHeaders(scriptResult(capacity, rate, tokens, cost), p)
}

// WarmAnswer is the sidecar's answer to the filter's warm-up call
// (WarmUpCall): a peek (cost 0) at a bucket nobody spent from, answered with
// the sidecar's warm-up plan.
func WarmAnswer() []Header {
	l := server.WarmLimit
	return answerHeaders(scriptResult(l.Capacity, l.Rate, l.Capacity, 0), &server.WarmPlan)
}

// answerHeaders are the headers of the sidecar's answer for res under p, as
// the proxy hands them to the filter.
func answerHeaders(res lua.Result, p *plans.Plan) []Header {
	var a server.Answer
	a.Fill(res, p)
	h := []Header{{":status", strconv.Itoa(a.Status)}, {"content-length", "0"}}
	for i := range a.Len() {
		name, v := a.Field(i)
		h = append(h, Header{name, string(v)})
	}
	return h
}

// WarmUpCall reports whether a callout's headers are the filter's warm-up
// call to the sidecar (POST /v1/warm) rather than a check.
func WarmUpCall(headers []Header) bool {
	method, _ := Get(headers, ":method")
	path, _ := Get(headers, ":path")
	return method == "POST" && path == "/v1/warm"
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
