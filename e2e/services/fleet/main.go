// Command fleet runs upstream services for a gateway: each service one
// listener in front of -replicas replicas taken round-robin, each replica
// with its own per-service limiter (the old design, ADR-001), its own coarse
// safety limit (the new design's backstop) and its own bounded worker pool.
// Package services says more.
//
//	fleet -plans deploy/compose/plans.yaml -limiter enforce \
//	      -service orders=127.0.0.1:9001 -service billing=127.0.0.1:9002
//
// GET /_stats on a service's address gives its counts per replica and
// client; GET /_shadow compares the edge's shadow decisions with the
// replicas' own (run with -limiter observe or enforce while the filter runs
// in shadow mode).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/edgelimit/edgelimit/e2e/services"
)

// serviceFlags collects repeated -service NAME=HOST:PORT.
type serviceFlags []service

type service struct{ name, addr string }

func (s *serviceFlags) String() string {
	parts := make([]string, len(*s))
	for i, v := range *s {
		parts[i] = v.name + "=" + v.addr
	}
	return strings.Join(parts, ",")
}

func (s *serviceFlags) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want NAME=HOST:PORT, got %q", v)
	}
	for _, o := range *s {
		if o.name == name {
			return fmt.Errorf("service %q given twice", name)
		}
	}
	*s = append(*s, service{name, addr})
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	var svcs serviceFlags
	fs.Var(&svcs, "service", "a service as NAME=HOST:PORT, repeatable (default orders=127.0.0.1:9001 and billing=127.0.0.1:9002, envoy/envoy.yaml's clusters)")
	replicas := fs.Int("replicas", services.DefaultReplicas, "replicas per service")
	plansPath := fs.String("plans", "", "the sidecar's plans file: each client's plan (required with -limiter other than off, or -safety > 0)")
	keySalt := fs.String("key-salt", "", "the sidecar's -key-salt, which a plans file listing clients by hmac-sha256: digest needs; when not given, $SIDECAR_KEY_SALT, which keeps it off the command line")
	limiter := fs.String("limiter", "off", "per-service limiter: off, enforce (the old design) or observe (decide, count, never reject)")
	safetyFactor := fs.Float64("safety", 10, "coarse safety limit per replica, as a multiple of the client's plan; 0 for none")
	workers := fs.Int("workers", 0, "workers per replica; 0 for unbounded capacity")
	queue := fs.Int("queue", 64, "requests waiting per replica beyond the busy workers (with -workers)")
	serviceTime := fs.Duration("service-time", 0, "how long each request holds its worker (with -workers)")
	check := fs.Bool("check", false, "check the flags and the plans file, then exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keySalt == "" {
		*keySalt = os.Getenv("SIDECAR_KEY_SALT")
	}
	if len(svcs) == 0 {
		svcs = serviceFlags{{"orders", "127.0.0.1:9001"}, {"billing", "127.0.0.1:9002"}}
	}
	mode, err := services.ParseMode(*limiter)
	if err != nil {
		return fmt.Errorf("-limiter: %w", err)
	}
	c := services.Config{
		Replicas: *replicas, Limiter: mode, SafetyFactor: *safetyFactor,
		Workers: *workers, Queue: *queue, ServiceTime: *serviceTime,
	}
	if *plansPath != "" {
		if c.Plans, err = services.PlansFromFile(*plansPath, []byte(*keySalt)); err != nil {
			return err
		}
	} else if mode != services.LimiterOff || *safetyFactor != 0 {
		return fmt.Errorf("-plans: required with -limiter %s and -safety %v", mode, *safetyFactor)
	}
	if *check {
		fmt.Println("fleet: configuration OK")
		return nil
	}

	var started []*services.Service
	defer func() {
		for _, s := range started {
			s.Close()
		}
	}()
	for _, sv := range svcs {
		c.Name = sv.name
		s, err := services.Start(sv.addr, c)
		if err != nil {
			return err
		}
		started = append(started, s)
		slog.Info("serving", "service", s.Name, "addr", s.Addr, "replicas", *replicas,
			"limiter", mode.String(), "safety", *safetyFactor, "workers", *workers, "service_time", serviceTime.String())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return nil
}
