// Command floor serves POST /v1/check the way the sidecar does, without
// Redis, so that sidecarbench can put the sidecar's CPU per check beside
// what answering costs when nothing is decided on Redis:
//
//	floor -listen ADDR -plans FILE -answer decided|fixed
//
// decided: the sidecar's own server and handler (sidecar/server: parsing,
// the key's digest, the plan, the answer's headers, the metrics), with a
// decision made at once in the process instead of a script run in Redis.
// fixed: the same fasthttp server with the sidecar's settings, answering
// every request with one allowed answer formatted at start (the same
// status and headers), and doing nothing else: the HTTP server's own cost.
//
// It logs `msg="floor listening" addr=...` to stderr once it listens, and
// runs until it is killed.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/server"
	"github.com/edgelimit/edgelimit/sidecar/stats"
)

// atOnce allows every check without Redis, with the tokens an allowed
// check of a full bucket would leave.
type atOnce struct{}

func (atOnce) Decide(_ time.Time, _ string, l lua.Limit, cost int64) (lua.Result, error) {
	return lua.Result{Allowed: true, Tokens: l.Capacity - float64(cost), ResetMs: float64(cost) / l.Rate * 1000}, nil
}

func (atOnce) Ready(context.Context) error { return nil }

func (atOnce) Refused() error { return nil }

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	plansFile := flag.String("plans", "", "the sidecar's plans file")
	answer := flag.String("answer", "decided", "decided (the sidecar's handler, deciding at once) or fixed (one answer, no handler)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, *listen, *plansFile, *answer); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, listen, plansFile, answer string) error {
	hs, err := newServer(plansFile, answer)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Info("floor listening", "addr", ln.Addr().String(), "answer", answer)
	return hs.Serve(ln)
}

// newServer returns the server for -answer, on the plans in plansFile.
func newServer(plansFile, answer string) (*fasthttp.Server, error) {
	p, err := plans.Load(plansFile)
	if err != nil {
		return nil, fmt.Errorf("-plans: %w", err)
	}
	s := server.New(server.Options{
		Plans:   func() *plans.Plans { return p },
		Decider: atOnce{},
		Keys:    keys.New(nil),
		Stats:   stats.New(),
		Log:     slog.New(slog.DiscardHandler),
	})
	hs := s.HTTPServer()
	switch answer {
	case "decided":
	case "fixed":
		plan, ok := p.Lookup(nil)
		if !ok {
			return nil, fmt.Errorf("-answer fixed: the plans file has no default_plan")
		}
		limit := lua.Limit{Capacity: plan.Capacity, Rate: plan.Rate}
		res, _ := atOnce{}.Decide(time.Time{}, "", limit, 1)
		var a server.Answer
		a.Fill(res, plan)
		hs.Handler = func(ctx *fasthttp.RequestCtx) {
			a.SetHeaders(&ctx.Response.Header)
			ctx.SetStatusCode(a.Status)
		}
	default:
		return nil, fmt.Errorf("-answer: want decided or fixed, got %q", answer)
	}
	return hs, nil
}
