package wasmhost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/metrics"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

func TestHTTPDispatcher(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Host+" "+r.Header.Get("x-k")+" "+string(b))
		w.WriteHeader(201)
		io.WriteString(w, "created")
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-length", "100")
		w.WriteHeader(200)
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	closed := testkit.RefusedAddr(t)

	d := NewHTTPDispatcher(map[string]HTTPCluster{
		"svc":  {Endpoints: []string{srv.Listener.Addr().String()}},
		"down": {Endpoints: []string{closed}, ConnectTimeout: time.Second},
	})
	defer d.Close()
	callback := "get 6 :status;get 6 x-seen;buf 4 0 200;status"
	cases := []struct {
		name string
		call string
		want []string
	}{
		{"answered", "call svc :method=POST,:path=/ok,:authority=svc.local,x-k=v hello 2000",
			[]string{"get=0 value=201", "get=0 value=svc.local%20v%20hello", "buf=0 ptr0=false len=7 data=created"}},
		{"connection refused is a 503", "call down :method=GET,:path=/,:authority=d - 2000",
			[]string{"get=0 value=503", "get=1 value="}},
		{"timeout is a 504", "call svc :method=GET,:path=/slow,:authority=s - 50",
			[]string{"get=0 value=504", "buf=0 ptr0=false len=24 data=upstream%20request%20timeout"}},
		{"a response cut short is a reset", "call svc :method=GET,:path=/cut,:authority=s - 2000",
			[]string{"http_call_response token=4 headers=0 body=0 trailers=0", "status=0 code=11 msg=reset"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vm := newProbeVM(t, PollSleep, Options{Dispatcher: d, Clock: SystemClock{}})
			if err := vm.Configure(script(map[string]string{"configure": c.call, "http_call_response": callback})); err != nil {
				t.Fatal(err)
			}
			if !testkit.Until(10*time.Second, func() bool { return len(vm.logs.results("status")) > 0 }) {
				t.Fatalf("no callback; log:\n%s", strings.Join(vm.logs.all(), "\n"))
			}
			checkLines(t, vm.logs, c.want)
		})
	}
	if !d.Cluster("svc") || d.Cluster("nope") {
		t.Error("Cluster answers wrongly")
	}
}

// unread sees bytes waiting in a socket before anyone reads them, and
// none once they are read: what a callout's timeout asks of the socket.
func TestUnreadSeesTheSocket(t *testing.T) {
	c, srv := tcpPair(t)
	if unread(c) {
		t.Fatal("unread before anything was sent")
	}
	if _, err := srv.Write([]byte("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// Loopback delivery is not instant: poll until the kernel has it.
	testkit.Poll(t, 10*time.Second, "the bytes sent to show as unread", func() bool { return unread(c) })
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(c, buf, len("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if unread(c) {
		t.Error("unread after everything was read")
	}
	// The peer's close is what a reader would see next: it waits too.
	srv.Close()
	testkit.Poll(t, 10*time.Second, "the peer's close to show as unread", func() bool { return unread(c) })
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("read after the peer's close: %d, %v; want the end", n, err)
	}
}

// tcpPair returns the two ends of a loopback TCP connection, closed when
// the test ends (a second Close is harmless).
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	srv := <-accepted
	if srv == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { srv.Close() })
	return c, srv
}

// A reset waiting in the socket counts as unread, as a close does: the
// next read returns at once with it.
func TestUnreadSeesAReset(t *testing.T) {
	c, srv := tcpPair(t)
	if unread(c) {
		t.Fatal("unread before anything happened")
	}
	srv.(*net.TCPConn).SetLinger(0) // Close sends a reset
	srv.Close()
	testkit.Poll(t, 10*time.Second, "the peer's reset to show as unread", func() bool { return unread(c) })
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after the peer's reset: %v; want ECONNRESET", err)
	}
}

// holdServer answers each request only when the test releases it, and
// remembers which connection each came on.
type holdServer struct {
	*httptest.Server
	mu      sync.Mutex
	arrived []string // remote address of each request, in order
	release chan struct{}
}

