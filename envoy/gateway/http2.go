package main

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// http2Refusal is the debug data of the GOAWAY a client opening HTTP/2
// with prior knowledge gets: the gap it met, in words its error shows.
const http2Refusal = "build/gateway speaks HTTP/1.1 only; Envoy serves HTTP/2 on this listener (codec_type AUTO)"

// http2Linger bounds how long a refused HTTP/2 connection is read after
// the GOAWAY, so that the close reaches the client as an end of stream
// and not a reset that could discard the GOAWAY before it reads it.
const http2Linger = time.Second

// HTTP/2 frame types, flags and error codes (RFC 9113, sections 6 and 7).
const (
	frameSettings     = 0x4
	frameGoAway       = 0x7
	errHTTP11Required = 0xd
	frameHeaderLen    = 9
	goAwayFixedLen    = 8
)

// refuseHTTP2 answers a connection that opens with HTTP/2's
// prior-knowledge preface (`PRI * HTTP/2.0`, then `SM`), which Go's
// HTTP/1 server hands a handler as a request: the gateway does not speak
// HTTP/2 (envoy/README.md, "HTTP/2 clients"), where Envoy would serve the
// connection. Left to the handlers, the client read an HTTP/1.1 400 on a
// connection it speaks HTTP/2 on, which it reports as a malformed frame or
// an empty reply. Here it gets the server preface (an empty SETTINGS) and
// a GOAWAY with HTTP_1_1_REQUIRED whose debug data names the gap, and the
// connection is closed; nothing is counted as a request. It reports
// whether r was such a preface.
func refuseHTTP2(w http.ResponseWriter, r *http.Request, log *slog.Logger) bool {
	if r.ProtoMajor != 2 || r.ProtoMinor != 0 || r.Method != "PRI" || r.RequestURI != "*" {
		return false
	}
	log.Warn("HTTP/2 connection refused", "client", r.RemoteAddr, "reason", http2Refusal)
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	defer conn.Close()
	frames := make([]byte, 0, 2*frameHeaderLen+goAwayFixedLen+len(http2Refusal))
	frames = appendFrameHeader(frames, 0, frameSettings)
	frames = appendFrameHeader(frames, goAwayFixedLen+len(http2Refusal), frameGoAway)
	frames = binary.BigEndian.AppendUint32(frames, 0) // last stream: none was processed
	frames = binary.BigEndian.AppendUint32(frames, errHTTP11Required)
	frames = append(frames, http2Refusal...)
	conn.SetDeadline(time.Now().Add(http2Linger))
	if _, err := conn.Write(frames); err != nil {
		return true
	}
	// The rest of the preface and whatever the client sent after it are
	// read and dropped until it closes (it does on a GOAWAY) or the linger
	// ends: closing with them unread would send a reset.
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, buf)
	return true
}

// appendFrameHeader appends the 9-byte header of a frame of the given
// payload length and type, no flags, on stream 0.
func appendFrameHeader(b []byte, length int, typ byte) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), typ, 0, 0, 0, 0, 0)
}
