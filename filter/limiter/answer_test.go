package limiter

import (
	"strings"
	"testing"
)

func TestParseAnswer(t *testing.T) {
	rl := [][2]string{{"ratelimit-limit", "100"}, {"ratelimit-remaining", "7"}, {"ratelimit-reset", "12"}}
	with := func(status string, extra ...[2]string) [][2]string {
		return append(append([][2]string{{":status", status}}, rl...), extra...)
	}
	for _, c := range []struct {
		name    string
		headers [][2]string
		want    Answer
	}{
		{"allowed", with("200", [2]string{"x-ratelimit-plan", "gold"}, [2]string{"x-ratelimit-tokens", "7.25"}),
			Answer{Outcome: Allowed, Status: 200, Limit: 100, Remaining: 7, Reset: 12, Plan: "gold", Tokens: 7.25, HasTokens: true}},
		{"denied", with("429", [2]string{"retry-after", "2"}, [2]string{"x-ratelimit-tokens", "1e-05"}, [2]string{"x-ratelimit-retry-after-ms", "1500.5"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 2,
				Tokens: 1e-05, HasTokens: true, RetryAfterMs: 1500.5, HasRetryMs: true}},
		{"denied, retry-after 0 raised to 1", with("429", [2]string{"retry-after", "0"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 1}},
		{"denied, bad exact state ignored", with("429", [2]string{"retry-after", "3"}, [2]string{"x-ratelimit-tokens", "-1"}, [2]string{"x-ratelimit-retry-after-ms", "0x10p0"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 3}},
		{"first of repeated headers", append(with("200"), [2]string{"ratelimit-limit", "5"}),
			Answer{Outcome: Allowed, Status: 200, Limit: 100, Remaining: 7, Reset: 12}},
		{"503", [][2]string{{":status", "503"}}, failed(ReasonUnavailable, "sidecar answered 503", 503)},
		{"504", [][2]string{{":status", "504"}}, failed(ReasonTimeout, "sidecar answered 504", 504)},
		{"400", with("400"), failed(ReasonStatus, "sidecar answered 400", 400)},
		{"no status", rl, failed(ReasonMalformed, "sidecar response without a valid :status", 0)},
		{"status 99", [][2]string{{":status", "99"}}, failed(ReasonMalformed, "sidecar response without a valid :status", 0)},
		{"status +200", [][2]string{{":status", "+200"}}, failed(ReasonMalformed, "sidecar response without a valid :status", 0)},
		{"200 without reset", [][2]string{{":status", "200"}, rl[0], rl[1]},
			failed(ReasonMalformed, "sidecar answered 200 without valid ratelimit-limit, ratelimit-remaining and ratelimit-reset", 200)},
		{"429 without retry-after", with("429"), failed(ReasonMalformed, "sidecar answered 429 without a valid retry-after", 429)},
	} {
		if got := ParseAnswer(c.headers); got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestCountAndDecimal(t *testing.T) {
	for s, want := range map[string]bool{"0": true, "123": true, "999999999999999": true, "1000000000000000": false,
		"": false, "-1": false, "+1": false, "1.0": false, " 1": false, "1e3": false} {
		if _, ok := count(s); ok != want {
			t.Errorf("count(%q) ok = %v", s, ok)
		}
	}
	for s, want := range map[string]bool{"0": true, "0.5": true, "12.000": true, "1e-05": true, "2.5E3": true,
		"": false, "-0.5": false, "NaN": false, "Inf": false, "0x1p-2": false, "1_000": false, "1e400": false, strings.Repeat("1", 65): false} {
		if _, ok := decimal(s); ok != want {
			t.Errorf("decimal(%q) ok = %v", s, ok)
		}
	}
}

func TestRateLimitHeaders(t *testing.T) {
	got := rateLimitHeaders(`a"b\c`, 10, 3, 4)
	want := [][2]string{
		{"ratelimit-policy", `"a\"b\\c";q=10`},
		{"ratelimit", `"a\"b\\c";r=3;t=4`},
		{"ratelimit-limit", "10"},
		{"ratelimit-remaining", "3"},
		{"ratelimit-reset", "4"},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("header %d: %q, want %q", i, got[i], want[i])
		}
	}
}

// FuzzParseAnswer: any response is classified without panicking, and what
// it promises holds.
func FuzzParseAnswer(f *testing.F) {
	f.Add("200", "10", "5", "3", "", "", "gold")
	f.Add("429", "10", "0", "3", "2", "150.5", "x\"y")
	f.Add("429", "1e3", "0", "3", "NaN", "-1", "")
	f.Fuzz(func(t *testing.T, status, limit, remaining, reset, retry, retryMs, plan string) {
		a := ParseAnswer([][2]string{{":status", status}, {"ratelimit-limit", limit}, {"ratelimit-remaining", remaining},
			{"ratelimit-reset", reset}, {"retry-after", retry}, {"x-ratelimit-retry-after-ms", retryMs}, {"x-ratelimit-plan", plan}})
		switch a.Outcome {
		case Allowed, Denied:
			if a.Limit < 0 || a.Remaining < 0 || a.Reset < 0 {
				t.Fatalf("negative counts in %+v", a)
			}
			if a.Outcome == Denied && a.RetryAfter < 1 {
				t.Fatalf("retry-after %d", a.RetryAfter)
			}
			if a.HasRetryMs && !(a.RetryAfterMs >= 0) {
				t.Fatalf("retry ms %v", a.RetryAfterMs)
			}
			for _, h := range rateLimitHeaders(a.Plan, a.Limit, a.Remaining, a.Reset) {
				if strings.ContainsAny(h[1], "\r\n\x00") {
					t.Fatalf("header %q", h)
				}
			}
		case FailedOpen:
			if a.Reason >= numReasons || a.Detail == "" {
				t.Fatalf("fail-open without reason: %+v", a)
			}
		case UnknownKey:
			if a.Status != 403 {
				t.Fatalf("unknown key from status %d", a.Status)
			}
		default:
			t.Fatalf("outcome %d", a.Outcome)
		}
	})
}