func newHoldServer(t *testing.T) *holdServer {
	h := &holdServer{release: make(chan struct{}, 16)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.arrived = append(h.arrived, r.RemoteAddr)
		h.mu.Unlock()
		select {
		case <-h.release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(h.Close)
	return h
}

// waitArrived polls until n requests have reached the server.
func (h *holdServer) waitArrived(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	testkit.Poll(t, 10*time.Second, fmt.Sprintf("%d requests at the server", n), func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		got = append(got[:0], h.arrived...)
		return len(got) >= n
	})
	return got
}

// hold dispatches a GET of path and returns its context's cancel (what the
// host does once the call ended) and where its one response goes.
func hold(t *testing.T, d *HTTPDispatcher, path string) (context.CancelFunc, chan CalloutResponse, error) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	got := make(chan CalloutResponse, 1)
	err := d.Dispatch(ctx, Callout{Cluster: "svc", Headers: []Header{{":method", "GET"}, {":path", path}, {":authority", "s"}}},
		func(r CalloutResponse) { got <- r })
	return cancel, got, err
}

func answered(t *testing.T, got chan CalloutResponse) CalloutResponse {
	t.Helper()
	select {
	case r := <-got:
		if r.Status() != 200 {
			t.Fatalf("status %d, want 200", r.Status())
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no response")
	}
	return CalloutResponse{}
}

// Past max_requests in flight a call fails inline (ErrOverflow) with no
// response; a call that ends frees its place.
func TestCircuitBreakerMaxRequests(t *testing.T) {
	srv := newHoldServer(t)
	d := NewHTTPDispatcher(map[string]HTTPCluster{"svc": {Endpoints: []string{srv.Listener.Addr().String()}, Limits: CircuitBreaker{MaxRequests: 2}}})
	defer d.Close()
	endA, gotA, errA := hold(t, d, "/a")
	endB, gotB, errB := hold(t, d, "/b")
	if errA != nil || errB != nil {
		t.Fatalf("two calls within max_requests 2: %v, %v", errA, errB)
	}
	srv.waitArrived(t, 2)
	_, gotC, errC := hold(t, d, "/c")
	if !errors.Is(errC, ErrOverflow) {
		t.Fatalf("a third call in flight: %v, want ErrOverflow", errC)
	}
	srv.release <- struct{}{}
	// A response handed over frees its call's place at once.
	stillWaiting := endB
	select {
	case <-gotA:
	case <-gotB:
		stillWaiting = endA
	case <-time.After(10 * time.Second):
		t.Fatal("no response")
	}
	if _, _, err := hold(t, d, "/d"); err != nil {
		t.Fatalf("a call after one was answered: %v", err)
	}
	// A call the host stops waiting for frees its place too.
	if _, _, err := hold(t, d, "/e"); !errors.Is(err, ErrOverflow) {
		t.Fatalf("a call past max_requests again: %v, want ErrOverflow", err)
	}
	stillWaiting()
	pollDispatch(t, d, "/f")
	select {
	case r := <-gotC:
		t.Errorf("the overflowed call got a response: %+v", r)
	default:
	}
}

// pollDispatch retries a call until the circuit breaker lets it through: a
// place freed by a call the host stopped waiting for is returned when its
// context's AfterFunc has run. An overflowed call leaves nothing behind.
func pollDispatch(t *testing.T, d *HTTPDispatcher, path string) chan CalloutResponse {
	t.Helper()
	var got chan CalloutResponse
	testkit.PollErr(t, 10*time.Second, path+" let through", func() error {
		var err error
		_, got, err = hold(t, d, path)
		return err
	})
	return got
}

// With max_connections open and busy a call waits (pending) for one to
// come free and goes out on it; past max_pending_requests waiting, a call
// overflows; a waiting call whose host stopped waiting leaves the queue.
func TestCircuitBreakerPendingAndConnections(t *testing.T) {
	srv := newHoldServer(t)
	d := NewHTTPDispatcher(map[string]HTTPCluster{"svc": {Endpoints: []string{srv.Listener.Addr().String()},
		Limits: CircuitBreaker{MaxConnections: 1, MaxPendingRequests: 1, MaxRequests: 10}}})
	defer d.Close()
	_, gotA, err := hold(t, d, "/a")
	if err != nil {
		t.Fatal(err)
	}
	srv.waitArrived(t, 1) // A's connection is up: A is no longer pending
	endB, _, err := hold(t, d, "/b")
	if err != nil {
		t.Fatalf("B waits for the one connection: %v", err)
	}
	if _, _, err := hold(t, d, "/c"); !errors.Is(err, ErrOverflow) {
		t.Fatalf("C with B already pending: %v, want ErrOverflow", err)
	}
	endB() // the host stopped waiting for B: it leaves the queue
	gotD := pollDispatch(t, d, "/d")
	srv.release <- struct{}{}
	answered(t, gotA)
	// A's connection went to D, the one call still waiting.
	arrived := srv.waitArrived(t, 2)
	if arrived[1] != arrived[0] {
		t.Errorf("D came on %s, want A's connection %s (max_connections 1)", arrived[1], arrived[0])
	}
	srv.release <- struct{}{}
	answered(t, gotD)
}

// A call answered on a pooled connection starts no goroutine: its
// response is read by the connection's reader, which was started with the
// connection, and the end of the call's context, after the response, has
// nothing left to run (each goroutine started is a possible wake-up of a
// thread on another CPU, in every request's path).
func TestCalloutOnAPooledConnectionStartsNoGoroutine(t *testing.T) {
	addr := testkit.RawServer(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
		}
	})
	d := NewHTTPDispatcher(map[string]HTTPCluster{"svc": {Endpoints: []string{addr}}})
	defer d.Close()
	callAnswered(t, d, 0) // dials the connection and starts its reader
	const calls = 200
	before := goroutinesCreated()
	for range calls {
		callAnswered(t, d, 0)
	}
	// Each call that started one would add at least one, calls in all;
	// the rest of the process (a timer left by another test) may start
	// a few.
	if n := goroutinesCreated() - before; n > calls/10 {
		t.Errorf("%d calls on a pooled connection started %d goroutines, want none", calls, n)
	}
}

