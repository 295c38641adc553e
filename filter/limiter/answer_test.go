package limiter

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
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
		{"denied", with("429", [2]string{"retry-after", "2"}, [2]string{"x-ratelimit-tokens", "1e-05"}, [2]string{"x-ratelimit-rate", "0.5"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 2,
				Tokens: 1e-05, HasTokens: true, Rate: 0.5, HasRate: true}},
		{"denied, a hot client's region bucket", with("429", [2]string{"retry-after", "3"}, [2]string{"x-ratelimit-tokens", "0"},
			[2]string{"x-ratelimit-rate", "1"}, [2]string{"x-ratelimit-bucket-rate", "0.3333333333333333"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 3,
				HasTokens: true, Rate: 1, HasRate: true, BucketRate: 0.3333333333333333}},
		{"denied, bucket rate not below the plan's ignored", with("429", [2]string{"retry-after", "3"},
			[2]string{"x-ratelimit-rate", "1"}, [2]string{"x-ratelimit-bucket-rate", "2"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 3, Rate: 1, HasRate: true}},
		{"denied, never", with("429", [2]string{"retry-after", "2"}, [2]string{"x-ratelimit-never", "true"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 2, Never: true}},
		{"denied, retry-after 0 raised to 1", with("429", [2]string{"retry-after", "0"}),
			Answer{Outcome: Denied, Status: 429, Limit: 100, Remaining: 7, Reset: 12, RetryAfter: 1}},
		{"denied, bad exact state ignored", with("429", [2]string{"retry-after", "3"}, [2]string{"x-ratelimit-tokens", "-1"}, [2]string{"x-ratelimit-rate", "0x10p0"}),
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
		// Read as the answer's exact tokens, as the filter reads them.
		a := ParseAnswer([][2]string{{":status", "200"}, {"ratelimit-limit", "100"}, {"ratelimit-remaining", "7"},
			{"ratelimit-reset", "12"}, {"x-ratelimit-tokens", s}})
		if a.HasTokens != want {
			t.Errorf("x-ratelimit-tokens %q read = %v", s, a.HasTokens)
		}
	}
}

func TestRateLimitHeaders(t *testing.T) {
	for _, c := range []struct {
		name string
		q    quota
		want [][2]string
	}{
		// The plan: 200 burst, 100/s. w is the time the rate takes
		// to refill the whole capacity, 2 s; t the next whole token.
		{"pro", quota{plan: "pro", limit: 200, rate: 100, remaining: 11, next: 1, reset: 2}, [][2]string{
			{"ratelimit-policy", `"pro";q=200;w=2;edgelimit-rate="100"`},
			{"ratelimit", `"pro";r=11;t=1`},
			{"ratelimit-limit", "200"}, {"ratelimit-remaining", "11"}, {"ratelimit-reset", "2"}}},
		// A window below a second is still 1 (w is a non-zero integer);
		// a rate with more than three decimals needs the String.
		{"fast and exact", quota{plan: "fast", limit: 3, rate: 3.3333333333333335, remaining: 0, next: 1, reset: 1}, [][2]string{
			{"ratelimit-policy", `"fast";q=3;w=1;edgelimit-rate="3.3333333333333335"`},
			{"ratelimit", `"fast";r=0;t=1`}}},
		{"slow", quota{plan: "slow", limit: 10, rate: 2.5e-05, remaining: 10, next: -1, reset: 0}, [][2]string{
			{"ratelimit-policy", `"slow";q=10;w=400000;edgelimit-rate="2.5e-05"`},
			{"ratelimit", `"slow";r=10`}}}, // full: no additional quota will come, no t
		// An older sidecar sends no rate: no w, no rate.
		{"no rate", quota{plan: `a"b\c`, limit: 10, remaining: 3, next: 4, reset: 4}, [][2]string{
			{"ratelimit-policy", `"a\"b\\c";q=10`},
			{"ratelimit", `"a\"b\\c";r=3;t=4`}}},
		{"unprintable plan", quota{plan: "caf\xc3\xa9", limit: 1, remaining: 0, next: 1, reset: 1}, [][2]string{
			{"ratelimit-policy", `"default";q=1`}}},
	} {
		got := rateLimitHeaders(&c.q)
		for i := range c.want {
			if got[i] != c.want[i] {
				t.Errorf("%s: header %d: %q, want %q", c.name, i, got[i], c.want[i])
			}
		}
	}
}

func TestNextTokenSeconds(t *testing.T) {
	for _, c := range []struct {
		tokens, rate float64
		limit        int64
		want         int64
	}{
		{0, 1, 10, 1}, {0.999, 100, 200, 1}, {0.5, 0.5, 10, 1}, {0.25, 0.5, 10, 2}, {9.5, 0.1, 10, 5},
		{10, 1, 10, -1}, {0, 0.001, 2, 1000}, {1.5, 0, 10, -1},
	} {
		if got := nextTokenSeconds(c.tokens, c.rate, float64(c.limit)); got != c.want {
			t.Errorf("nextTokenSeconds(%v, %v, %d) = %d, want %d", c.tokens, c.rate, c.limit, got, c.want)
		}
	}
}

func TestQuotaProblem(t *testing.T) {
	for _, c := range []struct {
		name        string
		q           quota
		cost, retry int64
		want        string
	}{
		{"wait", quota{plan: "pro", limit: 200, remaining: 0}, 5, 1,
			`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,` +
				`"detail":"this request costs 5 quota units and 0 remain in policy pro; retry after 1 s","violated-policies":["pro"],"error":"rate_limited","retry_after":1}`},
		{"never", quota{plan: "pro", limit: 200, remaining: 200}, 500, 0,
			`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,` +
				`"detail":"this request costs 500 quota units and policy pro holds at most 200: it can never succeed, do not retry it","violated-policies":["pro"],"error":"cost_above_limit"}`},
		{"escaped", quota{plan: `a"b\c`, limit: 1}, 1, 2,
			`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,` +
				`"detail":"this request costs 1 quota unit and 0 remain in policy a\"b\\c; retry after 2 s","violated-policies":["a\"b\\c"],"error":"rate_limited","retry_after":2}`},
	} {
		got := string(appendQuotaProblem(nil, &c.q, c.cost, c.retry))
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(got), &v); err != nil {
			t.Errorf("%s: not JSON: %v", c.name, err)
		}
	}
	for _, b := range []string{missingKeyBody, invalidKeyBody, unknownKeyBody} {
		var v map[string]any
		if err := json.Unmarshal([]byte(b), &v); err != nil || v["type"] != "about:blank" || v["title"] == "" || v["detail"] == "" {
			t.Errorf("body %s: %v", b, err)
		}
	}
	if got := string(appendJSONText(nil, "a\x00\x1f\"\\z")); got != `a\u0000\u001f\"\\z` {
		t.Errorf("appendJSONText = %s", got)
	}
}

// FuzzParseAnswer: any response is classified without panicking, and what
// it promises holds.
func FuzzParseAnswer(f *testing.F) {
	f.Add("200", "10", "5", "3", "", "", "gold")
	f.Add("429", "10", "0", "3", "2", "150.5", "x\"y")
	f.Add("429", "1e3", "0", "3", "NaN", "-1", "")
	f.Fuzz(func(t *testing.T, status, limit, remaining, reset, retry, rate, plan string) {
		a := ParseAnswer([][2]string{{":status", status}, {"ratelimit-limit", limit}, {"ratelimit-remaining", remaining},
			{"ratelimit-reset", reset}, {"retry-after", retry}, {"x-ratelimit-rate", rate}, {"x-ratelimit-tokens", remaining}, {"x-ratelimit-plan", plan}})
		switch a.Outcome {
		case Allowed, Denied:
			if a.Limit < 0 || a.Remaining < 0 || a.Reset < 0 {
				t.Fatalf("negative counts in %+v", a)
			}
			if a.Outcome == Denied && a.RetryAfter < 1 {
				t.Fatalf("retry-after %d", a.RetryAfter)
			}
			q := quotaOf(&a)
			for _, h := range rateLimitHeaders(&q) {
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

// FuzzDecimal: decimal's fast path answers exactly as the full parse, to
// the bit, for any input it takes.
func FuzzDecimal(f *testing.F) {
	for _, s := range []string{"0", "99.5", "0.1", "123456789012345", "1.23456789012345", "0.000000000000001",
		"999999999999999", "1e-05", "5.", ".5", "00012.5000", "1234567890123456", "1.2.3", "-1", "",
		"1e+09", "2.5e-05", "1.234567e+06", "9.87654321012345e+22", "1e+23", "5e-324", "1e308", "1.e5", "1e", "1e+", "1e+0001", "7E3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fast, ok := plainDecimal(s)
		if !ok {
			return
		}
		want, wantOK := parseDecimal(s)
		if !wantOK || math.Float64bits(fast) != math.Float64bits(want) {
			t.Fatalf("plainDecimal(%q) = %v, the full parse %v (%v)", s, fast, want, wantOK)
		}
	})
}

// TestPlainDecimalTakesTheSidecarsForms: the forms the sidecar sends
// (strconv 'f' -1 for tokens, 'g' -1 for a rate) are read on the fast
// path when they have at most 15 digits, exponents included (longer ones
// are parseDecimal's); FuzzDecimal checks that what it reads is
// ParseFloat's value.
func TestPlainDecimalTakesTheSidecarsForms(t *testing.T) {
	for _, v := range []float64{0, 1, 0.5, 99.5, 100, 16.5, 1e6, 2.5e6, 1.234567e6, 1e9, 1e-5, 2.5e-5} {
		for _, s := range []string{strconv.FormatFloat(v, 'f', -1, 64), strconv.FormatFloat(v, 'g', -1, 64)} {
			got, ok := plainDecimal(s)
			if !ok || got != v {
				t.Errorf("plainDecimal(%q) = %v, %v; want %v on the fast path", s, got, ok, v)
			}
		}
	}
}

// TestPolicyMemoMatchesFormatting: the headers made with the memo are the
// ones formatted afresh, across more plans than the memo holds (so entries
// are evicted and reused), plans differing only in limit or rate, and a
// plan named like no other ("default" for an empty one).
func TestPolicyMemoMatchesFormatting(t *testing.T) {
	plans := []quota{
		{plan: "free", limit: 10, rate: 1},
		{plan: "free", limit: 20, rate: 1},
		{plan: "free", limit: 10, rate: 0.5},
		{plan: "gold", limit: 1000, rate: 16.666666666666668},
		{plan: "", limit: 5, rate: 0},
		{plan: `we"ird`, limit: 7, rate: 1e-05},
		{plan: "silver", limit: 100, rate: 100},
	}
	var memo policyMemo
	var tx text
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		q := plans[rng.IntN(len(plans))]
		q.remaining, q.reset, q.next = rng.Int64N(q.limit+1), rng.Int64N(100), rng.Int64N(5)-1
		tx.reset()
		got := appendRateLimitHeaders(nil, &tx, &q, &memo)
		want := rateLimitHeaders(&q)
		if !slices.Equal(got, want) {
			t.Fatalf("request %d, %+v: with the memo %q, formatted %q", i, q, got, want)
		}
	}
}

// TestParseAnswerFirstValueAndLookalikes: of a repeated header the first
// value counts, and a header named like none of the answer's, even of the
// same length as one, is ignored.
func TestParseAnswerFirstValueAndLookalikes(t *testing.T) {
	a := ParseAnswer([][2]string{{":status", "200"}, {":statu5", "500"}, {"ratelimit-limit", "10"},
		{"ratelimit-limit", "99"}, {"ratelimit-lim1t", "98"}, {"ratelimit-remaining", "4"},
		{"ratelimit-reset", "3"}, {"ratelimit-reseT", "97"}, {"x-ratelimit-rate", "2.5"},
		{"x-ratelimit-rat3", "96"}, {"x-ratelimit-plan", "gold"}, {"x-ratelimit-tokens", "4.5"}})
	if a.Outcome != Allowed || a.Limit != 10 || a.Remaining != 4 || a.Reset != 3 || a.Rate != 2.5 ||
		a.Plan != "gold" || a.Tokens != 4.5 {
		t.Fatalf("ParseAnswer = %+v", a)
	}
}

// TestAnswerFieldsOfNames checks that each answer header is found by its
// exact name, and that no name one byte away from it (every byte, every
// bit), nor a case variant, is taken for it.
func TestAnswerFieldsOfNames(t *testing.T) {
	for i, name := range answerNames {
		f := answerFieldsOf([][2]string{{"content-length", "0"}, {name, "v"}})
		if !f.seen[i] || f.v[i] != "v" {
			t.Errorf("%q was not read as field %d", name, i)
		}
		for j := 0; j < len(name); j++ {
			for bit := 0; bit < 8; bit++ {
				b := []byte(name)
				b[j] ^= 1 << bit
				f := answerFieldsOf([][2]string{{string(b), "v"}})
				for k := range f.seen {
					if f.seen[k] && answerNames[k] != string(b) {
						t.Errorf("%q was read as field %q", b, answerNames[k])
					}
				}
			}
		}
	}
}
