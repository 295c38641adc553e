// Command demoservice is the upstream used by the demo deployment
// (deploy/compose/compose.yaml): a counting service of package services
// with one replica and no limiter. It answers every request with 200 and
// reports what reached it, per client, at GET /_stats.
package main

import (
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/edgelimit/edgelimit/e2e/services"
)

func main() {
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
