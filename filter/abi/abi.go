// Package abi is the filter's own binding of the proxy-wasm ABI 0.2.1, as
// Envoy (proxy-wasm-cpp-host) implements it.
//
// The package has two halves. The portable half (this file, pairs.go,
// arena.go) holds the ABI's constants, the header-map pairs encoding and the
// two Go interfaces that separate the binding from the filter's logic: Host,
// the calls a plugin may make into the proxy, and Plugin, the callbacks the
// proxy makes into a plugin. It compiles everywhere and is tested natively.
// The wasip1 half (the *_wasip1.go files) is the binding proper: the
// //go:wasmimport declarations of env.proxy_*, a Host made of them, and the
// //go:wasmexport callbacks that forward to the Plugin given to SetPlugin.
//
// The logic never sees wasm: it is written against Host and Plugin, so that
// the same code runs inside Envoy and behind the emulated host of package
// filter/filtertest/native.
package abi

// Status is the result code of every host call (proxy_status_t).
type Status uint32

// Status codes of ABI 0.2.1.
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCASMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

// String returns the status's name as the ABI spells it, for log lines.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusNotFound:
		return "NOT_FOUND"
	case StatusBadArgument:
		return "BAD_ARGUMENT"
	case StatusSerializationFailure:
		return "SERIALIZATION_FAILURE"
	case StatusParseFailure:
		return "PARSE_FAILURE"
	case StatusInvalidMemoryAccess:
		return "INVALID_MEMORY_ACCESS"
	case StatusEmpty:
		return "EMPTY"
	case StatusCASMismatch:
		return "CAS_MISMATCH"
	case StatusInternalFailure:
		return "INTERNAL_FAILURE"
	case StatusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return "UNKNOWN_STATUS"
}

// Action is what a stream callback tells the proxy to do next.
type Action uint32

// Actions. Envoy turns Pause on a headers callback into
// StopAllIterationAndWatermark: the request waits, its body is buffered.
const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

// MapType names a header map.
type MapType uint32

// Header maps of ABI 0.2.1.
const (
	MapRequestHeaders           MapType = 0
	MapRequestTrailers          MapType = 1
	MapResponseHeaders          MapType = 2
	MapResponseTrailers         MapType = 3
	MapGRPCInitialMetadata      MapType = 4
	MapGRPCTrailingMetadata     MapType = 5
	MapHTTPCallResponseHeaders  MapType = 6
	MapHTTPCallResponseTrailers MapType = 7
)

// BufferType names a byte buffer.
type BufferType uint32

// Buffers of ABI 0.2.1.
const (
	BufferRequestBody             BufferType = 0
	BufferResponseBody            BufferType = 1
	BufferDownstreamData          BufferType = 2
	BufferUpstreamData            BufferType = 3
	BufferHTTPCallResponseBody    BufferType = 4
	BufferGRPCReceiveBuffer       BufferType = 5
	BufferVMConfiguration         BufferType = 6
	BufferPluginConfiguration     BufferType = 7
	BufferForeignFunctionArgument BufferType = 8
)

// StreamType names the direction proxy_continue_stream resumes.
type StreamType uint32

// Stream types of ABI 0.2.1.
const (
	StreamRequest    StreamType = 0
	StreamResponse   StreamType = 1
	StreamDownstream StreamType = 2
	StreamUpstream   StreamType = 3
)

// MetricType is the kind of a metric defined with proxy_define_metric.
type MetricType uint32

// Metric kinds of ABI 0.2.1.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// LogLevel is the level of a proxy_log line; Envoy rejects levels above
// LogCritical.
type LogLevel uint32

// Log levels of ABI 0.2.1.
const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
)

// GRPCStatusNone is the grpc_status argument of proxy_send_local_response
// that means "not a gRPC reply".
const GRPCStatusNone int32 = -1

