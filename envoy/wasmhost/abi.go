package wasmhost

import "fmt"

// The ABI's numbers (statuses, map and buffer types) and the header-map
// encoding are written here again rather than imported from filter/abi on
// purpose: the host stands in for Envoy, and a mistake shared by the plugin
// and its host would pass every test. Each side follows the specification on
// its own, and the filter's tests running in this host check them against
// each other.

// Status is a proxy-wasm host call result (WasmResult in proxy-wasm-cpp-host).
type Status uint32

// The statuses a host call returns.
const (
	StatusOK                  Status = 0
	StatusNotFound            Status = 1
	StatusBadArgument         Status = 2
	StatusSerializationFailed Status = 3
	StatusParseFailure        Status = 4
	StatusBadExpression       Status = 5
	StatusInvalidMemAccess    Status = 6
	StatusEmpty               Status = 7
	StatusCASMismatch         Status = 8
	StatusResultMismatch      Status = 9
	StatusInternalFailure     Status = 10
	StatusBrokenConnection    Status = 11
	StatusUnimplemented       Status = 12
)

var statusNames = [...]string{"OK", "NOT_FOUND", "BAD_ARGUMENT", "SERIALIZATION_FAILURE",
	"PARSE_FAILURE", "BAD_EXPRESSION", "INVALID_MEMORY_ACCESS", "EMPTY", "CAS_MISMATCH",
	"RESULT_MISMATCH", "INTERNAL_FAILURE", "BROKEN_CONNECTION", "UNIMPLEMENTED"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// MapType selects a header map in the header-map host calls.
type MapType uint32

// The header maps of ABI 0.2.x.
const (
	MapRequestHeaders          MapType = 0
	MapRequestTrailers         MapType = 1
	MapResponseHeaders         MapType = 2
	MapResponseTrailers        MapType = 3
	MapGRPCInitialMetadata     MapType = 4
	MapGRPCTrailingMetadata    MapType = 5
	MapHTTPCallResponseHeaders MapType = 6
	MapHTTPCallResponseTrailer MapType = 7
	mapTypeMax                         = MapHTTPCallResponseTrailer
)

// BufferType selects a buffer in the buffer host calls.
type BufferType uint32

// The buffers of ABI 0.2.x.
const (
	BufferRequestBody         BufferType = 0
	BufferResponseBody        BufferType = 1
	BufferDownstreamData      BufferType = 2
	BufferUpstreamData        BufferType = 3
	BufferHTTPCallResponse    BufferType = 4
	BufferGRPCReceive         BufferType = 5
	BufferVMConfiguration     BufferType = 6
	BufferPluginConfiguration BufferType = 7
	BufferCallData            BufferType = 8
	bufferTypeMax                        = BufferCallData
)

// StreamType selects a direction for proxy_continue_stream and
// proxy_close_stream.
type StreamType uint32

// The stream directions.
const (
	StreamRequest    StreamType = 0
	StreamResponse   StreamType = 1
	StreamDownstream StreamType = 2
	StreamUpstream   StreamType = 3
	streamTypeMax               = StreamUpstream
)

// LogLevel is a proxy_log level (Envoy's spdlog levels).
type LogLevel uint32

// The log levels.
const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
	logLevelMax          = LogCritical
)

var logLevelNames = [...]string{"trace", "debug", "info", "warn", "error", "critical"}

func (l LogLevel) String() string {
	if int(l) < len(logLevelNames) {
		return logLevelNames[l]
	}
	return fmt.Sprintf("LogLevel(%d)", uint32(l))
}

// MetricType is the kind of a metric defined with proxy_define_metric.
type MetricType uint32

// The metric kinds.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
	metricTypeMax              = MetricHistogram
)

func (m MetricType) String() string {
	switch m {
	case MetricCounter:
		return "counter"
	case MetricGauge:
		return "gauge"
	case MetricHistogram:
		return "histogram"
	}
	return fmt.Sprintf("MetricType(%d)", uint32(m))
}

// Filter actions returned by on_request_headers and friends.
const (
	actionContinue = 0
	actionPause    = 1
)

// Header is one header as a name/value pair. Names in maps the host hands to
// a plugin are lower-case, as Envoy's are.
type Header = [2]string
