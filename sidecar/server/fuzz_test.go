package server

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/lua"
)

// FuzzCheckRequest feeds raw HTTP requests, as read off the wire by fasthttp,
// to the handler. Seeds are in testdata/fuzz/FuzzCheckRequest. Nothing may
// panic; every answer is one of the contract's statuses; a 200 or 429 carries
// the ratelimit headers, a 429 the script's wait, and a 400 reason is one
// short line. Every bucket holds half a token: a check is denied (or, above
// the capacity, never), a warm-up's peek allowed.
func FuzzCheckRequest(f *testing.F) {
	d := &fakeDecider{bucket: holding(0.5)}
	s, _, _ := newTestServer(f, planYAML, d)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
			return // fasthttp answers unreadable requests itself (see requestError)
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
		s.Handle(&ctx)
		code := ctx.Response.StatusCode()
		if string(ctx.Path()) != "/v1/check" {
			switch code {
			case 200, 404, 405, 503:
			case 400:
				// A warm-up's one header is a check's x-ratelimit-sent,
				// and only that refuses it.
				if _, err := ParseSent(&req.Header); string(ctx.Path()) != "/v1/warm" || err == nil {
					t.Fatalf("%s: status 400", ctx.Path())
				}
			default:
				t.Fatalf("%s: status %d", ctx.Path(), code)
			}
			return
		}
		switch code {
		case 200, 429:
			for _, h := range []string{HeaderLimit, HeaderRemaining, HeaderReset, HeaderTokens, HeaderPlan} {
				if len(ctx.Response.Header.Peek(h)) == 0 {
					t.Fatalf("%d without %s", code, h)
				}
			}
			if code == 429 {
				if v, err := strconv.Atoi(string(ctx.Response.Header.Peek(HeaderRetryAfter))); err != nil || v < 1 {
					t.Fatalf("429 with retry-after %q", ctx.Response.Header.Peek(HeaderRetryAfter))
				}
				// The wait is the script's for the plan and cost the
				// decider was asked about.
				d.mu.Lock()
				call := d.calls[len(d.calls)-1]
				d.mu.Unlock()
				want := lua.Decide(call.limit, d.bucket(call.limit), call.cost)
				never, ms := ctx.Response.Header.Peek(HeaderNever), ctx.Response.Header.Peek(HeaderRetryAfterMs)
				if v, err := strconv.ParseFloat(string(ms), 64); (never != nil) != want.Never ||
					!want.Never && (err != nil || v != want.RetryMs || v <= 0) {
					t.Fatalf("429 for cost %d under %+v: never %q, retry-after-ms %q; want never %v, %v ms",
						call.cost, call.limit, never, ms, want.Never, want.RetryMs)
				}
			}
		case 400:
			body := ctx.Response.Body()
			if len(body) == 0 || len(body) > 100 || bytes.Count(body, []byte("\n")) != 1 {
				t.Fatalf("400 reason %q is not one short line", body)
			}
		case 503:
			// The fake decider never fails: only a check the proxy gave up
			// on (x-ratelimit-sent) is answered 503.
			if string(ctx.Response.Body()) != "expired before it was read\n" {
				t.Fatalf("503 %q", ctx.Response.Body())
			}
		case 403, 404, 405:
		default:
			t.Fatalf("status %d not in the contract", code)
		}
	})
}

// FuzzParseCost: ParseCost accepts exactly the decimal numbers 1..MaxCost.
func FuzzParseCost(f *testing.F) {
	for _, s := range []string{"1", "0", "-1", "007", "1000000000", "1000000001", "", "1e3", " 1", "18446744073709551617"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := ParseCost(b)
		ref, refErr := strconv.ParseUint(string(b), 10, 64)
		digitsOnly := len(b) > 0 && len(bytes.TrimLeft(b, "0123456789")) == 0
		if err == nil {
			if !digitsOnly || refErr != nil || int64(ref) != n || n < 1 || n > MaxCost {
				t.Fatalf("ParseCost(%q) = %d, accepted wrongly (ref %d, %v)", b, n, ref, refErr)
			}
			return
		}
		if digitsOnly && refErr == nil && ref >= 1 && ref <= MaxCost {
			t.Fatalf("ParseCost(%q) rejected a valid cost: %v", b, err)
		}
	})
}
