package testkit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
)

// Do sends req with http.DefaultClient and returns the response with its
// whole body read (and the body closed). It fails t if the request or the
// reading of its body fails.
func Do(t testing.TB, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp, string(b)
}

// Get is Do for a GET of url with headers given as name, value pairs (a
// name given twice is sent twice).
func Get(t testing.TB, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return Do(t, req)
}

// RawServer listens on a loopback port, closed when the test ends, and
// serves each connection with answer on a goroutine of its own, started
// when the connection is accepted: for answers net/http's server would not
// send, or a server that starts nothing per request. It returns the
// listener's address.
func RawServer(t testing.TB, answer func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				answer(c, bufio.NewReader(c))
			}()
		}
	}()
	return l.Addr().String()
}
