package limiter

import (
	"math"
	"strconv"

	"github.com/edgelimit/edgelimit/internal/seconds"
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
	// from the sidecar (Redis down or slower than its own deadline); the
	// log line tells which (UnavailableDetail).
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
	// Never is x-ratelimit-never: true (429 only): the cost is above the
	// capacity, no wait helps.
	Never bool
	// Tokens (x-ratelimit-tokens) is the bucket's exact state after the
	// decision; HasTokens says whether it was present and valid.
	Tokens    float64
	HasTokens bool
	// Rate is x-ratelimit-rate, the plan's refill in tokens per second
	// (finite, > 0); the deny cache and on_failure "local" use it as it is,
	// never a rate derived from a rounded wait.
	Rate    float64
	HasRate bool
	// BucketRate is what the exact tokens refill at when that is less than
	// Rate: a hot client's region bucket's share of the plan's rate
	// (x-ratelimit-bucket-rate); 0 when they refill at Rate. What the
	// client is told of when quota comes back (t, a cached denial's
	// Retry-After) is figured from it; what bounds the bucket (the deny
	// cache's denials) is figured from Rate, which no share of the plan
	// exceeds.
	BucketRate float64
}

// ParseAnswer reads the headers of a callout response that arrived (a reset,
// with no headers at all, is the caller's ReasonReset).
func ParseAnswer(headers [][2]string) Answer {
	f := answerFieldsOf(headers)
	status, ok := count(f.get(fStatus))
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
	a.Limit, okL = count(f.get(fLimit))
	a.Remaining, okR = count(f.get(fRemaining))
	a.Reset, okT = count(f.get(fReset))
	if !okL || !okR || !okT {
		return failed(ReasonMalformed, "sidecar answered "+strconv.FormatInt(status, 10)+
			" without valid ratelimit-limit, ratelimit-remaining and ratelimit-reset", a.Status)
	}
	a.Plan = f.get(fPlan)
	// The exact tokens and rate are finite non-negative decimals ("12",
	// "0.5", "1e-05": Lua's tostring); what ParseFloat would also take but
	// the sidecar never sends (hex, infinities, NaN, underscores) is
	// refused. plainDecimal reads the common form, parseDecimal the rest;
	// written out here for each, as a helper would be one more call inside
	// wasm.
	if a.Tokens, a.HasTokens = plainDecimal(f.get(fTokens)); !a.HasTokens {
		a.Tokens, a.HasTokens = parseDecimal(f.get(fTokens))
	}
	if a.Rate, a.HasRate = plainDecimal(f.get(fRate)); !a.HasRate {
		a.Rate, a.HasRate = parseDecimal(f.get(fRate))
	}
	a.HasRate = a.HasRate && a.Rate > 0
	if v := f.get(fBucketRate); v != "" && a.HasRate {
		br, ok := plainDecimal(v)
		if !ok {
			br, ok = parseDecimal(v)
		}
		// A bucket rate that is not a share of the plan's (missing, not a
		// number, 0 or above the plan's) is read as the plan's: the waits
		// then are what they were before the sidecar sent it.
		if ok && br > 0 && br < a.Rate {
			a.BucketRate = br
		}
	}
	if status == 200 {
		a.Outcome = Allowed
		return a
	}
	a.RetryAfter, ok = count(f.get(fRetryAfter))
	if !ok {
		return failed(ReasonMalformed, "sidecar answered 429 without a valid retry-after", a.Status)
	}
	// retry-after is at least 1 by contract; a 0 would tell clients to
	// retry at once into the same denial.
	a.RetryAfter = max(a.RetryAfter, 1)
	a.Never = f.get(fNever) == "true"
	a.Outcome = Denied
	return a
}

// The answer's header fields, as indexes into answerFields.
const (
	fStatus = iota
	fLimit
	fRemaining
	fReset
	fPlan
	fTokens
	fRate
	fRetryAfter
	fNever
	fBucketRate
	numAnswerFields
)

// answerFields holds the first value of each header an answer is read
// from; a header that is absent reads as "".
type answerFields struct {
	v    [numAnswerFields]string
	seen [numAnswerFields]bool
}

func (f *answerFields) get(i int) string { return f.v[i] }

