package server

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// instantDecider allows every check at once.
type instantDecider struct{}

func (instantDecider) Decide(time.Time, string, lua.Limit, int64) (lua.Result, error) {
	return lua.Result{Allowed: true, Tokens: 199.5, ResetMs: 5}, nil
}

func (instantDecider) Ready(context.Context) error { return nil }

func (instantDecider) Refused() error { return nil }

// BenchmarkCheckHandler is the handler's own work for one allowed check,
// without the HTTP connection and without Redis: parsing, the digest, the
// plan, x-ratelimit-sent's wait, the answer's headers, the metrics. The
// sent header is set afresh for each check, as the filter sends it (a
// fixed one would age into an expired check).
func BenchmarkCheckHandler(b *testing.B) {
	p, err := plans.Parse("test.yaml", []byte(planYAML))
	if err != nil {
		b.Fatal(err)
	}
	s := New(Options{
		Plans:   func() *plans.Plans { return p },
		Decider: instantDecider{},
		Keys:    keys.New(nil),
		Stats:   stats.New(),
		Log:     slog.New(slog.DiscardHandler),
	})
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/check")
	req.Header.Set(HeaderKey, "client-key-123")
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
	var sent []byte
	b.ReportAllocs()
	for b.Loop() {
		sent = strconv.AppendInt(sent[:0], time.Now().UnixMicro(), 10)
		req.Header.SetBytesV(HeaderSent, sent)
		ctx.Response.Reset()
		s.Handle(&ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
}
