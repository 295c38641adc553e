package filtertest

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/edgelimit/edgelimit/internal/grpclocal"
)

// grpcWebTrailerFlag is the flags byte of an uncompressed trailer frame.
const grpcWebTrailerFlag = 0x80

// ParseGRPCWebTrailers reads a gRPC-Web response body of this content-type
// that holds only a trailer frame, as a client does (grpc/grpc
// doc/PROTOCOL-WEB.md), and returns the trailers, grpc-message decoded.
// An error says what is not so.
func ParseGRPCWebTrailers(contentType string, body []byte) (map[string]string, error) {
	if !grpclocal.IsGRPCWeb(contentType) {
		return nil, fmt.Errorf("content-type %q is not gRPC-Web", contentType)
	}
	if grpclocal.IsGRPCWebText(contentType) {
		b, err := base64.StdEncoding.DecodeString(string(body))
		if err != nil {
			return nil, fmt.Errorf("a -text body that is not base64: %w", err)
		}
		body = b
	}
	if len(body) < 5 {
		return nil, fmt.Errorf("body of %d bytes, shorter than a frame's head", len(body))
	}
	if body[0] != grpcWebTrailerFlag {
		return nil, fmt.Errorf("frame flags %#x, want a trailer frame (%#x)", body[0], grpcWebTrailerFlag)
	}
	if n := binary.BigEndian.Uint32(body[1:]); int64(n) != int64(len(body)-5) {
		return nil, fmt.Errorf("trailer frame of length %d in %d bytes after its head", n, len(body)-5)
	}
	out := map[string]string{}
	block := string(body[5:])
	if !strings.HasSuffix(block, "\r\n") {
		return nil, errors.New("trailer block does not end with CRLF")
	}
	for _, line := range strings.Split(strings.TrimSuffix(block, "\r\n"), "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || name != strings.ToLower(name) {
			return nil, fmt.Errorf("trailer line %q: want lower-case name:value", line)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("trailer %q twice", name)
		}
		out[name] = value
	}
	if m, ok := out["grpc-message"]; ok {
		d, err := url.PathUnescape(m)
		if err != nil {
			return nil, fmt.Errorf("grpc-message: %w", err)
		}
		out["grpc-message"] = d
	}
	return out, nil
}