// callAnswered sends a GET of / to the cluster "svc" from the worker, as
// the host does (a call context of its own, ended once the answer is
// delivered), and returns the answer, which must be a 200.
func callAnswered(t *testing.T, d *HTTPDispatcher, worker int) CalloutResponse {
	t.Helper()
	got := make(chan CalloutResponse, 1)
	var ctx callContext
	ctx.init(context.Background())
	defer ctx.end()
	if _, err := d.DispatchWatched(&ctx, Callout{Worker: worker, Cluster: "svc",
		Headers: []Header{{":method", "GET"}, {":path", "/"}, {":authority", "svc"}}},
		func(r CalloutResponse) { got <- r }); err != nil {
		t.Fatal(err)
	}
	return answered(t, got)
}

func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Each worker's calls go out on connections of its own, as Envoy's
// connection pools are per worker thread and never shared: a connection
// one worker's call opened and left idle carries that worker's next call,
// and never another worker's, which opens one for itself.
func TestCalloutConnectionsArePerWorker(t *testing.T) {
	var mu sync.Mutex
	var opened []string // each connection's client address, in order
	addr := testkit.RawServer(t, func(c net.Conn, br *bufio.Reader) {
		mu.Lock()
		opened = append(opened, c.RemoteAddr().String())
		mu.Unlock()
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nx-conn: %s\r\ncontent-length: 0\r\n\r\n", c.RemoteAddr())
		}
	})
	d := NewHTTPDispatcher(map[string]HTTPCluster{"svc": {Endpoints: []string{addr}}})
	defer d.Close()
	call := func(worker int) string {
		t.Helper()
		r := callAnswered(t, d, worker)
		for _, h := range r.Headers {
			if h[0] == "x-conn" {
				return h[1]
			}
		}
		t.Fatalf("worker %d: no x-conn in %v", worker, r.Headers)
		return ""
	}
	first0 := call(0)
	first1 := call(1)
	if first1 == first0 {
		t.Errorf("worker 1's first call went out on worker 0's idle connection %s, want one of its own", first0)
	}
	for i := range 3 {
		if got := call(0); got != first0 {
			t.Errorf("worker 0's call %d went out on %s, want its own idle %s", i+2, got, first0)
		}
		if got := call(1); got != first1 {
			t.Errorf("worker 1's call %d went out on %s, want its own idle %s", i+2, got, first1)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(opened) != 2 {
		t.Errorf("two workers, one call at a time each, opened %d connections, want 2: %v", len(opened), opened)
	}
}
