package limiter

import (
	"math"
	"strconv"
)

// Outcome is what a sidecar answer means for the request.
type Outcome uint8

// Outcomes of a callout.
const (
	// Allowed: 200 with the rate-limit headers.
	Allowed Outcome = iota
	// Denied: 429 with retry-after and the rate-limit headers.
	Denied
	// FailedOpen: anything else; the request goes on unlimited.
	FailedOpen
	// UnknownKey: 403, the key is not in the sidecar's plans and there is
	// no default plan. A decision, not a failure: the request is refused.
	UnknownKey
)

// Reason says why a request failed open. Each has its own counter,
// edgelimit.requests.failed_open.<name>.
type Reason uint8

// Reasons to fail open.
const (
	// ReasonTimeout: the callout timed out (Envoy answers it with a 504).
	ReasonTimeout Reason = iota
	// ReasonUnavailable: 503, from Envoy (no connection to the sidecar) or
	// from the sidecar (Redis down or slower than its own deadline).
	ReasonUnavailable
	// ReasonReset: the callout's stream was reset (a callback without
	// headers).
	ReasonReset
	// ReasonDispatch: proxy_http_call itself failed; no callback will come.
	ReasonDispatch
	// ReasonStatus: any other status (400 included).
	ReasonStatus
	// ReasonMalformed: no valid :status, or a 200/429 without the headers
	// the sidecar contract promises.
	ReasonMalformed
	// ReasonInternal: the filter recovered from a panic.
	ReasonInternal
	// ReasonCircuitOpen: the circuit breaker is open, so no callout was
	// made (breaker.go).
	ReasonCircuitOpen
	numReasons
)

