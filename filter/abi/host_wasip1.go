//go:build wasip1

package abi

import "unsafe"

// wasmHost is the Host of a module running inside a proxy: each method is one
// env.proxy_* import. The methods have pointer receivers so that the
// interface's method table holds them directly: with value receivers, a call
// through Host went through a compiler-made (*wasmHost) wrapper first, one
// more Go call per host call inside wasm (filter/RATIONALE.md, "What a
// request costs inside wasm").
type wasmHost struct{}

// proxyHost is the one Host of the module.
var proxyHost wasmHost

// ProxyHost returns the Host backed by the proxy's env.proxy_* imports.
func ProxyHost() Host { return &proxyHost }

// Output parameters of host calls. They live in package variables so that
// their addresses are fixed: see imports_wasip1.go.
var (
	retData  uint32
	retSize  uint32
	retCAS   uint32
	retID    uint32
	retNanos uint64
)

// mem is the memory proxy_on_memory_allocate hands the host; every export
// resets it as the callback starts. A variable rather than a pointer to
// one: inside wasm every use of a pointer is one more load.
var mem arena

// pairsBuf is reused for every header map the module hands the host, which
// copies it during the call. It is made at start with room for any map the
// filter sends, a local reply's headers included: its first growth during
// traffic made the runtime map more heap, a stall of the VM
// (filter/RATIONALE.md, "Why the hot path does not allocate").
var pairsBuf = make([]byte, 0, 4096)

func strPtr(s string) unsafe.Pointer   { return unsafe.Pointer(unsafe.StringData(s)) }
func bytesPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// clearRet prepares a call that returns memory: it zeroes the output
// variables, so that a host which reports OK without writing them yields an
// empty result rather than the previous call's, and starts tracking what the
// host allocates.
func clearRet() {
	retData, retSize, retCAS = 0, 0, 0
	mem.begin()
}

// result returns the buffer the host just pointed at in retData and retSize:
// a view of the arena, valid until the callback returns. A buffer that the
// module did not hand out for this call is StatusInvalidMemoryAccess.
func result(s Status) ([]byte, Status) {
	if s != StatusOK {
		return nil, s
	}
	b, ok := mem.take(uintptr(retData), retSize)
	if !ok {
		return nil, StatusInvalidMemoryAccess
	}
	return b, StatusOK
}

// encodePairs encodes pairs into pairsBuf from off on and returns the
// encoding, nil for an empty map as the host expects.
func encodePairs(off int, pairs [][2]string) []byte {
	if len(pairs) == 0 {
		return nil
	}
	pairsBuf = AppendPairs(pairsBuf[:off], pairs)
	return pairsBuf[off:]
}

func (*wasmHost) Log(level LogLevel, msg string) Status {
	return Status(proxyLog(uint32(level), strPtr(msg), uint32(len(msg))))
}

func (*wasmHost) GetBuffer(t BufferType, start, max int) ([]byte, Status) {
	clearRet()
	return result(Status(proxyGetBufferBytes(uint32(t), uint32(start), uint32(max), &retData, &retSize)))
}

func (*wasmHost) GetHeader(m MapType, key string) (string, Status) {
	clearRet()
	b, s := result(Status(proxyGetHeaderMapValue(uint32(m), strPtr(key), uint32(len(key)), &retData, &retSize)))
	return view(b), s
}

func (*wasmHost) GetHeaders(m MapType, dst [][2]string) ([][2]string, Status) {
	clearRet()
	b, s := result(Status(proxyGetHeaderMapPairs(uint32(m), &retData, &retSize)))
	if s != StatusOK {
		return dst, s
	}
	pairs, err := AppendPairViews(dst, b)
	if err != nil {
		return dst, StatusParseFailure
	}
	return pairs, StatusOK
}

func (*wasmHost) AddHeader(m MapType, key, value string) Status {
	return Status(proxyAddHeaderMapValue(uint32(m), strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

func (*wasmHost) ReplaceHeader(m MapType, key, value string) Status {
	return Status(proxyReplaceHeaderMapValue(uint32(m), strPtr(key), uint32(len(key)), strPtr(value), uint32(len(value))))
}

func (*wasmHost) RemoveHeader(m MapType, key string) Status {
	return Status(proxyRemoveHeaderMapValue(uint32(m), strPtr(key), uint32(len(key))))
}

func (*wasmHost) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) Status {
	h := encodePairs(0, headers)
	return Status(proxySendLocalResponse(status, strPtr(details), uint32(len(details)),
		bytesPtr(body), uint32(len(body)), bytesPtr(h), uint32(len(h)), grpcStatus))
}

func (*wasmHost) HTTPCall(cluster string, headers []byte, body []byte, trailers [][2]string, timeoutMs uint32) (uint32, Status) {
	t := encodePairs(0, trailers)
	s := Status(proxyHTTPCall(strPtr(cluster), uint32(len(cluster)), bytesPtr(headers), uint32(len(headers)),
		bytesPtr(body), uint32(len(body)), bytesPtr(t), uint32(len(t)), timeoutMs, &retID))
	if s != StatusOK {
		return 0, s
	}
	return retID, s
}

func (*wasmHost) ContinueStream(t StreamType) Status {
	return Status(proxyContinueStream(uint32(t)))
}

func (*wasmHost) SetEffectiveContext(id uint32) Status {
	return Status(proxySetEffectiveContext(id))
}

func (*wasmHost) GetSharedData(key string) ([]byte, uint32, Status) {
	clearRet()
	b, s := result(Status(proxyGetSharedData(strPtr(key), uint32(len(key)), &retData, &retSize, &retCAS)))
	if s != StatusOK {
		return nil, 0, s
	}
	return b, retCAS, s
}

func (*wasmHost) SetSharedData(key string, value []byte, cas uint32) Status {
	return Status(proxySetSharedData(strPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value)), cas))
}

func (*wasmHost) DefineMetric(t MetricType, name string) (uint32, Status) {
	s := Status(proxyDefineMetric(uint32(t), strPtr(name), uint32(len(name)), &retID))
	if s != StatusOK {
		return 0, s
	}
	return retID, s
}

func (*wasmHost) IncrementMetric(id uint32, delta int64) Status {
	return Status(proxyIncrementMetric(id, delta))
}

func (*wasmHost) RecordMetric(id uint32, value uint64) Status {
	return Status(proxyRecordMetric(id, value))
}

func (*wasmHost) SetTickPeriod(ms uint32) Status {
	return Status(proxySetTickPeriodMilliseconds(ms))
}

func (*wasmHost) Now() int64 {
	if proxyGetCurrentTimeNanoseconds(&retNanos) != uint32(StatusOK) {
		return 0
	}
	return int64(retNanos)
}