// answerFieldsOf picks the answer's headers out of headers in one pass.
// Inside wasm a scan per header, or a switch on the whole name (a binary
// search of string comparisons), costs more than the rest of the answer;
// so does even one string comparison per header (runtime.memequal's loop,
// a byte a turn). The name's length narrows it to one or two candidates,
// and its bytes are read as at most three little-endian words (nameWords),
// compared with the candidates' words made once.
func answerFieldsOf(headers [][2]string) answerFields {
	var f answerFields
	for _, h := range headers {
		name, i := h[0], -1
		// nameWords written out for each length, so that no header
		// costs a call.
		switch n := len(name); n {
		case len(":status"):
			i = answerWords.match(words{uint64(le32(name, 0)) | uint64(le32(name, n-4))<<32}, fStatus)
		case len("retry-after"):
			i = answerWords.match(words{le64(name, 0), le64(name, n-8)}, fRetryAfter)
		case len("ratelimit-limit"): // and ratelimit-reset
			w := words{le64(name, 0), le64(name, n-8)}
			if i = answerWords.match(w, fLimit); i < 0 {
				i = answerWords.match(w, fReset)
			}
		case len("x-ratelimit-plan"): // and x-ratelimit-rate
			w := words{le64(name, 0), le64(name, n-8)}
			if i = answerWords.match(w, fPlan); i < 0 {
				i = answerWords.match(w, fRate)
			}
		case len("x-ratelimit-never"):
			i = answerWords.match(words{le64(name, 0), le64(name, 8), le64(name, n-8)}, fNever)
		case len("x-ratelimit-tokens"):
			i = answerWords.match(words{le64(name, 0), le64(name, 8), le64(name, n-8)}, fTokens)
		case len("ratelimit-remaining"):
			i = answerWords.match(words{le64(name, 0), le64(name, 8), le64(name, n-8)}, fRemaining)
		case len("x-ratelimit-bucket-rate"):
			i = answerWords.match(words{le64(name, 0), le64(name, 8), le64(name, n-8)}, fBucketRate)
		}
		if i >= 0 && !f.seen[i] {
			f.v[i], f.seen[i] = h[1], true
		}
	}
	return f
}

// answerNames are the answer's header names, by field.
var answerNames = [numAnswerFields]string{
	fStatus: ":status", fLimit: "ratelimit-limit", fRemaining: "ratelimit-remaining",
	fReset: "ratelimit-reset", fPlan: "x-ratelimit-plan", fTokens: "x-ratelimit-tokens",
	fRate: "x-ratelimit-rate", fRetryAfter: "retry-after", fNever: "x-ratelimit-never",
	fBucketRate: "x-ratelimit-bucket-rate",
}

// words are a name's bytes as little-endian words (nameWords).
type words [3]uint64

type fieldWords [numAnswerFields]words

// answerWords holds the words of every answer header's name.
var answerWords = func() (w fieldWords) {
	for i, name := range answerNames {
		w[i] = nameWords(name)
	}
	return w
}()

// match is field when w are the words of its name, else -1. Only names of
// the same length may be compared so: the words cover every byte of a
// name of 4 to 24 bytes, from both ends.
func (fw *fieldWords) match(w words, field int) int {
	if w == fw[field] {
		return field
	}
	return -1
}

// nameWords reads a name of 4 to 24 bytes as words that cover all of its
// bytes, overlapping in the middle: two 4-byte halves in one word below 8
// bytes, two 8-byte words up to 16, three up to 24. Other lengths, which
// no answer header has, read as zero.
func nameWords(s string) words {
	switch n := len(s); {
	case n > 24 || n < 4:
		return words{}
	case n > 16:
		return words{le64(s, 0), le64(s, 8), le64(s, n-8)}
	case n >= 8:
		return words{le64(s, 0), le64(s, n-8)}
	default:
		return words{uint64(le32(s, 0)) | uint64(le32(s, n-4))<<32}
	}
}

