package wasmhost

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
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
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l.Addr().String()
	l.Close()

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
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for len(vm.logs.results("status")) == 0 {
				if ctx.Err() != nil {
					t.Fatalf("no callback; log:\n%s", strings.Join(vm.logs.all(), "\n"))
				}
				time.Sleep(2 * time.Millisecond)
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
	defer c.Close()
	srv := <-accepted
	if srv == nil {
		t.Fatal("accept failed")
	}
	defer srv.Close()
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
}