// Host is what a plugin may ask of the proxy. Every method is one host call;
// the semantics are Envoy's (filter/RATIONALE.md lists the ones the filter
// relies on). Calls that act on a stream act on the
// effective context: the stream whose callback is running, or the one set
// with SetEffectiveContext.
//
// What a method returns (bytes, strings, header pairs) may be a view of
// memory the binding reuses: it is valid until the running callback
// returns. A plugin copies whatever it keeps longer.
type Host interface {
	// Log writes one line to the proxy's log.
	Log(level LogLevel, msg string) Status
	// GetBuffer returns up to max bytes of a buffer from start. An empty
	// buffer is (nil, StatusOK); an unavailable one is StatusNotFound.
	GetBuffer(t BufferType, start, max int) ([]byte, Status)
	// GetHeader returns the first value of key (lower case); StatusNotFound
	// when absent.
	GetHeader(m MapType, key string) (string, Status)
	// GetHeaders appends every pair of a map, in order, to dst and returns
	// it; on failure dst comes back unchanged.
	GetHeaders(m MapType, dst [][2]string) ([][2]string, Status)
	// AddHeader appends a value, keeping existing ones.
	AddHeader(m MapType, key, value string) Status
	// ReplaceHeader sets key to value alone, dropping every existing value.
	ReplaceHeader(m MapType, key, value string) Status
	// RemoveHeader drops every value of key; StatusOK when absent.
	RemoveHeader(m MapType, key string) Status
	// SendLocalResponse makes the proxy answer the stream itself. Envoy
	// defers it until the running callback returns and then stops the
	// stream's filter chain.
	SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) Status
	// HTTPCall dispatches an HTTP request to cluster. headers is the
	// request's header map encoded as the ABI hands maps over (AppendPairs,
	// PairsTemplate), which the caller can keep and reuse. The answer comes
	// to the root context's Plugin.OnHTTPCallResponse with the returned
	// token; when the status is not OK no answer will ever come.
	HTTPCall(cluster string, headers []byte, body []byte, trailers [][2]string, timeoutMs uint32) (token uint32, s Status)
	// ContinueStream resumes a paused stream (deferred in Envoy until the
	// running callback returns).
	ContinueStream(t StreamType) Status
	// SetEffectiveContext makes later stream calls act on context id.
	SetEffectiveContext(id uint32) Status
	// GetSharedData reads a value shared by every VM of the same vm_id in
	// the process; StatusNotFound when the key was never set.
	GetSharedData(key string) (value []byte, cas uint32, s Status)
	// SetSharedData writes a shared value. With cas != 0 it fails with
	// StatusCASMismatch unless the stored value still has that cas.
	SetSharedData(key string, value []byte, cas uint32) Status
	// DefineMetric declares a metric; Envoy shows it as wasmcustom.<name>.
	DefineMetric(t MetricType, name string) (id uint32, s Status)
	// IncrementMetric adds delta (> 0 for counters) to a counter or gauge.
	IncrementMetric(id uint32, delta int64) Status
	// RecordMetric sets a gauge or records a histogram sample.
	RecordMetric(id uint32, value uint64) Status
	// SetTickPeriod makes the proxy call Plugin.OnTick on the calling root
	// context every ms milliseconds; 0 stops it.
	SetTickPeriod(ms uint32) Status
	// Now returns the proxy's wall clock in nanoseconds since the epoch.
	Now() int64
}

// Plugin is the set of callbacks the proxy makes. Context id 0 is the VM;
// a context whose parent is 0 is a root context (one per plugin
// configuration), any other is an HTTP stream of its parent root.
type Plugin interface {
	OnContextCreate(id, parent uint32)
	// OnVMStart and OnConfigure report false to make the proxy reject the
	// VM or the plugin configuration.
	OnVMStart(root uint32, vmConfigSize int) bool
	OnConfigure(root uint32, pluginConfigSize int) bool
	OnRequestHeaders(id uint32, numHeaders int, endOfStream bool) Action
	OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) Action
	// OnHTTPCallResponse comes to the root context that dispatched the call.
	// numHeaders == 0 means the call was reset before a response.
	OnHTTPCallResponse(root, token uint32, numHeaders, bodySize, numTrailers int)
	OnTick(root uint32)
	// OnDelete ends a context. The binding exports neither proxy_on_log nor
	// proxy_on_done, so a proxy goes from the last stream callback (or, for
	// a root context, shutting down) straight here.
	OnDelete(id uint32)
}

// PanicMessage renders a value recovered from a panic for a log line, without
// fmt: strings and errors (runtime errors included) as themselves.
func PanicMessage(r any) string {
	switch v := r.(type) {
	case string:
		return v
	case error:
		return v.Error()
	case interface{ String() string }:
		return v.String()
	}
	return "panic value of unprintable type"
}
