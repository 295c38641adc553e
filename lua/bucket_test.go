package lua

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseReply(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply any
		want  Result
	}{
		{"allowed", []any{int64(1), "2.5", "0", "1500"},
			Result{Allowed: true, Tokens: 2.5, ResetAfter: 1500 * time.Millisecond, ResetMs: 1500}},
		{"denied", []any{int64(0), "0.25", "750", "4750"},
			Result{Tokens: 0.25, RetryAfter: 750 * time.Millisecond, RetryMs: 750, ResetAfter: 4750 * time.Millisecond, ResetMs: 4750}},
		{"never", []any{int64(0), "3", "never", "0"},
			Result{Tokens: 3, Never: true}},
		// 17 significant digits come back as the same double.
		{"exact fraction", []any{int64(1), "0.33333333333333331", "0", "0"},
			Result{Allowed: true, Tokens: 1.0 / 3}},
		// Fractions of a nanosecond round up in the durations: a client
		// told to wait is never told too little. The ms stay exact.
		{"ms rounded up to ns", []any{int64(0), "0", "0.0000001", "1.0000000001"},
			Result{RetryAfter: 1, RetryMs: 0.0000001, ResetAfter: time.Millisecond + 1, ResetMs: 1.0000000001}},
		{"saturates", []any{int64(0), "0", "1e300", "1e300"},
			Result{RetryAfter: math.MaxInt64, RetryMs: 1e300, ResetAfter: math.MaxInt64, ResetMs: 1e300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseReply(tc.reply)
			if err != nil {
				t.Fatalf("ParseReply(%#v): %v", tc.reply, err)
			}
			if got != tc.want {
				t.Errorf("ParseReply(%#v) = %+v, want %+v", tc.reply, got, tc.want)
			}
		})
	}
}

func TestParseReplyRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply any
		want  string
	}{
		{"nil", nil, "want an array, got <nil>"},
		{"string", "OK", "want an array, got string"},
		{"short", []any{int64(1), "1", "0"}, "want 4 elements, got 3"},
		{"long", []any{int64(1), "1", "0", "0", "0"}, "want 4 elements, got 5"},
		{"decision as string", []any{"1", "1", "0", "0"}, "decision: want integer 0 or 1, got string 1"},
		{"decision 2", []any{int64(2), "1", "0", "0"}, "decision: want integer 0 or 1, got int64 2"},
		{"tokens as integer", []any{int64(1), int64(1), "0", "0"}, "tokens: want a string, got int64 1"},
		{"tokens nil", []any{int64(1), nil, "0", "0"}, "tokens: want a string, got <nil>"},
		{"tokens text", []any{int64(1), "many", "0", "0"}, `tokens: want a finite number >= 0, got "many"`},
		{"tokens negative", []any{int64(1), "-1", "0", "0"}, `tokens: want a finite number >= 0, got "-1"`},
		{"tokens nan", []any{int64(1), "nan", "0", "0"}, `tokens: want a finite number >= 0, got "nan"`},
		{"tokens inf", []any{int64(1), "inf", "0", "0"}, `tokens: want a finite number >= 0, got "inf"`},
		{"retry text", []any{int64(0), "1", "soon", "0"}, `retry: want a finite number >= 0, got "soon"`},
		{"allowed never", []any{int64(1), "1", "never", "0"}, `allowed with retry "never"`},
		{"allowed with wait", []any{int64(1), "1", "5", "0"}, "allowed with retry 5 ms"},
		{"reset negative", []any{int64(0), "1", "0", "-3"}, `reset: want a finite number >= 0, got "-3"`},
		{"reset as slice", []any{int64(0), "1", "0", []any{}}, "reset: want a string, got []interface {}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseReply(tc.reply)
			if err == nil {
				t.Fatalf("ParseReply(%#v) = %+v, want an error", tc.reply, got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseReply(%#v) error %q, want it to contain %q", tc.reply, err, tc.want)
			}
		})
	}
}