var reasonNames = [numReasons]string{"timeout", "unavailable", "reset", "dispatch", "status", "malformed", "internal", "circuit_open"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Answer is a sidecar answer, read from the callout's response headers.
type Answer struct {
	Outcome Outcome
	// Reason and Detail (for logs) are set when Outcome is FailedOpen.
	Reason Reason
	Detail string
	// Status is the response's :status, 0 when it had none.
	Status int
	// From ratelimit-limit, ratelimit-remaining, ratelimit-reset (seconds),
	// x-ratelimit-plan.
	Limit, Remaining, Reset int64
	Plan                    string
	// RetryAfter is retry-after in seconds (429 only, at least 1).
	RetryAfter int64
	// Tokens (x-ratelimit-tokens) and RetryAfterMs
	// (x-ratelimit-retry-after-ms, 429 only) are the exact bucket state the
	// deny cache needs; Has* say whether they were present and valid.
	Tokens       float64
	HasTokens    bool
	RetryAfterMs float64
	HasRetryMs   bool
	// Rate is x-ratelimit-rate, the plan's refill in tokens per second
	// (finite, > 0); on_failure "local" learns the plan from it.
	Rate    float64
	HasRate bool
}

// ParseAnswer reads the headers of a callout response that arrived (a reset,
// with no headers at all, is the caller's ReasonReset).
func ParseAnswer(headers [][2]string) Answer {
	status, ok := count(header(headers, ":status"))
	if !ok || status < 100 || status > 999 {
		return failed(ReasonMalformed, "sidecar response without a valid :status", 0)
	}
	a := Answer{Status: int(status)}
	switch status {
	case 200, 429:
	case 403:
		a.Outcome = UnknownKey
		return a
	case 503:
		return failed(ReasonUnavailable, "sidecar answered 503", 503)
	case 504:
		return failed(ReasonTimeout, "sidecar answered 504", 504)
	default:
		return failed(ReasonStatus, "sidecar answered "+strconv.FormatInt(status, 10), int(status))
	}
	var okL, okR, okT bool
	a.Limit, okL = count(header(headers, "ratelimit-limit"))
	a.Remaining, okR = count(header(headers, "ratelimit-remaining"))
	a.Reset, okT = count(header(headers, "ratelimit-reset"))
	if !okL || !okR || !okT {
		return failed(ReasonMalformed, "sidecar answered "+strconv.FormatInt(status, 10)+
			" without valid ratelimit-limit, ratelimit-remaining and ratelimit-reset", a.Status)
	}
	a.Plan = header(headers, "x-ratelimit-plan")
	a.Tokens, a.HasTokens = decimal(header(headers, "x-ratelimit-tokens"))
	a.Rate, a.HasRate = decimal(header(headers, "x-ratelimit-rate"))
	a.HasRate = a.HasRate && a.Rate > 0
	if status == 200 {
		a.Outcome = Allowed
		return a
	}
	a.RetryAfter, ok = count(header(headers, "retry-after"))
	if !ok {
		return failed(ReasonMalformed, "sidecar answered 429 without a valid retry-after", a.Status)
	}
	// retry-after is at least 1 by contract; a 0 would tell clients to
	// retry at once into the same denial.
	a.RetryAfter = max(a.RetryAfter, 1)
	a.RetryAfterMs, a.HasRetryMs = decimal(header(headers, "x-ratelimit-retry-after-ms"))
	a.Outcome = Denied
	return a
}

func failed(r Reason, detail string, status int) Answer {
	return Answer{Outcome: FailedOpen, Reason: r, Detail: detail, Status: status}
}

// header returns the first value of name, "" when absent.
func header(headers [][2]string, name string) string {
	for _, h := range headers {
		if h[0] == name {
			return h[1]
		}
	}
	return ""
}

// maxCountDigits keeps counts well inside int64 and float64's exact range.
const maxCountDigits = 15

// count parses a non-negative decimal integer of digits only.
func count(s string) (int64, bool) {
	if s == "" || len(s) > maxCountDigits {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// decimal parses a finite non-negative decimal number ("12", "0.5",
// "1e-05": Lua's tostring), refusing what ParseFloat would also take but the
// sidecar never sends (hex, infinities, NaN, underscores).
func decimal(s string) (float64, bool) {
	if s == "" || len(s) > 64 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-' {
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// rateLimitHeaders are the response headers that tell a client its limit:
// RateLimit-Policy and RateLimit of the IETF httpapi ratelimit-headers draft
// (structured-field lists; the policy is named after the plan), and the
// legacy ratelimit-limit/remaining/reset trio many clients still read.
func rateLimitHeaders(plan string, limit, remaining, reset int64) [][2]string {
	var t text
	return appendRateLimitHeaders(nil, &t, plan, limit, remaining, reset)
}

// appendRateLimitHeaders appends rateLimitHeaders to dst, the values
// formatted into t.
func appendRateLimitHeaders(dst [][2]string, t *text, plan string, limit, remaining, reset int64) [][2]string {
	id := t.policyID(plan)
	l, r, rs := t.int(limit), t.int(remaining), t.int(reset)
	return append(dst,
		[2]string{"ratelimit-policy", t.cat(id, ";q=", l)},
		[2]string{"ratelimit", t.cat(id, ";r=", r, ";t=", rs)},
		[2]string{"ratelimit-limit", l},
		[2]string{"ratelimit-remaining", r},
		[2]string{"ratelimit-reset", rs})
}

// maxPlanLen bounds the plan name copied into a response header.
const maxPlanLen = 64

// policyID is the plan's name as a structured-field string, or "default"
// when the sidecar sent none or one that is not printable ASCII.
func (t *text) policyID(plan string) string {
	const fallback = `"default"`
	if plan == "" || len(plan) > maxPlanLen {
		return fallback
	}
	m := len(t.b)
	t.b = append(t.b, '"')
	for i := 0; i < len(plan); i++ {
		c := plan[i]
		if c < 0x20 || c > 0x7e {
			t.b = t.b[:m]
			return fallback
		}
		if c == '"' || c == '\\' {
			t.b = append(t.b, '\\')
		}
		t.b = append(t.b, c)
	}
	t.b = append(t.b, '"')
	return t.since(m)
}
