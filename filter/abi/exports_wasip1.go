//go:build wasip1

package abi

import "unsafe"

// plugin receives every callback; SetPlugin sets it from package main's init.
var plugin Plugin

// SetPlugin makes p the receiver of every proxy callback. Call it from an
// init function: it makes no host call, which matters because the proxy
// traps any proxy_* call but proxy_log during _initialize.
func SetPlugin(p Plugin) { plugin = p }

// Every callback recovers: a panic that escapes the plugin is logged and
// turned into the callback's safe result, so that the proxy never sees a
// trap. The plugin recovers its own panics with more context; this is the
// last line. Each export defers its own closure that calls recover itself,
// rather than a shared helper taking the result's address and the export's
// name: that was two more Go calls per callback inside wasm, where a call
// costs tens of instructions (filter/RATIONALE.md, "What a request costs
// inside wasm"). The hot callbacks' closures call recover only when the
// callback did not finish (done is set at its end), for the same reason.

// logPanic logs a panic that reached the binding.
func logPanic(where string, r any) {
	ProxyHost().Log(LogCritical, "abi: panic in "+where+": "+PanicMessage(r))
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// The ABI version marker: its presence tells the proxy which ABI the module
// speaks.
//
//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion0_2_1() {}

// proxyOnMemoryAllocate gives the host size bytes of module memory to write a
// host call's result into. Envoy looks up "malloc" first and then this
// export; the module exports only this one, so that no C-looking allocator
// is mistaken for a general-purpose one. The memory comes from the arena
// and is reclaimed when the next callback starts (see arena).
//
// It defers no recover, as it has nothing to recover from: alloc slices
// only within what it checked, and its spill is a make of at most 2^32-1
// bytes, below the largest allocation the wasm runtime accepts (2^32), so
// that it never panics; running out of linear memory is the runtime's fatal
// error, which no recover catches. The host calls it once per result,
// twice on an allowed request.
//
//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) unsafe.Pointer {
	return unsafe.Pointer(unsafe.SliceData(mem.alloc(size)[:1]))
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parent uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				logPanic("proxy_on_context_create", r)
			}
		}
	}()
	mem.reset()
	if plugin != nil {
		plugin.OnContextCreate(id, parent)
	}
	done = true
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(root, size uint32) (ok uint32) {
	defer func() {
		if r := recover(); r != nil {
			ok = 0
			logPanic("proxy_on_vm_start", r)
		}
	}()
	mem.reset()
	if plugin == nil {
		return 0
	}
	return boolU32(plugin.OnVMStart(root, int(size)))
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(root, size uint32) (ok uint32) {
	defer func() {
		if r := recover(); r != nil {
			ok = 0
			logPanic("proxy_on_configure", r)
		}
	}()
	mem.reset()
	if plugin == nil {
		return 0
	}
	return boolU32(plugin.OnConfigure(root, int(size)))
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, numHeaders, endOfStream uint32) (action uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				action = uint32(ActionContinue)
				logPanic("proxy_on_request_headers", r)
			}
		}
	}()
	mem.reset()
	action = uint32(ActionContinue)
	if plugin != nil {
		action = uint32(plugin.OnRequestHeaders(id, int(numHeaders), endOfStream != 0))
	}
	done = true
	return action
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(id, numHeaders, endOfStream uint32) (action uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				action = uint32(ActionContinue)
				logPanic("proxy_on_response_headers", r)
			}
		}
	}()
	mem.reset()
	action = uint32(ActionContinue)
	if plugin != nil {
		action = uint32(plugin.OnResponseHeaders(id, int(numHeaders), endOfStream != 0))
	}
	done = true
	return action
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(root, token, numHeaders, bodySize, numTrailers uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				logPanic("proxy_on_http_call_response", r)
			}
		}
	}()
	mem.reset()
	if plugin != nil {
		plugin.OnHTTPCallResponse(root, token, int(numHeaders), int(bodySize), int(numTrailers))
	}
	done = true
}

//go:wasmexport proxy_on_tick
func proxyOnTick(root uint32) {
	defer func() {
		if r := recover(); r != nil {
			logPanic("proxy_on_tick", r)
		}
	}()
	mem.reset()
	if plugin != nil {
		plugin.OnTick(root)
	}
}

// proxy_on_log and proxy_on_done are not exported: the filter has nothing
// to do in either, and Envoy skips a callback the module does not export
// (an absent on_done counts as done). filter/RATIONALE.md, "Why neither
// proxy_on_log nor proxy_on_done?", has where proxy-wasm-cpp-host does so.

//go:wasmexport proxy_on_delete
func proxyOnDelete(id uint32) {
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				logPanic("proxy_on_delete", r)
			}
		}
	}()
	mem.reset()
	if plugin != nil {
		plugin.OnDelete(id)
	}
	done = true
}
