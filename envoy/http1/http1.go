// Package http1 is the lean HTTP/1.1 client of the headless gateway, used
// for the plugin's callouts (wasmhost.HTTPDispatcher) and for the router's
// upstream requests (envoy/gateway). It is not net/http's Transport, for what
// a request costs (envoy/wasmhost/RATIONALE.md, "What a request costs the
// host"): no goroutines per request and no write loop per connection; a
// connection is written by whoever holds it (the router's upstream
// requests read it too, a callout's connection has one reader of its
// own: wasmhost's httpdispatch.go) and kept idle per endpoint between
// requests as Envoy's connection pool keeps upstream connections.
package http1

import (
	"bufio"
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Conn is one HTTP/1.1 connection with its buffers.
type Conn struct {
	NC net.Conn
	R  *bufio.Reader
	W  *bufio.Writer
}

// Close closes the connection.
func (c *Conn) Close() error { return c.NC.Close() }

// Pool keeps the idle connections to one endpoint. C is the holder's
// connection type, closed when the pool no longer wants it.
type Pool[C interface {
	comparable
	Close() error
}] struct {
	Addr   string
	dialer *net.Dialer

	mu     sync.Mutex
	idle   []C
	closed bool
}

// NewPool returns an empty pool for addr ("host:port"); connections are
// dialled within connectTimeout (Envoy's default of 5 s when <= 0).
func NewPool[C interface {
	comparable
	Close() error
}](addr string, connectTimeout time.Duration) *Pool[C] {
	if connectTimeout <= 0 {
		connectTimeout = 5 * time.Second
	}
	return &Pool[C]{Addr: addr, dialer: &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}}
}

// Dial connects to the endpoint.
func (p *Pool[C]) Dial(ctx context.Context) (*Conn, error) {
	nc, err := p.dialer.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return nil, err
	}
	return &Conn{NC: nc, R: bufio.NewReaderSize(nc, 4096), W: bufio.NewWriterSize(nc, 4096)}, nil
}

// Take returns the most recently idle connection, if any.
func (p *Pool[C]) Take() (C, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var zero C
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle[n-1] = zero
		p.idle = p.idle[:n-1]
		return c, true
	}
	return zero, false
}

// Put makes a connection idle again, or closes it if the pool is closed.
func (p *Pool[C]) Put(c C) {
	p.mu.Lock()
	if !p.closed {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.Close()
}

// Drop forgets an idle connection (one that died while idle).
func (p *Pool[C]) Drop(c C) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.idle {
		if x == c {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			return
		}
	}
}

// Close closes the idle connections; one in use is closed when it is Put.
func (p *Pool[C]) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// Alive reports whether an idle connection can carry a request: nothing
// unread is buffered and the peer has neither closed it nor sent anything
// (a non-blocking peek, one system call), which is what Envoy's pool learns
// from the connection's close event.
func (c *Conn) Alive() bool {
	if c.R.Buffered() > 0 {
		return false
	}
	sc, ok := c.NC.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := true
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// EAGAIN: open and quiet. 0 bytes: closed. Data or another
		// error: of no use for a new request.
		alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		_ = n
		return true
	})
	return err == nil && alive
}

// WriteHead writes a request line, Host and the headers, dropping
// pseudo-headers, host and content-length and every name drop reports
// (nil: none), then the body's framing as net/http sends it: a length for a
// body of known length, 0 for POST, PUT and PATCH without one, chunked for
// a body of unknown length (bodyLen < 0). It does not flush.
func WriteHead(w *bufio.Writer, method, target, authority string, headers [][2]string, drop func(string) bool, bodyLen int64) {
	w.WriteString(method)
	w.WriteByte(' ')
	w.WriteString(target)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(authority)
	w.WriteString("\r\n")
	for _, h := range headers {
		if strings.HasPrefix(h[0], ":") || h[0] == "content-length" || h[0] == "host" || (drop != nil && drop(h[0])) {
			continue
		}
		w.WriteString(h[0])
		w.WriteString(": ")
		w.WriteString(h[1])
		w.WriteString("\r\n")
	}
	switch {
	case bodyLen < 0:
		w.WriteString("Transfer-Encoding: chunked\r\n")
	case bodyLen > 0 || method == "POST" || method == "PUT" || method == "PATCH":
		w.WriteString("Content-Length: ")
		w.WriteString(strconv.FormatInt(bodyLen, 10))
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
}

// Target returns the request target for path as net/http would send it to
// addr, or false where net/http refuses the path.
func Target(addr, path string) (string, bool) {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	if plainPath(path) {
		return path, true
	}
	u, err := url.Parse("http://" + addr + path)
	if err != nil {
		return "", false
	}
	return u.RequestURI(), true
}

// plainPath reports whether p can go on the request line as it is.
func plainPath(p string) bool {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// ValidMethod reports whether m is an HTTP token, as net/http requires.
func ValidMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !isTokenByte(m[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// ValidHeader reports whether a header can be written as it is: a token
// name (pseudo-headers are not written) and a value without line breaks or
// NULs, the rules net/http's transport enforces.
func ValidHeader(name, value string) bool {
	if !strings.HasPrefix(name, ":") && !ValidMethod(name) {
		return false
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}
