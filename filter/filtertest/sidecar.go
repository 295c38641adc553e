package filtertest

import "github.com/edgelimit/edgelimit/filter/filtertest/sidecaranswer"

// SidecarAnswer is the sidecar's answer to a check of cost under plan
// (capacity, rate) whose bucket holds tokens when the script runs, exactly
// as the real sidecar makes it (package sidecaranswer).
func SidecarAnswer(plan string, capacity, rate, tokens float64, cost int64) []Header {
	return sidecaranswer.Check(plan, capacity, rate, tokens, cost)
}

// WarmAnswer is the sidecar's answer to the filter's warm-up call
// (WarmUpCall).
func WarmAnswer() []Header { return sidecaranswer.Warm() }

// WarmUpCall reports whether a callout's headers are the filter's warm-up
// call to the sidecar (POST /v1/warm) rather than a check.
func WarmUpCall(headers []Header) bool {
	method, _ := Get(headers, ":method")
	path, _ := Get(headers, ":path")
	return method == "POST" && path == "/v1/warm"
}
