// Package lua holds the token-bucket script that runs inside Redis and the
// Go calls that run it through go-redis.
//
// One bucket per key: it holds up to Limit.Capacity tokens, refills
// continuously at Limit.Rate tokens per second on Redis's clock, starts full
// for a key never seen, and a call takes its cost only if the bucket holds
// that many tokens. tokenbucket.lua documents the script's arguments, reply
// and guarantees.
package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Source is the script's Lua source.
//
//go:embed tokenbucket.lua
var Source string

// Script runs Source with EVALSHA, falling back to EVAL (which also caches
// it again) when Redis answers NOSCRIPT, as after SCRIPT FLUSH or a restart.
var Script = redis.NewScript(Source)

// Limit is a bucket's shape.
type Limit struct {
	// Capacity is how many tokens a full bucket holds: the largest burst.
	Capacity float64
	// Rate is how many tokens flow back per second.
	Rate float64
}

// MaxCapacity is the largest capacity the script takes, 2^53: past it a
// float64 balance cannot count single tokens, and spending one could leave
// it as it was.
const MaxCapacity = 1 << 53

// Validate reports, naming the field and value, why the script would reject
// l: both fields must be finite and > 0, the capacity at most MaxCapacity,
// and the time to fill the bucket (Capacity/Rate seconds) must be finite in
// ms.
func (l Limit) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"capacity", l.Capacity}, {"rate", l.Rate}} {
		if !(f.v > 0) || math.IsInf(f.v, 1) {
			return fmt.Errorf("%s: must be a finite number > 0, got %v", f.name, f.v)
		}
	}
	if l.Capacity > MaxCapacity {
		return fmt.Errorf("capacity: must be at most %d (2^53), got %v", int64(MaxCapacity), l.Capacity)
	}
	if math.IsInf(l.Capacity/l.Rate*1000, 1) {
		return fmt.Errorf("rate: too small for capacity %v: filling the bucket would take forever, got %v", l.Capacity, l.Rate)
	}
	return nil
}

// Result is the outcome of one Take.
type Result struct {
	// Allowed says the cost was taken.
	Allowed bool
	// Tokens is what the bucket holds after this call, exactly as Redis
	// computed it (fractional).
	Tokens float64
	// RetryAfter is, for a denied call, how long until the bucket will hold
	// the cost (rounded up to the nanosecond). 0 when allowed or Never.
	RetryAfter time.Duration
	// RetryMs is the same wait exactly as the script computed it, in
	// milliseconds: (cost - tokens) / rate * 1000 in float64. Answers that
	// must never point earlier than the wait are derived from it, not from
	// a rounded figure.
	RetryMs float64
	// Never says the cost exceeds the capacity: no wait can make it succeed.
	Never bool
	// ResetAfter is how long until the bucket is full again (rounded up to
	// the nanosecond; durations beyond ~292 years saturate).
	ResetAfter time.Duration
	// ResetMs is the same time exactly as the script computed it, in
	// milliseconds.
	ResetMs float64
}

// Args returns the script's ARGV for one call: capacity, rate and cost, as
// decimal strings that Lua parses back to the same doubles.
func Args(l Limit, cost int64) []any {
	return []any{
		strconv.FormatFloat(l.Capacity, 'g', -1, 64),
		strconv.FormatFloat(l.Rate, 'g', -1, 64),
		strconv.FormatInt(cost, 10),
	}
}

// Take runs the script once: it takes cost tokens from the bucket at key if
// the bucket holds them. A cost of 0 only reports the bucket. Invalid limits
// or a negative cost are rejected before anything is sent.
func Take(ctx context.Context, c redis.Scripter, key string, l Limit, cost int64) (Result, error) {
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	if cost < 0 {
		return Result{}, fmt.Errorf("cost: must be >= 0, got %d", cost)
	}
	v, err := Script.Run(ctx, c, []string{key}, Args(l, cost)...).Result()
	if err != nil {
		return Result{}, fmt.Errorf("token bucket script: %w", err)
	}
	return ParseReply(v)
}

