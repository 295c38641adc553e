// Package lua holds the token-bucket script that runs inside Redis and the
// Go calls that run it through go-redis.
//
// One bucket per key: it holds up to Limit.Capacity tokens, refills
// continuously at Limit.Rate tokens per second on Redis's clock, starts full
// for a key never seen, and a call takes its cost only if the bucket holds
// that many tokens. One run of the script can decide count calls of the same
// cost, exactly as count calls one after another at the same instant would
// be decided: the first k the bucket can pay are allowed. tokenbucket.lua
// documents the script's arguments, reply and guarantees.
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

// Validate reports, naming the field and value, why the script would reject
// l: both fields must be finite and > 0, and the time to fill the bucket
// (Capacity/Rate seconds) must be finite in ms.
func (l Limit) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"capacity", l.Capacity}, {"rate", l.Rate}} {
		if !(f.v > 0) || math.IsInf(f.v, 1) {
			return fmt.Errorf("%s: must be a finite number > 0, got %v", f.name, f.v)
		}
	}
	if math.IsInf(l.Capacity/l.Rate*1000, 1) {
		return fmt.Errorf("rate: too small for capacity %v: filling the bucket would take forever, got %v", l.Capacity, l.Rate)
	}
	return nil
}

// MaxCount is the most calls one run of the script decides.
const MaxCount = 1024

// Result is the outcome of one Take of count calls.
type Result struct {
	// Allowed says all count calls were allowed (Admitted == count): the
	// cost was taken count times. With count 1: the call was allowed.
	Allowed bool
	// Admitted is how many of the calls were allowed, 0 to count: the
	// first Admitted of them, each of which took the cost.
	Admitted int64
	// Tokens is what the bucket holds after the calls, exactly as Redis
	// computed it (fractional).
	Tokens float64
	// RetryAfter is, when not all calls were allowed, how long until the
	// bucket will hold the cost once more (rounded up to the nanosecond).
	// 0 when all were allowed or Never.
	RetryAfter time.Duration
	// RetryMs is the same wait exactly as the script computed it, in
	// milliseconds: (cost - tokens) / rate * 1000 in float64. Answers that
	// must never point earlier than the wait are derived from it, not from
	// a rounded figure.
	RetryMs float64
	// Never says the cost exceeds the capacity: no wait can make it
	// succeed, and no call was allowed.
	Never bool
	// ResetAfter is how long until the bucket is full again (rounded up to
	// the nanosecond; durations beyond ~292 years saturate).
	ResetAfter time.Duration
	// ResetMs is the same time exactly as the script computed it, in
	// milliseconds.
	ResetMs float64
}

// Args returns the script's ARGV for one run deciding count calls of cost:
// capacity, rate and cost, as decimal strings that Lua parses back to the
// same doubles, and count when it is not 1 (a single call sends three).
func Args(l Limit, cost, count int64) []any {
	args := []any{
		strconv.FormatFloat(l.Capacity, 'g', -1, 64),
		strconv.FormatFloat(l.Rate, 'g', -1, 64),
		strconv.FormatInt(cost, 10),
	}
	if count != 1 {
		args = append(args, strconv.FormatInt(count, 10))
	}
	return args
}

// Take runs the script once to decide count calls of cost on the bucket at
// key, in order: each takes cost tokens if the bucket still holds them, so
// the first Result.Admitted are allowed. A cost of 0 only reports the
// bucket. Invalid limits, a negative cost or a count outside 1 to MaxCount
// are rejected before anything is sent.
func Take(ctx context.Context, c redis.Scripter, key string, l Limit, cost, count int64) (Result, error) {
	if err := l.Validate(); err != nil {
		return Result{}, err
	}
	if cost < 0 {
		return Result{}, fmt.Errorf("cost: must be >= 0, got %d", cost)
	}
	if count < 1 || count > MaxCount {
		return Result{}, fmt.Errorf("count: must be from 1 to %d, got %d", MaxCount, count)
	}
	v, err := Script.Run(ctx, c, []string{key}, Args(l, cost, count)...).Result()
	if err != nil {
		return Result{}, fmt.Errorf("token bucket script: %w", err)
	}
	return ParseReply(v, count)
}

// ParseReply reads the script's reply to a run deciding count calls, as
// go-redis returns it. Any reply of another shape, or with values the
// script cannot produce, is an error.
func ParseReply(v any, count int64) (Result, error) {
	arr, ok := v.([]any)
	if !ok {
		return Result{}, fmt.Errorf("token bucket reply: want an array, got %T", v)
	}
	if len(arr) != 4 {
		return Result{}, fmt.Errorf("token bucket reply: want 4 elements, got %d", len(arr))
	}
	admitted, ok := arr[0].(int64)
	if !ok {
		return Result{}, fmt.Errorf("token bucket reply: admitted: want an integer from 0 to %d, got %T %v", count, arr[0], arr[0])
	}
	var fields [3]string
	for i, name := range [3]string{"tokens", "retry", "reset"} {
		s, ok := arr[i+1].(string)
		if !ok {
			return Result{}, fmt.Errorf("token bucket reply: %s: want a string, got %T %v", name, arr[i+1], arr[i+1])
		}
		fields[i] = s
	}
	return ParseFields(count, admitted, fields[0], fields[1], fields[2])
}

// ParseFields reads the script's reply to a run deciding count calls from
// its four elements: the calls admitted (an integer from 0 to count) and
// the three decimal strings, tokens, retry and reset, for callers that
// decode Redis's replies themselves. Values the script cannot produce are
// an error: retry is "0" exactly when all count were admitted, and "never"
// only when none was.
func ParseFields(count, admitted int64, tokens, retry, reset string) (Result, error) {
	if count < 1 {
		return Result{}, fmt.Errorf("token bucket reply: count: want at least 1, got %d", count)
	}
	if admitted < 0 || admitted > count {
		return Result{}, fmt.Errorf("token bucket reply: admitted: want an integer from 0 to %d, got %d", count, admitted)
	}
	r := Result{Admitted: admitted, Allowed: admitted == count}
	var err error
	if r.Tokens, err = replyNumber("tokens", tokens); err != nil {
		return Result{}, err
	}
	if retry == "never" {
		if r.Allowed {
			return Result{}, errors.New(`token bucket reply: allowed with retry "never"`)
		}
		if admitted != 0 {
			return Result{}, fmt.Errorf(`token bucket reply: %d admitted with retry "never"`, admitted)
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
		if !r.Allowed && ms == 0 {
			return Result{}, fmt.Errorf("token bucket reply: %d of %d admitted with retry 0 ms", admitted, count)
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

// Denial is the Result the script gives when it denies a cost, and so every
// call of a run (Admitted 0): the bucket holds tokens, and retryMs and
// resetMs are the waits in milliseconds, for callers that answer a denial
// without running the script.
func Denial(tokens, retryMs, resetMs float64) Result {
	return Result{Tokens: tokens, RetryMs: retryMs, RetryAfter: millis(retryMs), ResetMs: resetMs, ResetAfter: millis(resetMs)}
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
