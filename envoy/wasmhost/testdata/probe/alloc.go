//go:build wasip1

package main

import "unsafe"

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	if allocHook != "" {
		exec(allocHook)
	}
	b := make([]byte, size+1)
	allocs = append(allocs, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}
