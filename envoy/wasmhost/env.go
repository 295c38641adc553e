package wasmhost

import (
	"slices"
	"strings"
	"time"
)

// The proxy-wasm host functions (module "env"). Each follows Envoy's
// behaviour for that call: exports.cc in proxy-wasm-cpp-host for argument
// and memory handling, Envoy's wasm context.cc for the meaning.

func ret(s []uint64, st Status) { s[0] = uint64(st) }

func u32(v uint64) uint32 { return uint32(v) }

// ctxOrEffective is the context host calls act on: the one the effective
// context was set to during this call, if it still exists, else the one
// called.
func (vm *VM) ctxOrEffective() *vmContext {
	if vm.effective != 0 {
		if c := vm.contexts[vm.effective]; c != nil {
			return c
		}
	}
	if vm.current == nil {
		return &vmContext{} // the VM context (id 0), during initialization
	}
	return vm.current
}

func envFunctions() []hostFunc {
	env := func(name string, nparams int, fn func(vm *VM, s []uint64)) hostFunc {
		return hostFunc{module: "env", name: name, params: ints(nparams), results: ints(1), fn: fn}
	}
	return []hostFunc{
		env("proxy_log", 3, func(vm *VM, s []uint64) {
			level := LogLevel(u32(s[0]))
			if level > logLevelMax {
				ret(s, StatusBadArgument)
				return
			}
			msg, ok := vm.readString(u32(s[1]), u32(s[2]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			vm.log(level, msg)
			ret(s, StatusOK)
		}),
		env("proxy_get_log_level", 1, func(vm *VM, s []uint64) {
			if !vm.writeU32(u32(s[0]), uint32(vm.o.LogLevel)) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusOK)
		}),
		env("proxy_get_status", 3, func(vm *VM, s []uint64) {
			if !vm.writeU32(u32(s[0]), vm.status) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, copyOut(vm, vm.statusMsg, u32(s[1]), u32(s[2])))
		}),
		env("proxy_set_property", 4, func(vm *VM, s []uint64) {
			key, ok1 := vm.readString(u32(s[0]), u32(s[1]))
			val, ok2 := vm.read(u32(s[2]), u32(s[3]))
			if !ok1 || !ok2 {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, vm.setProperty(vm.ctxOrEffective(), key, val))
		}),
		env("proxy_get_property", 4, func(vm *VM, s []uint64) {
			path, ok := vm.readString(u32(s[0]), u32(s[1]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			val, st := vm.property(vm.ctxOrEffective(), path)
			if st != StatusOK {
				ret(s, st)
				return
			}
			ret(s, copyOut(vm, val, u32(s[2]), u32(s[3])))
		}),
		env("proxy_send_local_response", 8, func(vm *VM, s []uint64) {
			details, ok1 := vm.readString(u32(s[1]), u32(s[2]))
			body, ok2 := vm.read(u32(s[3]), u32(s[4]))
			hdrs, ok3 := vm.mem.Read(u32(s[5]), u32(s[6]))
			if !ok1 || !ok2 || !ok3 {
				ret(s, StatusInvalidMemAccess)
				return
			}
			c := vm.ctxOrEffective()
			if st := c.stream; st != nil {
				reply := LocalReply{
					Status:     int(u32(s[0])),
					Body:       body,
					Headers:    vm.text.pairs(hdrs, 0),
					Details:    replaceSpaces(details),
					GRPCStatus: int32(u32(s[7])),

					InRequestHeaders: st.inReqHeaders,
				}
				vm.defer_(func() { st.sendLocalReply(reply) })
			}
			// Whatever the callback returns, the stream stops after it.
			vm.stopIter = true
			ret(s, StatusOK)
		}),
		env("proxy_get_shared_data", 5, func(vm *VM, s []uint64) {
			key, ok := vm.lookupKey(u32(s[0]), u32(s[1]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			val, cas, found := vm.o.SharedData.Get(vm.o.VMID, key)
			if !found {
				ret(s, StatusNotFound)
				return
			}
			if st := copyOut(vm, val, u32(s[2]), u32(s[3])); st != StatusOK {
				ret(s, st)
				return
			}
			if !vm.writeU32(u32(s[4]), cas) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusOK)
		}),
		env("proxy_set_shared_data", 5, func(vm *VM, s []uint64) {
			key, ok1 := vm.readString(u32(s[0]), u32(s[1]))
			val, ok2 := vm.read(u32(s[2]), u32(s[3]))
			if !ok1 || !ok2 {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, vm.o.SharedData.Set(vm.o.VMID, key, val, u32(s[4])))
		}),
		env("proxy_register_shared_queue", 3, unimplemented),
		env("proxy_resolve_shared_queue", 5, unimplemented),
		env("proxy_dequeue_shared_queue", 3, unimplemented),
		env("proxy_enqueue_shared_queue", 3, unimplemented),
		env("proxy_get_header_map_value", 5, func(vm *VM, s []uint64) {
			t, ok := mapArg(s)
			if !ok {
				return
			}
			key, ok := vm.lookupKey(u32(s[1]), u32(s[2]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			m, st := vm.constMap(vm.ctxOrEffective(), t)
			if st != StatusOK {
				ret(s, st)
				return
			}
			key = strings.ToLower(key)
			for _, h := range m {
				if h[0] == key {
					// Envoy hands out the first value only.
					ret(s, copyOut(vm, h[1], u32(s[3]), u32(s[4])))
					return
				}
			}
			ret(s, StatusNotFound)
		}),
		env("proxy_add_header_map_value", 5, func(vm *VM, s []uint64) {
			editMap(vm, s, func(m []Header, key, val string) []Header {
				return insertHeader(m, Header{key, val})
			})
		}),
		env("proxy_replace_header_map_value", 5, func(vm *VM, s []uint64) {
			editMap(vm, s, func(m []Header, key, val string) []Header {
				// Envoy's setCopy (HeaderMapImpl, since the runtime flag
				// http_set_copy_replace_all_headers became the only
				// behaviour): every value of key is removed, then one is
				// added as add would.
				return insertHeader(without(m, key), Header{key, val})
			})
		}),
		env("proxy_remove_header_map_value", 3, func(vm *VM, s []uint64) {
			t, ok := mapArg(s)
			if !ok {
				return
			}
			key, ok := vm.lookupKey(u32(s[1]), u32(s[2]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			changeMap(vm, s, t, func(m []Header) []Header { return without(m, strings.ToLower(key)) })
		}),
		env("proxy_get_header_map_pairs", 3, func(vm *VM, s []uint64) {
			t, ok := mapArg(s)
			if !ok {
				return
			}
			// Always OK: a map that is not there reads as empty.
			m, _ := vm.constMap(vm.ctxOrEffective(), t)
			dst, st := vm.handOut(pairsSize(m), u32(s[1]), u32(s[2]))
			if st == StatusOK {
				encodePairs(dst, m)
			}
			ret(s, st)
		}),
		env("proxy_set_header_map_pairs", 3, func(vm *VM, s []uint64) {
			t, ok := mapArg(s)
			if !ok {
				return
			}
			data, ok := vm.mem.Read(u32(s[1]), u32(s[2]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			changeMap(vm, s, t, func([]Header) []Header { return vm.text.pairs(data, headerRoom) })
		}),
		env("proxy_get_header_map_size", 2, func(vm *VM, s []uint64) {
			t, ok := mapArg(s)
			if !ok {
				return
			}
			m := vm.mutMap(vm.ctxOrEffective(), t)
			if m == nil {
				ret(s, StatusBadArgument)
				return
			}
			size := 0
			for _, h := range *m {
				size += len(h[0]) + len(h[1])
			}
			if !vm.writeU32(u32(s[1]), uint32(size)) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusOK)
		}),
		env("proxy_get_buffer_status", 3, func(vm *VM, s []uint64) {
			b, st := vm.bufferArg(s[0])
			if st != StatusOK {
				ret(s, st)
				return
			}
			if !vm.writeU32(u32(s[1]), uint32(len(b))) || !vm.writeU32(u32(s[2]), 0) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusOK)
		}),
		env("proxy_get_buffer_bytes", 5, func(vm *VM, s []uint64) {
			b, st := vm.bufferArg(s[0])
			if st != StatusOK {
				ret(s, st)
				return
			}
			start, length := uint64(u32(s[1])), uint64(u32(s[2]))
			switch {
			case start > uint64(len(b)):
				length = 0
			case start+length > uint64(len(b)):
				length = uint64(len(b)) - start
			}
			if length == 0 {
				if !vm.writeU32(u32(s[3]), 0) || !vm.writeU32(u32(s[4]), 0) {
					ret(s, StatusInvalidMemAccess)
					return
				}
				ret(s, StatusOK)
				return
			}
			ret(s, copyOut(vm, b[start:start+length], u32(s[3]), u32(s[4])))
		}),
		env("proxy_set_buffer_bytes", 5, func(vm *VM, s []uint64) {
			if _, st := vm.bufferArg(s[0]); st != StatusOK {
				ret(s, st)
				return
			}
			if _, ok := vm.read(u32(s[3]), u32(s[4])); !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			// This host carries no bodies; every buffer it has is
			// read-only, like Envoy's immutable ones.
			ret(s, StatusBadArgument)
		}),
		env("proxy_http_call", 10, func(vm *VM, s []uint64) { ret(s, vm.httpCall(s)) }),
		env("proxy_grpc_call", 12, unimplemented),
		env("proxy_grpc_stream", 9, unimplemented),
		env("proxy_grpc_close", 1, unimplemented),
		env("proxy_grpc_cancel", 1, unimplemented),
		env("proxy_grpc_send", 4, unimplemented),
		env("proxy_set_tick_period_milliseconds", 1, func(vm *VM, s []uint64) {
			// Envoy's timer is the root context's, also when a stream
			// sets it.
			if p := vm.ctxOrEffective().plugin; p != nil {
				p.setTickPeriod(time.Duration(u32(s[0])) * time.Millisecond)
			}
			ret(s, StatusOK)
		}),
		env("proxy_get_current_time_nanoseconds", 1, func(vm *VM, s []uint64) {
			if !vm.writeU64(u32(s[0]), uint64(vm.o.Clock.Now().UnixNano())) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusOK)
		}),
		env("proxy_define_metric", 4, func(vm *VM, s []uint64) {
			kind := MetricType(u32(s[0]))
			name, ok := vm.readString(u32(s[1]), u32(s[2]))
			if !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			if kind > metricTypeMax {
				ret(s, StatusBadArgument)
				return
			}
			vm.nextMetric[kind] += 4
			id := vm.nextMetric[kind]
			vm.metricIDs[id] = vm.o.Stats.define(kind, name)
			vm.metricDefs[name]++
			if !vm.writeU32(u32(s[3]), id) {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusOK)
		}),
		{module: "env", name: "proxy_increment_metric", params: types(i32, i64), results: ints(1),
			fn: func(vm *VM, s []uint64) {
				id, delta := u32(s[0]), int64(s[1])
				m := vm.metricIDs[id]
				switch MetricType(id & 3) {
				case MetricCounter:
					switch {
					case m == nil:
						ret(s, StatusNotFound)
					case delta <= 0:
						ret(s, StatusBadArgument)
					default:
						vm.o.Stats.add(m, delta)
						ret(s, StatusOK)
					}
				case MetricGauge:
					if m == nil {
						ret(s, StatusNotFound)
						return
					}
					vm.o.Stats.add(m, delta)
					ret(s, StatusOK)
				default:
					ret(s, StatusBadArgument)
				}
			}},
		{module: "env", name: "proxy_record_metric", params: types(i32, i64), results: ints(1),
			fn: func(vm *VM, s []uint64) {
				id, v := u32(s[0]), s[1]
				m := vm.metricIDs[id]
				if m == nil {
					ret(s, StatusNotFound)
					return
				}
				switch MetricType(id & 3) {
				case MetricCounter:
					vm.o.Stats.add(m, int64(v))
				case MetricGauge:
					vm.o.Stats.set(m, int64(v))
				case MetricHistogram:
					vm.o.Stats.record(m, v)
				}
				ret(s, StatusOK)
			}},
		env("proxy_get_metric", 2, func(vm *VM, s []uint64) {
			id := u32(s[0])
			switch MetricType(id & 3) {
			case MetricCounter, MetricGauge:
				m := vm.metricIDs[id]
				if m == nil {
					ret(s, StatusNotFound)
					return
				}
				if !vm.writeU64(u32(s[1]), uint64(vm.o.Stats.get(m))) {
					ret(s, StatusInvalidMemAccess)
					return
				}
				ret(s, StatusOK)
			default:
				ret(s, StatusBadArgument)
			}
		}),
		env("proxy_set_effective_context", 1, func(vm *VM, s []uint64) {
			id := u32(s[0])
			if vm.contexts[id] == nil {
				ret(s, StatusBadArgument)
				return
			}
			vm.effective = id
			ret(s, StatusOK)
		}),
		env("proxy_done", 0, func(vm *VM, s []uint64) {
			// Only for a root context whose on_done returned false.
			ret(s, vm.done(vm.ctxOrEffective()))
		}),
		env("proxy_call_foreign_function", 6, func(vm *VM, s []uint64) {
			if _, ok := vm.read(u32(s[0]), u32(s[1])); !ok {
				ret(s, StatusInvalidMemAccess)
				return
			}
			ret(s, StatusNotFound)
		}),
		env("proxy_continue_stream", 1, func(vm *VM, s []uint64) {
			t := StreamType(u32(s[0]))
			if t > streamTypeMax {
				ret(s, StatusBadArgument)
				return
			}
			ret(s, vm.continueStream(vm.ctxOrEffective(), t))
		}),
		env("proxy_close_stream", 1, func(vm *VM, s []uint64) {
			t := StreamType(u32(s[0]))
			if t > streamTypeMax {
				ret(s, StatusBadArgument)
				return
			}
			if st := vm.ctxOrEffective().stream; st != nil && (t == StreamRequest || t == StreamResponse) {
				vm.defer_(st.reset)
			}
			ret(s, StatusOK)
		}),
		env("pthread_equal", 2, func(vm *VM, s []uint64) {
			if u32(s[0]) == u32(s[1]) {
				s[0] = 1
			} else {
				s[0] = 0
			}
		}),
		{module: "env", name: "emscripten_notify_memory_growth", params: ints(1), fn: func(*VM, []uint64) {}},
	}
}

func unimplemented(_ *VM, s []uint64) { ret(s, StatusUnimplemented) }

// editMap applies an add or replace to a header map the plugin may change.
func editMap(vm *VM, s []uint64, edit func(m []Header, key, val string) []Header) {
	t, ok := mapArg(s)
	if !ok {
		return
	}
	k, ok1 := vm.lookupKey(u32(s[1]), u32(s[2]))
	v, ok2 := vm.lookupKey(u32(s[3]), u32(s[4]))
	if !ok1 || !ok2 {
		ret(s, StatusInvalidMemAccess)
		return
	}
	// The map keeps both: a copy in the VM's arena, the name lower-cased
	// as Envoy's header map stores it.
	key, val := vm.text.pair(k, v)
	changeMap(vm, s, t, func(m []Header) []Header { return edit(m, key, val) })
}

// mapArg reads a header-map call's first argument, the map type; an
// unknown type answers BAD_ARGUMENT.
func mapArg(s []uint64) (MapType, bool) {
	t := MapType(u32(s[0]))
	if t > mapTypeMax {
		ret(s, StatusBadArgument)
		return 0, false
	}
	return t, true
}

// changeMap replaces map t of the current (or effective) context with
// edit's result; a map that cannot be changed now answers BAD_ARGUMENT.
func changeMap(vm *VM, s []uint64, t MapType, edit func([]Header) []Header) {
	m := vm.mutMap(vm.ctxOrEffective(), t)
	if m == nil {
		ret(s, StatusBadArgument)
		return
	}
	*m = edit(*m)
	ret(s, StatusOK)
}

// without removes every value of key from m, in place.
func without(m []Header, key string) []Header {
	out := m[:0]
	for _, h := range m {
		if h[0] != key {
			out = append(out, h)
		}
	}
	return out
}

// insertHeader adds h where Envoy's header list puts it: a pseudo-header
// (":path") after the other pseudo-headers, which always come first; any
// other header at the end.
func insertHeader(m []Header, h Header) []Header {
	if !strings.HasPrefix(h[0], ":") {
		return append(m, h)
	}
	i := 0
	for i < len(m) && strings.HasPrefix(m[i][0], ":") {
		i++
	}
	return slices.Insert(m, i, h)
}

// replaceSpaces turns whitespace into underscores, as Envoy does to the
// details of a local reply.
func replaceSpaces(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			return '_'
		}
		return r
	}, s)
}

// constMap returns the header map of type t as a read sees it, Envoy's
// getConstMap: BAD_ARGUMENT when the map is not available now (NOT_FOUND
// during on_log).
func (vm *VM) constMap(c *vmContext, t MapType) ([]Header, Status) {
	var m []Header
	avail := false
	st := c.stream
	switch t {
	case MapRequestHeaders:
		if st != nil && st.logPhase {
			m, avail = st.logRequest, st.logRequest != nil
		} else if st != nil && st.reqActive {
			m, avail = st.reqHeaders, true
		}
	case MapResponseHeaders:
		if st != nil && st.logPhase {
			m, avail = st.logResponse, st.logResponse != nil
		} else if st != nil && st.respActive {
			m, avail = st.respHeaders, true
		}
	case MapHTTPCallResponseHeaders:
		if vm.callResp != nil {
			m, avail = vm.callResp.Headers, true
		}
	case MapHTTPCallResponseTrailer:
		if vm.callResp != nil {
			m, avail = vm.callResp.Trailers, true
		}
	}
	if !avail {
		if st != nil && st.logPhase {
			return nil, StatusNotFound
		}
		return nil, StatusBadArgument
	}
	return m, StatusOK
}

// mutMap returns the header map of type t for a change, Envoy's getMap, or
// nil when it cannot be changed now (the caller answers BAD_ARGUMENT).
// Request headers can be changed while the request is held in
// on_request_headers or paused; response headers likewise.
func (vm *VM) mutMap(c *vmContext, t MapType) *[]Header {
	st := c.stream
	if st == nil {
		return nil
	}
	switch t {
	case MapRequestHeaders:
		if st.reqActive {
			return &st.reqHeaders
		}
	case MapResponseHeaders:
		if st.respActive {
			return &st.respHeaders
		}
	}
	return nil
}

// bufferArg is the buffer a host call names by its type argument, for the
// current context: BAD_ARGUMENT for a type Envoy does not have, NOT_FOUND
// for one not readable now.
func (vm *VM) bufferArg(arg uint64) ([]byte, Status) {
	t := BufferType(u32(arg))
	if t > bufferTypeMax {
		return nil, StatusBadArgument
	}
	b, ok := vm.buffer(vm.ctxOrEffective(), t)
	if !ok {
		return nil, StatusNotFound
	}
	return b, StatusOK
}

// buffer returns buffer t as Envoy's getBuffer does: bodies and network data
// read as empty (this host carries none), the HTTP-call response body only
// during the callback, the plugin configuration only while configuring.
func (vm *VM) buffer(c *vmContext, t BufferType) ([]byte, bool) {
	switch t {
	case BufferHTTPCallResponse:
		if vm.callResp == nil {
			return nil, false
		}
		return vm.callResp.Body, true
	case BufferVMConfiguration:
		return []byte(vm.o.VMConfig), true
	case BufferPluginConfiguration:
		if vm.configuring == nil {
			return nil, false
		}
		return []byte(*vm.configuring), true
	}
	return nil, true
}

// continueStream is proxy_continue_stream: the resumption is deferred until
// the current call returns; the request headers stop being the plugin's to
// change at once, as Envoy drops its pointer to them.
func (vm *VM) continueStream(c *vmContext, t StreamType) Status {
	switch t {
	case StreamRequest, StreamResponse:
		if st := c.stream; st != nil {
			vm.defer_(func() { st.resume(t) })
			st.reqActive = false
		}
		return StatusOK
	case StreamDownstream:
		return StatusOK
	case StreamUpstream:
		return StatusUnimplemented
	}
	return StatusBadArgument
}