func failed(r Reason, detail string, status int) Answer {
	return Answer{Outcome: FailedOpen, Reason: r, Detail: detail, Status: status}
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

// pow10 are the powers of ten a float64 holds exactly.
var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
	1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// plainDecimal is the fast path of ParseAnswer's decimals, for what the
// sidecar sends: digits, optionally a point and more digits, 15 digits at
// most, optionally an exponent ("1e+09", "2.5e-05": the shortest form Go
// and Lua give a large or small rate, an unlimited plan's among them). The
// digits then form an integer m < 2^53 and the value is m × 10^k or
// m / 10^k for some k <= 22, a product or quotient of two float64s that
// hold their values exactly; IEEE arithmetic rounds it correctly, so the
// result is ParseFloat's to the bit (FuzzDecimal checks this). ok is false
// for anything else, which parseDecimal reads. Inside wasm ParseFloat was
// the largest part of reading an answer (filter/RATIONALE.md, "Why the
// stream tables are not maps").
func plainDecimal(s string) (float64, bool) {
	if s == "" || len(s) > 24 {
		return 0, false
	}
	var m uint64
	digits, frac, point, exp := 0, 0, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			m = m*10 + uint64(c-'0')
			digits++
			if point {
				frac++
			}
		case c == '.' && !point && digits > 0 && i < len(s)-1:
			point = true
		case (c == 'e' || c == 'E') && digits > 0 && s[i-1] != '.':
			var ok bool
			if exp, ok = exponent(s[i+1:]); !ok {
				return 0, false
			}
			i = len(s)
		default:
			return 0, false
		}
	}
	if digits > 15 {
		return 0, false
	}
	switch k := exp - frac; {
	case k >= 0 && k < len(pow10):
		return float64(m) * pow10[k], true
	case k < 0 && -k < len(pow10):
		return float64(m) / pow10[-k], true
	}
	return 0, false
}

// exponent reads the exponent of plainDecimal: an optional sign and one to
// three digits (count's).
func exponent(s string) (int, bool) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	e, ok := count(s)
	if !ok || len(s) > 3 {
		return 0, false
	}
	if neg {
		e = -e
	}
	return int(e), true
}

