package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// echoService answers with what it received: method, framing and body.
func echoService(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("x-method", r.Method)
		w.Header().Set("x-content-length", r.Header.Get("content-length"))
		w.Header().Set("x-te", strings.Join(r.TransferEncoding, ","))
		if r.URL.Path == "/orders/chunked" {
			// Two flushed writes: a chunked response.
			io.WriteString(w, "part1,")
			w.(http.Flusher).Flush()
		}
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func startWith(t *testing.T, orders, billing string) *running {
	filter, _ := modules(t)
	sidecar := newSidecar(t)
	return start(t, "-config", envoyYAML, "-wasm", filter, "-concurrency", "1",
		"-cluster", "orders="+orders, "-cluster", "billing="+billing,
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
}

func TestUpstreamBodies(t *testing.T) {
	svc := echoService(t)
	g := startWith(t, svc.Listener.Addr().String(), testkit.RefusedAddr(t))
	base := "http://" + g.addr
	send := func(method, path string, body io.Reader, length int64, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, body)
		if body != nil {
			req.ContentLength = length
		}
		req.Header.Set("x-api-key", "alice")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		return testkit.Do(t, req)
	}
	big := strings.Repeat("0123456789", 10000) // larger than every buffer
	cases := []struct {
		name, method, path, body string
		length                   int64 // -1: chunked from the client
		hdr                      []string
		wantCL, wantTE           string
		wantBody                 string
	}{
		{"GET", "GET", "/orders/1", "", 0, nil, "", "", ""},
		{"POST with a length", "POST", "/orders/1", big, int64(len(big)), nil, "100000", "", big},
		{"POST chunked", "POST", "/orders/1", "a body of unknown length", -1, nil, "", "chunked", "a body of unknown length"},
		{"POST without a body", "POST", "/orders/1", "", 0, nil, "0", "", ""},
		{"Expect: 100-continue", "PUT", "/orders/1", "after continue", 14, []string{"expect", "100-continue"}, "14", "", "after continue"},
		{"chunked response", "POST", "/orders/chunked", "part2", 5, nil, "5", "", "part1,part2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
				if c.length < 0 {
					body = io.MultiReader(body) // hides the length
				}
			}
			resp, got := send(c.method, c.path, body, c.length, c.hdr...)
			if resp.StatusCode != 200 || got != c.wantBody {
				t.Fatalf("status %d, body %.40q (%d bytes), want %.40q", resp.StatusCode, got, len(got), c.wantBody)
			}
			if m := resp.Header.Get("x-method"); m != c.method {
				t.Errorf("method %q upstream", m)
			}
			if cl, te := resp.Header.Get("x-content-length"), resp.Header.Get("x-te"); cl != c.wantCL || te != c.wantTE {
				t.Errorf("upstream framing content-length %q transfer-encoding %q, want %q %q", cl, te, c.wantCL, c.wantTE)
			}
		})
	}
	resp, err := http.Head(base + "/orders/1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 { // no key: the filter answers a HEAD too
		t.Errorf("HEAD without a key: %d", resp.StatusCode)
	}
}

func readRequest(br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, req.Body)
	return true
}

// TestUpstreamClosesIdleConnections: a server that closes every connection
// after its answer, without saying so, costs the client nothing.
func TestUpstreamClosesIdleConnections(t *testing.T) {
	closed := make(chan struct{}, 10)
	addr := testkit.RawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequest(br) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		c.Close()
		closed <- struct{}{}
	})
	g := startWith(t, addr, testkit.RefusedAddr(t))
	for i := 0; i < 6; i++ {
		// GETs go again on a new connection; POSTs check the idle one
		// first.
		method := []string{"GET", "POST"}[i%2]
		req, _ := http.NewRequest(method, "http://"+g.addr+"/orders/1", strings.NewReader("b"))
		req.Header.Set("x-api-key", "alice")
		if method == "GET" {
			req.Body, req.ContentLength = nil, 0
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %d (%s): %d %q", i, method, resp.StatusCode, body)
		}
		// The server has closed the connection before the next request
		// (which a retried GET does not need, but a POST does).
		<-closed
	}
}

// TestUpstreamResetAfterHeaders: a body cut short after the headers went
// out resets the client's stream, as Envoy can only do then; a connection
// closed before any answer is Envoy's 503.
func TestUpstreamResetAfterHeaders(t *testing.T) {
	cut := testkit.RawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequest(br) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
		}
	})
	silent := testkit.RawServer(t, func(c net.Conn, br *bufio.Reader) { readRequest(br) })
	g := startWith(t, cut, silent)
	req, _ := http.NewRequest("GET", "http://"+g.addr+"/orders/1", nil)
	req.Header.Set("x-api-key", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err == nil {
		t.Errorf("cut body: status %d, read error %v; want 200 and an error", resp.StatusCode, err)
	}
	resp2, body := testkit.Get(t, "http://"+g.addr+"/billing/1", "x-api-key", "alice")
	if resp2.StatusCode != 503 || body != "upstream connect error or disconnect/reset before headers. reset reason: connection termination" {
		t.Errorf("no answer: %d %q", resp2.StatusCode, body)
	}
}
