// Command demoservice is the upstream used by the demo deployment
// (deploy/compose/compose.yaml): a counting service of package services
// with one replica and no limiter. It answers every request with 200 and
// reports what reached it, per client, at GET /_stats.
//
// `demoservice healthcheck [-timeout D] URL` exits 0 if URL answers 2xx:
// compose's health check, the image having no HTTP client.
package main

import (
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/edgelimit/edgelimit/e2e/services"
	"github.com/edgelimit/edgelimit/internal/healthcheck"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck.Main("demoservice", os.Args[2:], os.Stdout, os.Stderr))
	}
	listen := flag.String("listen", "127.0.0.1:9001", "address to serve on")
	name := flag.String("name", "orders", "service name reported in responses")
	flag.Parse()
	s, err := services.Start(*listen, services.Config{Name: *name, Replicas: 1})
	if err != nil {
		slog.Error("listen", "addr", *listen, "err", err)
		os.Exit(1)
	}
	slog.Info("serving", "service", *name, "addr", s.Addr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Close()
}