// parseDecimal reads ParseAnswer's decimals in every form the sidecar may
// send.
func parseDecimal(s string) (float64, bool) {
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

// quota is what the filter tells a client about the bucket of its plan, in
// the IETF httpapi ratelimit-headers draft's terms (draft -10):
//
//	RateLimit-Policy: "<plan>";q=<limit>;w=<window>;edgelimit-rate="<rate>"
//	RateLimit: "<plan>";r=<remaining>;t=<next>
//
// plus the legacy ratelimit-limit/remaining/reset trio.
type quota struct {
	plan  string  // x-ratelimit-plan; "" or not printable ASCII names it "default"
	limit int64   // capacity: q, and ratelimit-limit
	rate  float64 // the plan's tokens per second; 0 when the sidecar sent none
	// remaining is the whole tokens left (floor): r, ratelimit-remaining.
	remaining int64
	// next is the seconds until one more whole token is back (ceiling): t,
	// the draft's "time until additional quota is made available". < 0
	// when the bucket is full: no more quota will come, and t is left out.
	next int64
	// reset is the seconds until the bucket is full (ceiling):
	// ratelimit-reset, as the legacy header always meant.
	reset int64
}

// refill is the rate the answer's tokens refill at: BucketRate, or Rate.
func (a *Answer) refill() float64 {
	if a.BucketRate > 0 {
		return a.BucketRate
	}
	return a.Rate
}

// quotaOf is what a sidecar's 200 or 429 says, figured from its exact
// tokens and rate. A sidecar that sends no rate leaves t to the waits it
// gives, each no earlier than the next token: its reset, or a 429's
// retry-after when that is sooner.
func quotaOf(a *Answer) quota {
	q := quota{plan: a.Plan, limit: a.Limit, remaining: a.Remaining, reset: a.Reset, next: a.Reset}
	if a.Reset == 0 {
		q.next = -1
	}
	if a.HasRate {
		q.rate = a.Rate
		if a.HasTokens {
			br := a.refill()
			q.next = nextTokenSeconds(a.Tokens, br, bucketCapacity(a.Limit, a.Rate, br))
			return q
		}
	}
	// Without them, a denial's Retry-After is also a time by which more
	// quota is back (the cost needs at least one more token), and an
	// earlier one than the time until full.
	if a.Outcome == Denied && q.next > a.RetryAfter {
		q.next = a.RetryAfter
	}
	return q
}

// quotaAt describes a bucket of plan limit and rate, refilling at
// bucketRate (the plan's rate, or a hot client's region's share of it),
// holding tokens.
func quotaAt(plan string, limit int64, rate, bucketRate, tokens float64) quota {
	capacity := bucketCapacity(limit, rate, bucketRate)
	tokens = math.Max(0, math.Min(tokens, capacity))
	return quota{plan: plan, limit: limit, rate: rate, remaining: int64(math.Floor(tokens)),
		next: nextTokenSeconds(tokens, bucketRate, capacity), reset: seconds.Ceil((capacity - tokens) / bucketRate * 1000)}
}

// bucketCapacity is the capacity of a bucket that refills at bucketRate
// under a plan of limit and rate: a hot client's region bucket holds the
// same share of the capacity as of the rate. The plan's own is exact.
func bucketCapacity(limit int64, rate, bucketRate float64) float64 {
	if bucketRate == rate || !(bucketRate > 0) || !(rate > 0) {
		return float64(limit)
	}
	return float64(limit) * (bucketRate / rate)
}

// nextTokenSeconds is the seconds until a bucket holding tokens has one
// more whole token (ceiling), or -1 when it is full. It is computed as the
// sidecar computes a wait, (need) / rate * 1000 ms in float64: need is at
// most what any denied cost still needs, so this t is never later than a
// Retry-After from the same state.
func nextTokenSeconds(tokens, rate float64, capacity float64) int64 {
	if tokens >= capacity || !(rate > 0) {
		return -1
	}
	return seconds.Ceil((math.Floor(tokens) + 1 - tokens) / rate * 1000)
}

// retryAfterFor is the Retry-After of a denied cost from a bucket of
// capacity limit holding tokens: whole seconds no earlier than the exact
// wait, nor than t (next), and at least 1; none (0) for a cost above the
// capacity, which no wait admits, as the sidecar's x-ratelimit-never answer
// has none.
func retryAfterFor(cost, limit int64, tokens, rate float64, next int64) int64 {
	if cost > limit {
		return 0
	}
	return max(1, next, seconds.Ceil((float64(cost)-tokens)/rate*1000))
}

// window is the policy's w: the seconds the rate takes to refill the whole
// capacity (ceiling, at least 1). A token bucket has no fixed window; this
// is the one that describes it without overstating it: over any w seconds
// the bucket admits at most q + rate·w ≤ 2q, and a client that spends q
// per w (the steady rate the pair advertises, q/w ≤ rate) is never denied.
// 0 (no w) when the rate is not known.
func (q *quota) window() int64 {
	if !(q.rate > 0) {
		return 0
	}
	return max(1, seconds.Ceil(float64(q.limit)/q.rate*1000))
}

// rateLimitHeaders are the response headers that tell a client its limit:
// RateLimit-Policy and RateLimit of the IETF httpapi ratelimit-headers draft
// (structured-field lists; the policy is named after the plan), and the
// legacy ratelimit-limit/remaining/reset trio many clients still read.
func rateLimitHeaders(q *quota) [][2]string {
	var t text
	return appendRateLimitHeaders(nil, &t, q, nil)
}

// appendRateLimitHeaders appends rateLimitHeaders to dst, the values
// formatted into t, the policy's taken from memo when it holds them (nil:
// formatted every time). The draft's two fields come first:
// OnResponseHeaders adds them beside a service's own and replaces the legacy
// three.
func appendRateLimitHeaders(dst [][2]string, t *text, q *quota, memo *policyMemo) [][2]string {
	var id, policy, l string
	if memo != nil {
		e := memo.of(q)
		id, policy, l = e.id, e.policy, e.limitText
	} else {
		id, policy, l = appendPolicy(t, q)
	}
	r, rs := t.int(q.remaining), t.int(q.reset)
	m := len(t.b)
	t.b = append(append(append(t.b, id...), ";r="...), r...)
	if q.next >= 0 {
		t.b = append(t.b, ";t="...)
		t.int(q.next)
	}
	limit := t.since(m)
	return append(dst,
		[2]string{"ratelimit-policy", policy},
		[2]string{"ratelimit", limit},
		[2]string{"ratelimit-limit", l},
		[2]string{"ratelimit-remaining", r},
		[2]string{"ratelimit-reset", rs})
}

// appendPolicy formats what depends on the plan alone, into t: the policy's
// id (its name as a structured-field string), the RateLimit-Policy value and
// the ratelimit-limit value.
func appendPolicy(t *text, q *quota) (id, policy, limit string) {
	id = t.policyID(q.plan)
	limit = t.int(q.limit)
	m := len(t.b)
	t.b = append(append(t.b, id...), ";q="...)
	t.b = append(t.b, limit...)
	if w := q.window(); w > 0 {
		t.b = strconv.AppendInt(append(t.b, ";w="...), w, 10)
		// The exact rate as a vendor-prefixed parameter (the draft's rule
		// for implementation-specific ones), a String because an sf-decimal
		// holds only three fractional digits: 'g' -1 is the sidecar's own
		// x-ratelimit-rate, digits, '.', 'e', '+' and '-' only.
		t.b = strconv.AppendFloat(append(t.b, `;edgelimit-rate="`...), q.rate, 'g', -1, 64)
		t.b = append(t.b, '"')
	}
	return id, t.since(m), limit
}

// policyMemo keeps the formatted policies of the last few plans a VM told
// clients about: a VM's clients share a handful of plans, and inside wasm
// formatting a policy (the rate above all) costs more than the rest of the
// response's headers. An entry's strings stay valid until the entry is
// reused, which takes policyMemoSize other plans formatted since; one
// callback formats at most one, so what it hands the host stays intact.
type policyMemo struct {
	entries [policyMemoSize]policyEntry
	next    int
}

const policyMemoSize = 4

type policyEntry struct {
	used bool
	// The key: what the policy is formatted from.
	plan  string
	limit int64
	rate  float64
	// The values appendPolicy made, views of text's buffer (plan too).
	id, policy, limitText string
	text                  text
}

// of returns the entry for q's plan, limit and rate, formatting it if the
// memo has none.
func (pm *policyMemo) of(q *quota) *policyEntry {
	for i := range pm.entries {
		e := &pm.entries[i]
		if e.used && e.limit == q.limit && math.Float64bits(e.rate) == math.Float64bits(q.rate) && same(e.plan, q.plan) {
			return e
		}
	}
	e := &pm.entries[pm.next]
	pm.next = (pm.next + 1) % policyMemoSize
	e.text.reset()
	e.used, e.limit, e.rate = true, q.limit, q.rate
	e.plan = e.text.cat(q.plan)
	e.id, e.policy, e.limitText = appendPolicy(&e.text, q)
	return e
}

// maxPlanLen bounds the plan name copied into a response header.
const maxPlanLen = 64

// policyName is the name the policy goes by: the plan, or "default" when the
// sidecar sent none, one too long, or one that is not printable ASCII.
func policyName(plan string) string {
	if plan == "" || len(plan) > maxPlanLen {
		return "default"
	}
	for i := 0; i < len(plan); i++ {
		if plan[i] < 0x20 || plan[i] > 0x7e {
			return "default"
		}
	}
	return plan
}

// policyID is the policy's name as a structured-field string.
func (t *text) policyID(plan string) string {
	name := policyName(plan)
	m := len(t.b)
	t.b = append(t.b, '"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '"' || c == '\\' {
			t.b = append(t.b, '\\')
		}
		t.b = append(t.b, c)
	}
	t.b = append(t.b, '"')
	return t.since(m)
}

