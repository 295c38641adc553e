package server

import (
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Limits of the HTTP server. A check is a handful of short headers and no
// body; anything much larger is not from the gateway and is refused before
// the handler runs.
const (
	// MaxHeaderBytes bounds the request line plus headers (fasthttp's read
	// buffer); larger requests get 431.
	MaxHeaderBytes = 8 << 10
	// MaxBodyBytes bounds the request body; larger ones get 413.
	MaxBodyBytes = 1 << 10
	// ReadTimeout and WriteTimeout bound one request's read and its response's
	// write; IdleTimeout closes keep-alive connections idle that long.
	ReadTimeout  = 5 * time.Second
	WriteTimeout = 5 * time.Second
	IdleTimeout  = 90 * time.Second
	// MaxConcurrency bounds the connections the check listener serves at
	// once. Each holds up to 21 KiB while open, idle or not (its read and
	// write buffers, its request context, its goroutine).
	MaxConcurrency = 16384
	// AdminMaxConcurrency and AdminMaxConnsPerIP bound the admin listener,
	// which may face the pod network: probes and scrapes need a few
	// connections, and whatever opens more is held to 16 from one address
	// (a 429, closed) and 1,024 in all (a 503, closed), about 21 MiB, so
	// that idle connections cannot run the sidecar out of memory or keep
	// the kubelet's probes out from another address.
	AdminMaxConcurrency = 1024
	AdminMaxConnsPerIP  = 16
)

// HTTPServer returns a fasthttp server for s with the limits above, serving
// Handle (the check listener).
func (s *Server) HTTPServer() *fasthttp.Server { return s.httpServer(s.Handle, MaxConcurrency, 0) }

// AdminHTTPServer returns a fasthttp server with the same limits but for
// the connections (AdminMaxConcurrency, AdminMaxConnsPerIP), serving
// HandleAdmin (the admin listener).
func (s *Server) AdminHTTPServer() *fasthttp.Server {
	return s.httpServer(s.HandleAdmin, AdminMaxConcurrency, AdminMaxConnsPerIP)
}

// httpServer returns a server of h serving at most concurrency connections
// at once, and at most perIP from one address (0: no such limit).
func (s *Server) httpServer(h fasthttp.RequestHandler, concurrency, perIP int) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      h,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		ReadBufferSize:               MaxHeaderBytes,
		WriteBufferSize:              4 << 10,
		MaxRequestBodySize:           MaxBodyBytes,
		ReadTimeout:                  ReadTimeout,
		WriteTimeout:                 WriteTimeout,
		IdleTimeout:                  IdleTimeout,
		Concurrency:                  concurrency,
		MaxConnsPerIP:                perIP,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLogger{s.o.Log},
		ErrorHandler:                 s.requestError,
	}
}

// requestError counts a request fasthttp could not read and answers it.
func (s *Server) requestError(ctx *fasthttp.RequestCtx, err error) {
	s.o.Stats.Unreadable.Inc()
	requestError(ctx, err)
}

// requestError answers a request fasthttp could not read, with a status that
// says why. Like every other error here it is short plain text that never
// echoes the request.
func requestError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.As(err, &small):
		text(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers too large")
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		text(ctx, fasthttp.StatusRequestEntityTooLarge, "request body too large")
	case errors.As(err, &netErr) && netErr.Timeout():
		text(ctx, fasthttp.StatusRequestTimeout, "request timeout")
	default:
		text(ctx, fasthttp.StatusBadRequest, "malformed request")
	}
}

// fasthttpLogger sends fasthttp's own messages (malformed requests, broken
// connections) to slog at debug level: they are the client's problem and the
// client already got its 4xx. Only the message's format is logged, never its
// arguments: fasthttp quotes raw request bytes in parse errors, and those
// may hold an API key.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, _ ...any) {
	l.log.Debug("http server", "event", format)
}
