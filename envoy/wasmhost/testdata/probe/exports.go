//go:build wasip1

package main

// The proxy-wasm callbacks; each runs the script configured for its phase.

var (
	// configs holds each root context's script, by its id; parents maps
	// a stream to its root context, whose script it runs.
	configs    = map[uint32]map[string]string{}
	parents    = map[uint32]uint32{}
	lastStream uint32
)

// script returns the script of context id's root context.
func script(id uint32) map[string]string {
	if root, ok := parents[id]; ok {
		id = root
	}
	return configs[id]
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent != 0 {
		lastStream = id
		parents[id] = parent
	} else {
		// Envoy lets the root context read the plugin configuration as it
		// is created, so even on_vm_start has its script.
		loadConfig(id, ^uint32(0))
	}
	run("context_create", id)
}

func loadConfig(root, size uint32) {
	var ptr, n uint32
	if st := proxyGetBufferBytes(7, 0, size, &ptr, &n); st == 0 {
		configs[root] = parseSections(string(hostBytes(ptr, n)))
	}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 { return run("vm_start", root) }

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	loadConfig(root, size)
	return run("configure", root)
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	logf("request_headers n=%d eos=%d", n, eos)
	// A request carrying x-probe-panic makes the module panic (the VM
	// fails), for tests that have no way to give the probe a script.
	key := []byte("x-probe-panic")
	var ptr, size uint32
	if proxyGetHeaderMapValue(0, ptrOf(key), uint32(len(key)), &ptr, &size) == 0 {
		panic("x-probe-panic: " + string(hostBytes(ptr, size)))
	}
	// One carrying x-probe-pause is paused (StopIteration) and never
	// resumed.
	pause := []byte("x-probe-pause")
	if proxyGetHeaderMapValue(0, ptrOf(pause), uint32(len(pause)), &ptr, &size) == 0 {
		return 1
	}
	return run("request_headers", id)
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	logf("response_headers n=%d eos=%d", n, eos)
	return run("response_headers", id)
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, token, headers, body, trailers uint32) {
	cbToken = token
	logf("http_call_response token=%d headers=%d body=%d trailers=%d", token, headers, body, trailers)
	run("http_call_response", root)
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) { run("tick", root) }

//go:wasmexport proxy_on_log
func onLog(id uint32) { run("log", id) }

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return run("done", id) }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	run("delete", id)
	delete(parents, id)
	delete(configs, id)
}