// maxDetailBody bounds how much of a 503's body is read for its log line:
// Envoy's longest local reply for an unreachable upstream, with its
// transport failure reason, and the sidecar's reasons fit.
const maxDetailBody = 256

// proxyReplies are the starts of the bodies Envoy's router gives the 503
// it answers itself when it cannot reach the cluster's hosts
// (source/common/router/router.cc: onUpstreamReset,
// sendNoHealthyUpstreamResponse); the sidecar's own 503s carry their reason
// ("redis unavailable", "redis timeout", "checks refused", ...).
var proxyReplies = [...]string{
	"upstream connect error or disconnect/reset before headers",
	"no healthy upstream",
}

// UnavailableDetail is the fail-open detail of a 503 whose body begins
// with body: "the proxy answered 503 for the sidecar (not reachable:
// <Envoy's body>)" when Envoy made it up, "sidecar answered 503: <reason>"
// when the sidecar sent it, "sidecar answered 503" when it has no body. Only
// the first line is quoted, its bytes outside printable ASCII as '?'.
func UnavailableDetail(body []byte) string {
	line := make([]byte, 0, len(body))
	for _, c := range body {
		if c == '\r' || c == '\n' {
			break
		}
		if c < ' ' || c > '~' {
			c = '?'
		}
		line = append(line, c)
	}
	for len(line) > 0 && line[len(line)-1] == ' ' {
		line = line[:len(line)-1]
	}
	if len(line) == 0 {
		return "sidecar answered 503"
	}
	for _, p := range proxyReplies {
		if len(line) >= len(p) && string(line[:len(p)]) == p {
			return "the proxy answered 503 for the sidecar (not reachable: " + string(line) + ")"
		}
	}
	return "sidecar answered 503: " + string(line)
}
