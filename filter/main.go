//go:build wasip1

// Command filter is the edge rate limiter's proxy-wasm HTTP filter, built
// with the standard Go toolchain as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o build/filter.wasm ./filter
//
// and then optimised by wasm-opt (make build/filter.wasm does both).
//
// Envoy calls _initialize (which runs init below), then the proxy_on_*
// exports of package abi, which hand every callback to the limiter.
// filter/README.md has the configuration, the metrics and the minimum Envoy
// version.
package main

import (
	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

func init() {
	// No host call here: during _initialize Envoy allows only proxy_log.
	abi.SetPlugin(plugin(limiter.New(abi.ProxyHost())))
}

// main is never called in a c-shared module; the build requires it.
func main() {}