// ParseReply reads the script's reply as go-redis returns it. Any reply of
// another shape, or with values the script cannot produce, is an error.
func ParseReply(v any) (Result, error) {
	arr, ok := v.([]any)
	if !ok {
		return Result{}, fmt.Errorf("token bucket reply: want an array, got %T", v)
	}
	if len(arr) != 4 {
		return Result{}, fmt.Errorf("token bucket reply: want 4 elements, got %d", len(arr))
	}
	decision, ok := arr[0].(int64)
	if !ok {
		return Result{}, fmt.Errorf("token bucket reply: decision: want integer 0 or 1, got %T %v", arr[0], arr[0])
	}
	var fields [3]string
	for i, name := range [3]string{"tokens", "retry", "reset"} {
		s, ok := arr[i+1].(string)
		if !ok {
			return Result{}, fmt.Errorf("token bucket reply: %s: want a string, got %T %v", name, arr[i+1], arr[i+1])
		}
		fields[i] = s
	}
	return ParseFields(decision, fields[0], fields[1], fields[2])
}

// ParseFields reads the script's reply from its four elements: the
// decision (integer 0 or 1) and the three decimal strings, tokens, retry
// and reset, for callers that decode Redis's replies themselves. Values the
// script cannot produce are an error.
func ParseFields(decision int64, tokens, retry, reset string) (Result, error) {
	var r Result
	switch decision {
	case 1:
		r.Allowed = true
	case 0:
	default:
		return Result{}, fmt.Errorf("token bucket reply: decision: want integer 0 or 1, got int64 %d", decision)
	}
	var err error
	if r.Tokens, err = replyNumber("tokens", tokens); err != nil {
		return Result{}, err
	}
	if retry == "never" {
		if r.Allowed {
			return Result{}, errors.New(`token bucket reply: allowed with retry "never"`)
		}
		r.Never = true
	} else {
		ms, err := replyNumber("retry", retry)
		if err != nil {
			return Result{}, err
		}
		if r.Allowed && ms != 0 {
			return Result{}, fmt.Errorf("token bucket reply: allowed with retry %v ms", ms)
		}
		r.RetryAfter, r.RetryMs = millis(ms), ms
	}
	ms, err := replyNumber("reset", reset)
	if err != nil {
		return Result{}, err
	}
	r.ResetAfter, r.ResetMs = millis(ms), ms
	return r, nil
}

// Denial is the Result the script gives when it denies a cost: the bucket
// holds tokens, and retryMs and resetMs are the waits in milliseconds, for
// callers that answer a denial without running the script.
func Denial(tokens, retryMs, resetMs float64) Result {
	return Result{Tokens: tokens, RetryMs: retryMs, RetryAfter: millis(retryMs), ResetMs: resetMs, ResetAfter: millis(resetMs)}
}

// Decide is the script's decision computed in Go, for a call of cost
// under l on a bucket that holds tokens once refilled to the call's time
// (at most l.Capacity): its three branches and its float64 expressions in
// its order, its reply written with 17 significant digits and read as
// ParseFields reads Redis's. The sidecar never calls it, the script
// decides; tests and models of the sidecar's answers do, and package
// sidecaranswer's TestScriptResultIsTheScripts and TestBucketIsTheScripts
// hold it to the script in Redis bit for bit.
func Decide(l Limit, tokens float64, cost int64) Result {
	exact := func(x float64) string { return strconv.FormatFloat(x, 'g', 17, 64) }
	c := float64(cost)
	decision, retry := int64(0), ""
	switch {
	case c > l.Capacity:
		retry = "never"
	case tokens < c:
		retry = exact((c - tokens) / l.Rate * 1000)
	default:
		decision, retry = 1, "0"
		tokens -= c
	}
	r, err := ParseFields(decision, exact(tokens), retry, exact((l.Capacity-tokens)/l.Rate*1000))
	if err != nil {
		panic(fmt.Sprintf("lua.Decide: cost %d under %+v on %v tokens: %v", cost, l, tokens, err))
	}
	return r
}

// IsNoScript reports whether err is Redis's NOSCRIPT (the script is not in
// the server's cache), for callers that pipeline EVALSHA themselves and must
// fall back to EVAL.
func IsNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// replyNumber parses one of the script's decimal strings: a finite number
// >= 0.
func replyNumber(name, s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 0) || math.IsInf(f, 1) {
		return 0, fmt.Errorf("token bucket reply: %s: want a finite number >= 0, got %q", name, s)
	}
	return f, nil
}

// millis converts ms to a Duration, rounding up so that a caller told to
// wait that long is never early; it saturates instead of overflowing.
func millis(ms float64) time.Duration {
	ns := math.Ceil(ms * 1e6)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// ErrorPrefix begins every error reply the script makes itself: a bad
// argument, or a bucket whose stored state it cannot read. Such a reply
// is about one call, not about the server.
const ErrorPrefix = "ERR tokenbucket: "
