// Package grpclocal is what Envoy makes of a local reply to a gRPC request,
// from Envoy's source, for the filter and for the hosts that stand in for
// Envoy (envoy/wasmhost, filter/filtertest/native): a gRPC client reads a
// call's outcome from grpc-status, not from the HTTP status, so Envoy
// answers a gRPC request it replies to itself (a plugin's
// proxy_send_local_response, the router's 404 or 503) with a trailers-only
// response: ":status" 200, content-type application/grpc, grpc-status and
// grpc-message, no body.
//
// The rules, each from Envoy's source:
//   - A request is gRPC when its content-type is application/grpc or begins
//     application/grpc+ (Grpc::Common::hasGrpcContentType, asked by
//     isGrpcRequestHeaders of the request headers as they arrived, :path
//     present); application/grpc-web is not.
//   - The reply's headers are ":status" with the local reply's code, then
//     the headers the plugin gave (modify_headers); for a gRPC request
//     ":status" becomes 200 and content-type application/grpc; grpc-status
//     is set unless a header already holds one, to the plugin's grpc_status
//     when it is a known code (0 to 16; the -1 SDKs pass for none is no
//     code: Wasm Context::sendLocalResponse), else to the HTTP status
//     mapped by Grpc::Utility::httpToGrpcStatus (429 to UNAVAILABLE);
//     grpc-message is the body, percent-encoded; content-length goes
//     (Http::Utility::prepareLocalReply). The response ends with its
//     headers (encodeLocalReply: "Trailers only response"). Every other
//     header the plugin gave stays.
//
// A gRPC-Web request (web.go) is none of these to Envoy: the filter
// answers it in gRPC-Web's own form, a 200 whose body is a trailer frame.
package grpclocal

import "strconv"

// ContentType is the content-type of a gRPC reply.
const ContentType = "application/grpc"

// gRPC status codes the filter and the hosts name.
const (
	Unknown           = 2
	PermissionDenied  = 7
	ResourceExhausted = 8
	Unimplemented     = 12
	Internal          = 13
	Unavailable       = 14
	Unauthenticated   = 16
)

// maxKnown is the highest status code Envoy knows
// (WellKnownGrpcStatus::MaximumKnown, UNAUTHENTICATED).
const maxKnown = Unauthenticated

// IsGRPC reports whether a request with this content-type is a gRPC
// request to Envoy: exactly application/grpc, or application/grpc followed
// by "+" (application/grpc+proto, +json); case-sensitive, as Envoy compares.
func IsGRPC(contentType string) bool {
	return len(contentType) >= len(ContentType) && contentType[:len(ContentType)] == ContentType &&
		(len(contentType) == len(ContentType) || contentType[len(ContentType)] == '+')
}

// FromHTTP is the gRPC status Envoy gives a local reply of this HTTP status
// when the one who made it named none (Grpc::Utility::httpToGrpcStatus,
// after gRPC's doc/http-grpc-status-mapping.md).
func FromHTTP(status int) int {
	switch status {
	case 400:
		return Internal
	case 401:
		return Unauthenticated
	case 403:
		return PermissionDenied
	case 404:
		return Unimplemented
	case 429, 502, 503, 504:
		return Unavailable
	}
	return Unknown
}

// Reply returns the headers of the trailers-only response Envoy sends a
// gRPC request for a local reply whose headers are headers (":status"
// first, then the plugin's, as an HTTP reply would have them) and whose
// body is body; grpcStatus is the plugin's argument (-1: none). The
// response has no body. headers is not changed.
func Reply(headers [][2]string, body []byte, grpcStatus int32) [][2]string {
	status := 0
	out := make([][2]string, 0, len(headers)+3)
	hasStatus, hasType := false, false
	for _, h := range headers {
		switch h[0] {
		case ":status":
			status, _ = strconv.Atoi(h[1])
			h[1] = "200"
		case "content-type":
			if hasType {
				continue
			}
			h[1], hasType = ContentType, true
		case "content-length":
			continue
		case "grpc-message":
			if len(body) > 0 {
				continue // the body's replaces it
			}
		case "grpc-status":
			if h[1] == "" {
				continue
			}
			hasStatus = true
		}
		out = append(out, h)
	}
	if !hasType {
		out = append(out, [2]string{"content-type", ContentType})
	}
	if !hasStatus {
		code := FromHTTP(status)
		if grpcStatus >= 0 && grpcStatus <= maxKnown {
			code = int(grpcStatus)
		}
		out = append(out, [2]string{"grpc-status", strconv.Itoa(code)})
	}
	if len(body) > 0 {
		out = append(out, [2]string{"grpc-message", PercentEncode(body)})
	}
	return out
}

// PercentEncode is grpc-message's encoding as Envoy writes it
// (PercentEncoding::encode): every byte below a space or from "~" up, and
// "%", as %XX in upper-case hex; the rest as it is.
func PercentEncode(b []byte) string {
	return string(AppendPercentEncoded(make([]byte, 0, len(b)), b))
}

// AppendPercentEncoded appends b to dst as PercentEncode writes it.
func AppendPercentEncoded(dst, b []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range b {
		if c < ' ' || c >= '~' || c == '%' {
			dst = append(dst, '%', hex[c>>4], hex[c&0xf])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}
