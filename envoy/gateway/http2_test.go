package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// TestGatewayRefusesHTTP2PriorKnowledge: a client that opens HTTP/2 with
// prior knowledge (h2c), as Envoy's codec_type AUTO accepts, is refused in
// HTTP/2's own terms, on the edge listener and the stats listener alike: a
// GOAWAY with HTTP_1_1_REQUIRED whose debug data names the gap, nothing
// counted as a request, and the gateway serving HTTP/1.1 as before.
// Before, the client got an HTTP/1.1 400 on its HTTP/2 connection, which
// it reads as a broken server, and the gateway counted a request the
// filter never saw.
func TestGatewayRefusesHTTP2PriorKnowledge(t *testing.T) {
	filter, _ := modules(t)
	orders := newService(t, "orders", 0)
	sidecar := newSidecar(t)
	g := start(t, "-config", envoyYAML, "-wasm", filter, "-concurrency", "1",
		"-cluster", "orders="+orders.Listener.Addr().String(), "-cluster", "billing="+testkit.RefusedAddr(t),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	want := []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0} // the server's SETTINGS, empty
	want = append(want, byte((8+len(http2Refusal))>>16), byte((8+len(http2Refusal))>>8), byte(8+len(http2Refusal)), 0x7, 0, 0, 0, 0, 0)
	want = binary.BigEndian.AppendUint32(want, 0)   // last stream: none
	want = binary.BigEndian.AppendUint32(want, 0xd) // HTTP_1_1_REQUIRED
	want = append(want, http2Refusal...)
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &h2}}
	t.Cleanup(client.CloseIdleConnections)
	for _, addr := range []string{g.addr, g.stats} {
		// The frames as sent, and the connection's end: a close after the
		// client's bytes were read, not a reset, which could discard the
		// GOAWAY unread. The client sends the preface, its SETTINGS and
		// the HEADERS of a GET / (stream 1).
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		sent := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
		sent = append(sent, 0, 0, 0, 0x4, 0, 0, 0, 0, 0)
		sent = append(sent, 0, 0, 3, 0x1, 0x5, 0, 0, 0, 1, 0x82, 0x86, 0x84)
		if _, err := conn.Write(sent); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil {
			t.Errorf("%s: reading the refusal: %v (after %x)", addr, err, got)
		} else if !bytes.Equal(got, want) {
			t.Errorf("%s: the gateway sent\n%x\nwant an empty SETTINGS and a GOAWAY (HTTP_1_1_REQUIRED, %q)\n%x", addr, got, http2Refusal, want)
		}
		// Go's HTTP/2 transport, a real client: it reports the GOAWAY if
		// its request went out before it read it, or that the connection
		// "could not be established" if the GOAWAY came first; either way
		// it read HTTP/2 frames, where before it read the bytes of an
		// HTTP/1.1 400 as a frame ("frame too large, note that the frame
		// header looked like an HTTP/1.1 header").
		resp, err := client.Get("http://" + addr + "/orders/1")
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s over h2c: %s %d, want the connection refused", addr, resp.Proto, resp.StatusCode)
		}
		if msg := err.Error(); !strings.Contains(msg, "HTTP_1_1_REQUIRED") && !strings.Contains(msg, "could not be established") {
			t.Errorf("%s over h2c: %v; want the GOAWAY with HTTP_1_1_REQUIRED, or the connection not established", addr, err)
		}
	}
	if n := stat(t, g.admin, "http.edge.downstream_rq_total"); n != 0 {
		t.Errorf("http.edge.downstream_rq_total = %d after the refused connection, want 0: no request was served", n)
	}
	if resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1", "x-api-key", "alice"); resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
		t.Errorf("HTTP/1.1 after the refusal: %s %d, want HTTP/1.1 200", resp.Proto, resp.StatusCode)
	}
	if !strings.Contains(g.stderr.String(), "HTTP/2 connection refused") {
		t.Errorf("no log line for the refused connections:\n%s", g.stderr.String())
	}
}
