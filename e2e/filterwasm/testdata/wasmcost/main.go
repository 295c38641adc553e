//go:build wasip1

// Command wasmcost exports package wasmcost's operations from a module
// built like the filter (standard Go, wasip1, c-shared), for
// BenchmarkGoInWasm.
package main

import "github.com/edgelimit/edgelimit/e2e/filterwasm/wasmcost"

//go:wasmimport env noop
func noop(x uint32) uint32

func init() { wasmcost.Host = noop }

//go:wasmexport host_calls
func hostCalls(x uint32) uint32 { return wasmcost.HostCalls(x) }

//go:wasmexport empty
func empty(x uint32) uint32 { return wasmcost.Empty(x) }

//go:wasmexport map_int
func mapInt(x uint32) uint32 { return wasmcost.MapInt(x) }

//go:wasmexport map_ptr
func mapPtr(x uint32) uint32 { return wasmcost.MapPtr(x) }

//go:wasmexport map_get
func mapGet(x uint32) uint32 { return wasmcost.MapGet(x) }

//go:wasmexport alloc
func alloc(x uint32) uint32 { return wasmcost.Alloc(x) }

//go:wasmexport loop
func loop(x uint32) uint32 { return wasmcost.Loop(x) }

func main() {}
