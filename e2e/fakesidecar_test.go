package e2e_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// answerFunc answers one request read from conn, writing whatever bytes it
// likes; it returns false when the connection must be closed afterwards.
type answerFunc func(conn net.Conn, req *http.Request) (keepAlive bool)

// fakeSidecar stands where the gateways expect the sidecar, speaking
// HTTP/1.1 at the byte level so that it can answer anything: by default it
// passes each check on to the real sidecar behind it and relays the answer;
// a test swaps in another answer to play a sidecar gone wrong, and swaps
// the relay back to recover. It also records the headers of every check
// (POST /v1/check) it was sent; the filter's warm-up calls (POST /v1/warm)
// get the same answer as the checks, and are not recorded.
type fakeSidecar struct {
	t      *testing.T
	ln     net.Listener
	real   string // the real sidecar's address
	client *http.Client
	answer atomic.Pointer[answerFunc]

	mu    sync.Mutex
	conns map[net.Conn]bool
	seen  []http.Header // the checks' headers
	wg    sync.WaitGroup
}

// startFakeSidecar listens on a free loopback port in front of the sidecar
// at real; the listener and every connection are closed at cleanup.
func startFakeSidecar(t *testing.T, real string) *fakeSidecar {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSidecar{t: t, ln: ln, real: real, conns: map[net.Conn]bool{},
		client: &http.Client{Timeout: 10 * time.Second}}
	f.set(f.relay)
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(f.close)
	return f
}

func (f *fakeSidecar) addr() string { return f.ln.Addr().String() }

// set makes a answer every request from now on.
func (f *fakeSidecar) set(a answerFunc) { f.answer.Store(&a) }

// requests returns the headers of every check received so far.
func (f *fakeSidecar) requests() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.seen...)
}

func (f *fakeSidecar) serve() {
	defer f.wg.Done()
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[conn] = true
		f.mu.Unlock()
		f.wg.Add(1)
		go f.handle(conn)
	}
}

func (f *fakeSidecar) handle(conn net.Conn) {
	defer f.wg.Done()
	defer func() {
		conn.Close()
		f.mu.Lock()
		delete(f.conns, conn)
		f.mu.Unlock()
	}()
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
		if req.Method == http.MethodPost && req.URL.Path == limiter.CheckPath {
			f.mu.Lock()
			f.seen = append(f.seen, req.Header.Clone())
			f.mu.Unlock()
		}
		if !(*f.answer.Load())(conn, req) {
			return
		}
	}
}

// relay passes the request to the real sidecar and its answer back.
func (f *fakeSidecar) relay(conn net.Conn, req *http.Request) bool {
	out, err := http.NewRequest(req.Method, "http://"+f.real+req.URL.RequestURI(), nil)
	if err != nil {
		return false
	}
	out.Header = req.Header.Clone()
	resp, err := f.client.Do(out)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.Write(conn) == nil
}

func (f *fakeSidecar) close() {
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// rawAnswer writes text as it is and keeps the connection.
func rawAnswer(text string) answerFunc {
	return func(conn net.Conn, _ *http.Request) bool {
		_, err := io.WriteString(conn, text)
		return err == nil
	}
}

// rawAnswerClose writes text as it is and closes the connection.
func rawAnswerClose(text string) answerFunc {
	return func(conn net.Conn, _ *http.Request) bool {
		io.WriteString(conn, text)
		return false
	}
}

// response is an HTTP/1.1 response with the given status line, header
// lines and body (content-length added).
func response(status string, headers []string, body string) string {
	var b strings.Builder
	b.WriteString("HTTP/1.1 " + status + "\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("content-length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return b.String()
}

// validAllow are the header lines of a well-formed 200 from the sidecar:
// its own answer (filtertest.SidecarAnswer, made by the sidecar's code) for
// a plan of 10 tokens at 1/s whose full bucket admits a request of cost 1.
// The cases that use it put them under another status, or beside other
// bytes, to make an answer the sidecar never sends.
var validAllow = headerLines(filtertest.SidecarAnswer("fake", 10, 1, 10, 1))

// headerLines writes an answer's headers as HTTP/1.1 header lines, less
// :status and content-length, which response writes itself.
func headerLines(headers []filtertest.Header) []string {
	var lines []string
	for _, h := range headers {
		if h[0] != ":status" && h[0] != "content-length" {
			lines = append(lines, h[0]+": "+h[1])
		}
	}
	return lines
}

// resetAfter writes text, then resets the connection (RST rather than
// FIN, as a crashed peer's kernel does).
func resetAfter(text string) answerFunc {
	return func(conn net.Conn, _ *http.Request) bool {
		io.WriteString(conn, text)
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		return false
	}
}

// trickle writes head, then the body one byte every interval, giving up
// once a write fails (the caller hung up) or the connection ends.
func trickle(head string, body string, interval time.Duration) answerFunc {
	return func(conn net.Conn, _ *http.Request) bool {
		if _, err := io.WriteString(conn, head); err != nil {
			return false
		}
		for i := 0; i < len(body); i++ {
			time.Sleep(interval)
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return false
			}
		}
		return false
	}
}