func FuzzParseReply(f *testing.F) {
	f.Add(int64(1), "2.5", "0", "1500")
	f.Add(int64(0), "3", "never", "0")
	f.Add(int64(0), "1e309", "NaN", "-0")
	f.Fuzz(func(t *testing.T, decision int64, tokens, retry, reset string) {
		r, err := ParseReply([]any{decision, tokens, retry, reset})
		if err != nil {
			return
		}
		// Whatever is accepted is a coherent result.
		if r.Tokens < 0 || math.IsInf(r.Tokens, 0) || math.IsNaN(r.Tokens) ||
			r.RetryAfter < 0 || r.ResetAfter < 0 ||
			(r.Allowed && (r.Never || r.RetryAfter != 0)) ||
			(r.Never && r.RetryAfter != 0) {
			t.Errorf("ParseReply(%d, %q, %q, %q) = %+v: incoherent", decision, tokens, retry, reset, r)
		}
	})
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		want string // "" for valid
	}{
		{Limit{Capacity: 10, Rate: 1}, ""},
		{Limit{Capacity: 0.5, Rate: 1e-9}, ""},
		{Limit{Capacity: 0, Rate: 1}, "capacity: must be a finite number > 0, got 0"},
		{Limit{Capacity: -3, Rate: 1}, "capacity: must be a finite number > 0, got -3"},
		{Limit{Capacity: math.NaN(), Rate: 1}, "capacity: must be a finite number > 0, got NaN"},
		{Limit{Capacity: math.Inf(1), Rate: 1}, "capacity: must be a finite number > 0, got +Inf"},
		{Limit{Capacity: 1, Rate: 0}, "rate: must be a finite number > 0, got 0"},
		{Limit{Capacity: 1, Rate: math.Inf(-1)}, "rate: must be a finite number > 0, got -Inf"},
		{Limit{Capacity: 1 << 53, Rate: 1}, ""},
		{Limit{Capacity: 1e17, Rate: 1}, "capacity: must be at most 9007199254740992 (2^53), got 1e+17"},
		{Limit{Capacity: 1e300, Rate: 1e-300}, "capacity: must be at most 9007199254740992 (2^53), got 1e+300"},
		{Limit{Capacity: 1e15, Rate: 1e-310}, "rate: too small for capacity 1e+15: filling the bucket would take forever, got 1e-310"},
	} {
		err := tc.l.Validate()
		if got := errString(err); got != tc.want {
			t.Errorf("%+v.Validate() = %q, want %q", tc.l, got, tc.want)
		}
	}
}

// Take rejects what Validate rejects, and a negative cost, without a round
// trip: the client below has no server and would fail any command.
func TestTakeRejectsBadInput(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	for _, tc := range []struct {
		l    Limit
		cost int64
		want string
	}{
		{Limit{Capacity: math.NaN(), Rate: 1}, 1, "capacity: must be a finite number > 0, got NaN"},
		{Limit{Capacity: 1, Rate: -2}, 1, "rate: must be a finite number > 0, got -2"},
		{Limit{Capacity: 1, Rate: 1}, -1, "cost: must be >= 0, got -1"},
	} {
		_, err := Take(context.Background(), c, "k", tc.l, tc.cost)
		if got := errString(err); got != tc.want {
			t.Errorf("Take(%+v, %d) error %q, want %q", tc.l, tc.cost, got, tc.want)
		}
	}
}

// Args must hand Lua decimal strings that parse back to the same doubles.
func TestArgsRoundTrip(t *testing.T) {
	for _, l := range []Limit{
		{Capacity: 10, Rate: 1},
		{Capacity: 0.1, Rate: 1.0 / 3},
		{Capacity: 123456.789, Rate: 1e-9},
		{Capacity: math.MaxFloat64, Rate: math.SmallestNonzeroFloat64},
	} {
		args := Args(l, 7)
		if len(args) != 3 {
			t.Fatalf("Args(%+v) = %v, want 3", l, args)
		}
		for i, want := range []float64{l.Capacity, l.Rate, 7} {
			s, ok := args[i].(string)
			if !ok {
				t.Fatalf("Args(%+v)[%d] = %T, want string", l, i, args[i])
			}
			if got, err := strconv.ParseFloat(s, 64); err != nil || got != want {
				t.Errorf("Args(%+v)[%d] = %q parses to %v, %v; want %v", l, i, s, got, err, want)
			}
		}
	}
}

func TestIsNoScript(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{redis.ErrNoScript, true},
		{errors.New("NOSCRIPT No matching script. Please use EVAL."), false}, // not a Redis error
		{errors.New("ERR something"), false},
		{nil, false},
	} {
		if got := IsNoScript(tc.err); got != tc.want {
			t.Errorf("IsNoScript(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
