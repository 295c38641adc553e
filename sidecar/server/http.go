package server

import (
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
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

// The first write fasthttp makes on a connection it refuses at accept, the
// status line alone (Server.rejectConn, then the headers and the reason in
// a second write): past MaxConnsPerIP a 429, past Concurrency a 503. An
// answer to a request is written whole, status line, headers and body in
// one write, so it never matches.
const (
	refusedPerAddressLine = "HTTP/1.1 429 Too Many Requests\r\n"
	refusedTotalLine      = "HTTP/1.1 503 Service Unavailable\r\n"
)

// CheckListener returns ln with the connections HTTPServer refuses counted
// (sidecar_connections_refused_total{listener="check"}).
func (s *Server) CheckListener(ln net.Listener) net.Listener {
	return &refusalListener{Listener: ln, total: s.o.Stats.RefusedCheck}
}

// AdminListener returns ln with the connections AdminHTTPServer refuses
// counted (sidecar_connections_refused_total{listener="admin"}).
func (s *Server) AdminListener(ln net.Listener) net.Listener {
	return &refusalListener{Listener: ln, total: s.o.Stats.RefusedAdmin, perAddress: s.o.Stats.RefusedAdminPerAddress}
}

// refusalListener counts the connections the server refuses: fasthttp
// refuses them inside its accept loop, without a hook or a count of its own
// for MaxConnsPerIP, so each connection's first write tells.
type refusalListener struct {
	net.Listener
	total, perAddress *metrics.Counter // perAddress nil: no per-address limit
}

func (l *refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &refusalConn{Conn: c, l: l}, nil
}

type refusalConn struct {
	net.Conn
	l     *refusalListener
	wrote atomic.Bool
}

func (c *refusalConn) Write(b []byte) (int, error) {
	if !c.wrote.Load() {
		c.wrote.Store(true)
		switch {
		case string(b) == refusedTotalLine:
			c.l.total.Inc()
		case string(b) == refusedPerAddressLine && c.l.perAddress != nil:
			c.l.perAddress.Inc()
		}
	}
	return c.Conn.Write(b)
}
