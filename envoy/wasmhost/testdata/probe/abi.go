//go:build wasip1

package main

import "unsafe"

// The host calls the probe exercises, declared directly against the
// proxy-wasm ABI 0.2.1.

//go:wasmimport env proxy_log
func proxyLog(level uint32, ptr unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_log_level
func proxyGetLogLevel(level *uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(typ, start, max uint32, ptr *uint32, size *uint32) uint32

//go:wasmimport env proxy_get_buffer_status
func proxyGetBufferStatus(typ uint32, size *uint32, flags *uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(typ uint32, key unsafe.Pointer, keySize uint32, ptr *uint32, size *uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(typ uint32, ptr *uint32, size *uint32) uint32

//go:wasmimport env proxy_set_header_map_pairs
func proxySetHeaderMapPairs(typ uint32, ptr unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_header_map_size
func proxyGetHeaderMapSize(typ uint32, size *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(typ uint32, key unsafe.Pointer, keySize uint32, val unsafe.Pointer, valSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(typ uint32, key unsafe.Pointer, keySize uint32, val unsafe.Pointer, valSize uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
func proxyRemoveHeaderMapValue(typ uint32, key unsafe.Pointer, keySize uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(cluster unsafe.Pointer, clusterSize uint32, headers unsafe.Pointer, headersSize uint32,
	body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32, timeout uint32, token *uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32,
	headers unsafe.Pointer, headersSize uint32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(typ uint32) uint32

//go:wasmimport env proxy_close_stream
func proxyCloseStream(typ uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, ptr *uint32, size *uint32) uint32

//go:wasmimport env proxy_set_property
func proxySetProperty(key unsafe.Pointer, keySize uint32, val unsafe.Pointer, valSize uint32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, ptr *uint32, size *uint32, cas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key unsafe.Pointer, keySize uint32, val unsafe.Pointer, valSize uint32, cas uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(typ uint32, name unsafe.Pointer, nameSize uint32, id *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(id uint32, value *uint64) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriod(ms uint32) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func proxyGetCurrentTime(ns *uint64) uint32

//go:wasmimport env proxy_get_status
func proxyGetStatus(code *uint32, ptr *uint32, size *uint32) uint32

//go:wasmimport env proxy_call_foreign_function
func proxyCallForeignFunction(name unsafe.Pointer, nameSize uint32, args unsafe.Pointer, argsSize uint32, ret *uint32, retSize *uint32) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

// ptrOf returns the address of b's first byte (nil for an empty b).
func ptrOf(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// hostBytes reads n bytes the host placed at ptr.
func hostBytes(ptr, n uint32) []byte {
	if n == 0 {
		return nil
	}
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), n)...)
}
