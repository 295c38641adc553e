package grpclocal

import (
	"encoding/base64"
	"slices"
)

// gRPC-Web (grpc/grpc doc/PROTOCOL-WEB.md) is gRPC for browsers: a request's
// content-type is application/grpc-web (application/grpc-web+proto, +json)
// or, base64-encoded, application/grpc-web-text (+proto); the call's status
// is not in HTTP trailers, which a browser cannot read, but in a last frame
// of the body, the trailer frame: a flags byte with its high bit set (0x80),
// the length as a 4-byte big-endian integer (gRPC's framing), then the
// trailers as an HTTP/1 header block ("name: value\r\n" each, lower-case
// names; the space is optional, as in HTTP/1: Envoy's grpc_web filter and
// this package write none). A -text response is base64: the whole of it
// here, one padded chunk (a server may also send several chunks, each
// padded). Envoy does not take such a request for gRPC
// (Grpc::Common::isGrpcRequestHeaders), so a local reply to it is an
// ordinary HTTP reply.

// Content-types of gRPC-Web.
const (
	WebContentType     = "application/grpc-web"
	WebTextContentType = "application/grpc-web-text"
)

// webTrailerFlag marks a gRPC-Web frame as the trailers (uncompressed).
const webTrailerFlag = 0x80

// IsGRPCWeb reports whether a request with this content-type is a gRPC-Web
// call: application/grpc-web or application/grpc-web-text, exactly or
// followed by "+" and a message format; case-sensitive, as Envoy's
// grpc_web filter compares.
func IsGRPCWeb(contentType string) bool {
	n := len(WebContentType)
	if len(contentType) < n || contentType[:n] != WebContentType {
		return false
	}
	rest := contentType[n:]
	if len(rest) >= len("-text") && rest[:len("-text")] == "-text" {
		rest = rest[len("-text"):]
	}
	return rest == "" || rest[0] == '+'
}

// IsGRPCWebText reports whether a gRPC-Web content-type is the base64 one.
func IsGRPCWebText(contentType string) bool {
	n := len(WebTextContentType)
	return len(contentType) >= n && contentType[:n] == WebTextContentType
}

// AppendWebTrailers appends to dst a gRPC-Web response body that is one
// trailer frame: grpc-status code, grpc-message the message
// percent-encoded (left out when empty), then the pairs of extra (name,
// value, name, value, …) as they are; base64-encoded when text (a
// application/grpc-web-text response).
func AppendWebTrailers(dst []byte, code int, message []byte, text bool, extra ...string) []byte {
	start := len(dst)
	dst = append(dst, webTrailerFlag, 0, 0, 0, 0)
	dst = append(dst, "grpc-status:"...)
	dst = appendCode(dst, code)
	dst = append(dst, "\r\n"...)
	if len(message) > 0 {
		dst = append(dst, "grpc-message:"...)
		dst = AppendPercentEncoded(dst, message)
		dst = append(dst, "\r\n"...)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		dst = append(dst, extra[i]...)
		dst = append(dst, ':')
		dst = append(dst, extra[i+1]...)
		dst = append(dst, "\r\n"...)
	}
	n := uint32(len(dst) - start - 5)
	dst[start+1], dst[start+2], dst[start+3], dst[start+4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	if !text {
		return dst
	}
	frame := len(dst) - start
	size := base64.StdEncoding.EncodedLen(frame)
	// Encode past the frame, then move the text down over it: no buffer
	// besides dst.
	dst = slices.Grow(dst, size)[:len(dst)+size]
	base64.StdEncoding.Encode(dst[start+frame:], dst[start:start+frame])
	copy(dst[start:], dst[start+frame:])
	return dst[:start+size]
}

// appendCode appends a status code, 0 to 99.
func appendCode(dst []byte, code int) []byte {
	if code >= 10 {
		dst = append(dst, byte('0'+code/10%10))
	}
	return append(dst, byte('0'+code%10))
}
