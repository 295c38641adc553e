// Command sidecar is the rate limiter's decision service: it sits next to the
// proxy, looks up the client's plan, and takes tokens from the client's bucket
// in Redis with one round trip. Run `sidecar -h` for flags and environment
// variables; package server documents the HTTP contract.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/internal/healthcheck"
	"github.com/edgelimit/edgelimit/sidecar/app"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
)

// shutdownGrace bounds how long in-flight checks may take to finish after
// SIGTERM; they take milliseconds, so this only matters for stuck clients.
const shutdownGrace = 10 * time.Second

func main() {
	if os.Getenv("GOGC") == "" {
		// The live heap is small (plans, pools) and a check allocates a few
		// hundred bytes that die at once: with the default GOGC=100 the
		// collector would run many times a second for nothing.
		debug.SetGCPercent(400)
	}
	if len(os.Args) > 1 && os.Args[1] == "digest" {
		os.Exit(runDigest(os.Args[2:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		// The container health check: the image has no HTTP client.
		os.Exit(healthcheck.Main("sidecar", os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs passed in; it returns the exit
// code: 0 success, 1 a runtime failure or a config that -check rejects, 2 bad
// flags.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sidecar: %v\n", err)
		return 2
	}
	if o.check {
		return checkConfig(o, stdout, stderr)
	}

	// The signals are caught before the listeners open: app.Start serves
	// while it waits up to a second for Redis, and a signal there would
	// otherwise take its default action, SIGHUP's and SIGTERM's alike
	// killing the process. One that comes during the start is acted on
	// once it is done.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(hup)
	defer signal.Stop(stop)

	log := newLogger(o, stderr)
	a, err := app.Start(o.cfg, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}

	for {
		select {
		case <-hup:
			_ = a.Reload() // logged by the plans store
		case sig := <-stop:
			log.Info("shutting down", "signal", sig.String())
			ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
			err := a.Shutdown(ctx)
			cancel()
			if err != nil {
				log.Error("shutdown", "err", err)
				return 1
			}
			return 0
		case err := <-a.Done():
			log.Error("http server stopped", "err", err)
			return 1
		}
	}
}

// checkConfig is -check: the flags are already valid; load the plans file
// and report. Nothing is started and Redis is not contacted.
func checkConfig(o *options, stdout, stderr io.Writer) int {
	p, err := plans.Load(o.cfg.PlansPath)
	if err == nil {
		err = p.CheckDigests(keys.New(o.cfg.KeySalt).Kind())
	}
	if err != nil {
		fmt.Fprintf(stderr, "sidecar: %v\n", err)
		return 1
	}
	def := "none (unknown keys get 403)"
	if p.Default != nil {
		def = p.Default.Name
	}
	fmt.Fprintf(stdout, "ok: %s: %d plans, %d clients, default plan %s; redis %s (%s)\n",
		p.File, len(p.ByName), p.Clients(), def, o.cfg.Redis.Redacted, o.cfg.Redis.Kind)
	return 0
}

func newLogger(o *options, w io.Writer) *slog.Logger {
	ho := &slog.HandlerOptions{Level: o.logLevel}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// splitHostPort is net.SplitHostPort that also wants a port of 0 to 65535.
func splitHostPort(addr string) (string, string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", err
	}
	// Digits only: Atoi would take "+80", which no listener does.
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", "", fmt.Errorf("bad port %q", port)
	}
	return host, port, nil
}
