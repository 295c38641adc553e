// Package wasmhost is a headless proxy-wasm host that plays Envoy: it loads a
// proxy-wasm module (ABI 0.2.0/0.2.1) with wazero and answers every host call
// the way Envoy and its proxy-wasm-cpp-host do, so that a filter proven here
// behaves the same inside Envoy.
//
// A Module is compiled once (through a process-wide wazero compilation
// cache); each VM is one instance of it, as Envoy runs one VM per worker
// thread. Calls into one VM are serialized, the way a worker's event loop
// serializes them: a call runs on its caller's goroutine when the VM is
// idle, else it queues for the VM's own goroutine. Plugin start-up follows Envoy:
// _initialize (only proxy_log and WASI allowed), proxy_on_context_create for
// the root context, proxy_on_vm_start, proxy_on_configure; a false return
// rejects the configuration. A VM runs more than one plugin as Envoy does
// across a listener update (AddPlugin, Plugin.Remove): each has its own
// root context, configuration, tick and streams.
//
// HTTP streams (Stream) follow Envoy's filter lifecycle: request headers
// (continue, paused or a local reply), resumption by proxy_continue_stream or
// a local reply sent from an HTTP-call callback, response headers, then
// on_log, on_done and on_delete. Local replies and resumptions are deferred
// until the current call into the VM returns, as Envoy defers them.
//
// HTTP calls leave through a Dispatcher, so that tests answer them by hand
// and the gateway sends them to real clusters (HTTPDispatcher). Timeouts are
// the host's, as Envoy's async client enforces them: a timed-out call is
// answered with a 504 local reply.
//
// WASI is Envoy's, not a full one: no files, no arguments, stdout and stderr
// go to the log, real clocks and randomness. poll_oneoff can be answered the
// way each Envoy generation does (see PollMode). Where this host knowingly
// differs from Envoy, RATIONALE.md in this folder says so and why.
package wasmhost
