package e2e_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
)

// What the edge does with requests that are more than a plain GET, through
// envoy.yaml as shipped.

// recordingService answers every request with status and keeps the
// headers of each request that reached it.
type recordingService struct {
	*httptest.Server
	mu   sync.Mutex
	seen []http.Header
}

func startRecordingService(t *testing.T, status int) *recordingService {
	t.Helper()
	s := &recordingService{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen = append(s.seen, r.Header.Clone())
		s.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *recordingService) requests() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.seen...)
}

// startGatewayTo starts a gateway on envoy.yaml as shipped whose two
// services are both svc, beside the stack's first sidecar.
func startGatewayTo(t *testing.T, s *stack, svc *httptest.Server) *harness.Gateway {
	t.Helper()
	return startGatewayOn(t, s, svc, repoFile(t, "envoy/envoy.yaml"))
}

// startGatewayOn is startGatewayTo on the bootstrap at config.
func startGatewayOn(t *testing.T, s *stack, svc *httptest.Server, config string) *harness.Gateway {
	t.Helper()
	addr := strings.TrimPrefix(svc.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := harness.StartGateway(ctx, bins, harness.GatewayConfig{
		Config:   config,
		Clusters: map[string]string{"orders": addr, "billing": addr, "ratelimit_sidecar": s.scAddrs[0]},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.own(g.Process)
	return g
}

// A client cannot make the router send its request twice: the x-envoy-*
// headers Envoy's router obeys (x-envoy-retry-on, x-envoy-max-retries, …)
// are removed from every client's request, the loopback client's here
// included (envoy.yaml trusts no address as internal), so a charged POST
// the service answers 503 reaches it once, and a client's
// x-envoy-internal never reaches a service.
func TestClientCannotSteerRetries(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	svc := startRecordingService(t, http.StatusServiceUnavailable)
	g := startGatewayTo(t, s, svc.Server)

	steering := []string{
		"x-envoy-retry-on", "5xx,reset,connect-failure,retriable-status-codes",
		"x-envoy-max-retries", "3",
		"x-envoy-retriable-status-codes", "503",
		"x-envoy-upstream-rq-timeout-ms", "60000",
		"x-envoy-upstream-rq-per-try-timeout-ms", "1",
		"x-envoy-hedge-on-per-try-timeout", "true",
		"x-envoy-internal", "true",
	}
	head := "POST /billing/pay HTTP/1.1\r\nhost: shop\r\nconnection: close\r\nx-api-key: retrier\r\ncontent-length: 3\r\n"
	for i := 0; i+1 < len(steering); i += 2 {
		head += steering[i] + ": " + steering[i+1] + "\r\n"
	}
	if st, body := rawRequest(t, g.Addr, head+"\r\nabc"); st != http.StatusServiceUnavailable {
		t.Fatalf("status %d (%q), want the service's 503 passed on", st, body)
	}
	seen := svc.requests()
	if len(seen) != 1 {
		t.Fatalf("the service received the request %d times, want once", len(seen))
	}
	for i := 0; i+1 < len(steering); i += 2 {
		if v := seen[0].Values(steering[i]); len(v) > 0 {
			t.Errorf("the service received the client's %s: %q; an edge request loses it", steering[i], v)
		}
	}
	if got := seen[0].Get("x-envoy-external-address"); got != "127.0.0.1" {
		t.Errorf("x-envoy-external-address = %q, want the client's address, 127.0.0.1 (an edge request)", got)
	}
}

// A client that sends Expect: 100-continue and is denied gets its 429
// before it sends its body, and one admitted gets the 100 and uploads to
// the service: envoy.yaml passes the Expect on (proxy_100_continue), so
// the 100 comes only once the filter let the request through. (POST
// /orders costs 5 on a plan of 2, a denial that never depends on time.)
func TestDeniedUploadSendsNoBody(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	const size = 1 << 20
	// first sends head and returns the connection and the first answer
	// to it, interim or final.
	first := func(head string) (net.Conn, *bufio.Reader, *http.Response) {
		t.Helper()
		conn, err := net.DialTimeout("tcp", s.gateways[0].Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, head); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the first answer to %q: %v", head, err)
		}
		return conn, br, resp
	}
	upload := func(method, path, key string) string {
		return method + " " + path + " HTTP/1.1\r\nhost: shop\r\nx-api-key: " + key +
			"\r\nexpect: 100-continue\r\ncontent-length: " + strconv.Itoa(size) + "\r\n\r\n"
	}
	s.decidedRun(t, "a denied upload", func(run int) error {
		key := "uploader-" + strconv.Itoa(run)
		_, _, resp := first(upload("POST", "/orders/new", key))
		if resp.StatusCode != http.StatusTooManyRequests {
			return fmt.Errorf("first answer %d, want 429 before any 100 Continue (the client would upload %d bytes for it)", resp.StatusCode, size)
		}
		if got := s.received(key); got != 0 {
			return fmt.Errorf("the services received %d requests of a denied client", got)
		}
		return nil
	})
	s.decidedRun(t, "an admitted upload", func(run int) error {
		key := "admitted-" + strconv.Itoa(run)
		conn, br, resp := first(upload("PUT", "/billing/doc", key))
		if resp.StatusCode != http.StatusContinue {
			return fmt.Errorf("first answer %d, want 100 Continue", resp.StatusCode)
		}
		if _, err := conn.Write(make([]byte, size)); err != nil {
			return fmt.Errorf("sending the body: %v", err)
		}
		final, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("reading the answer after the body: %v", err)
		}
		final.Body.Close()
		if final.StatusCode != http.StatusOK {
			return fmt.Errorf("answer after the body %d, want 200", final.StatusCode)
		}
		if got := s.received(key); got != 1 {
			return fmt.Errorf("the services received %d requests of the admitted client, want 1", got)
		}
		return nil
	})
}

// An upgrade (a WebSocket handshake) to a route is refused before the
// filter, as Envoy refuses one on a connection manager without
// upgrade_configs (envoy.yaml has none): a 403, nothing charged, nothing
// at a service, and the connection closed, so that no bytes sent after
// the handshake are read as a request. An Upgrade: h2c is no upgrade to
// Envoy (its HTTP/1 codec drops it): an ordinary request, charged once.
func TestUpgradeRefusedBeforeTheFilter(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	const key = "websocket-client"
	conn, err := net.DialTimeout("tcp", s.gateways[0].Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET /orders/feed HTTP/1.1\r\nhost: shop\r\nconnection: keep-alive, Upgrade\r\nupgrade: websocket\r\n"+
		"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nx-api-key: "+key+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a WebSocket handshake: status %d, want 403", resp.StatusCode)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
		t.Errorf("after the 403: %q, %v; want the connection closed", rest, err)
	}
	if got := s.received(key); got != 0 {
		t.Errorf("the services received %d of the refused handshakes", got)
	}
	if tokens, err := s.tokens(key); err == nil {
		t.Errorf("the refused handshake was charged: its bucket holds %v tokens", tokens)
	}
	if got := s.stat("http.edge.downstream_rq_ws_on_non_ws_route"); got != 1 {
		t.Errorf("http.edge.downstream_rq_ws_on_non_ws_route = %d, want 1", got)
	}

	const h2c = "h2c-client"
	st, body := rawRequest(t, s.gateways[0].Addr, "GET /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\nx-api-key: "+h2c+"\r\n")
	if st != http.StatusOK {
		t.Errorf("Upgrade: h2c: status %d (%q), want 200, an ordinary request", st, body)
	}
	if got := s.received(h2c); got != 1 {
		t.Errorf("the services received %d of the h2c request, want 1", got)
	}
}

// A request with a header whose name holds an underscore gets a 400
// before the filter (envoy.yaml's headers_with_underscores_action:
// REJECT_REQUEST), so x_api_key cannot ride beside an x-api-key that paid
// to a service that reads both as one name (HTTP_X_API_KEY): nothing
// charged, nothing at a service.
func TestHeadersWithUnderscoresRefused(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	const payer, victim = "fresh-payer", "victim-key"
	st, body := rawRequest(t, s.gateways[0].Addr, "GET /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: close\r\nx-api-key: "+payer+"\r\nx_api_key: "+victim+"\r\n")
	if st != http.StatusBadRequest {
		t.Errorf("x_api_key beside x-api-key: status %d (%q), want 400", st, body)
	}
	if got := s.totalReceived(); got != 0 {
		t.Errorf("the services received %d requests", got)
	}
	if tokens, err := s.tokens(payer); err == nil {
		t.Errorf("the refused request was charged: %s's bucket holds %v tokens", payer, tokens)
	}
	if got := s.stat("http1.requests_rejected_with_underscores_in_headers"); got != 1 {
		t.Errorf("http1.requests_rejected_with_underscores_in_headers = %d, want 1", got)
	}
}

// A denied client that sends its body slowly, or waits for an answer
// before sending the rest, gets its 429 at once, as Envoy sends it, not
// once its body is in, and the 429 ends the connection (connection:
// close), as Envoy ends an HTTP/1 connection whose request is not whole
// when its reply goes out: the rest of the body, and a request sent after
// it, are never read. (POST /orders costs 5 on a plan of 2; each request
// sends its head and the first bytes of a longer body, waits for the 429,
// then sends the rest and a request without a key.) A denied request
// whose body came whole keeps its connection:
// TestOneConnectionManyClients.
func TestDeniedSlowBodyAnsweredAtOnce(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	for _, c := range []struct{ name, framing, start, rest string }{
		{"content-length", "content-length: 20000", strings.Repeat("x", 100), strings.Repeat("x", 19900)},
		{"chunked", "transfer-encoding: chunked", "5\r\nhello\r\n", "5\r\nworld\r\n0\r\n\r\n"},
	} {
		s.decidedRun(t, c.name, func(run int) error {
			key := "slow-" + c.name + "-" + strconv.Itoa(run)
			conn, err := net.DialTimeout("tcp", s.gateways[0].Addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			// hangBound: the 429 is made within the 5 ms callout; a
			// reply still missing after it waits for the body.
			conn.SetDeadline(time.Now().Add(hangBound))
			head := "POST /orders/new HTTP/1.1\r\nhost: shop\r\nx-api-key: " + key + "\r\n" + c.framing + "\r\n\r\n"
			if _, err := io.WriteString(conn, head+c.start); err != nil {
				return err
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return fmt.Errorf("%s: no answer within %v with the body unfinished: %v", c.name, hangBound, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests {
				return fmt.Errorf("%s: status %d, want 429", c.name, resp.StatusCode)
			}
			if !resp.Close {
				return fmt.Errorf("%s: the 429 to a request whose body is not whole has connection %q, want close",
					c.name, resp.Header.Get("connection"))
			}
			if got := s.received(key); got != 0 {
				return fmt.Errorf("%s: the services received %d requests of the denied client", c.name, got)
			}
			// The rest of the body, then a request: neither is read.
			conn.SetDeadline(time.Now().Add(hangBound))
			io.WriteString(conn, c.rest+"GET /billing/1 HTTP/1.1\r\nhost: shop\r\n\r\n")
			if next, err := http.ReadResponse(br, nil); err == nil {
				next.Body.Close()
				return fmt.Errorf("%s: a request sent after the 429 on its connection was answered %d, want the connection ended",
					c.name, next.StatusCode)
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
				return fmt.Errorf("%s: after the 429: %v, want the connection ended", c.name, err)
			}
			return nil
		})
	}
}

// One keep-alive connection carries the requests of many clients, as a load
// balancer in front of the edge sends them: each is decided and charged for
// its own key, and nothing of one request's answer (a key, a decision, a
// 429's Retry-After or problem body) is in the next one's. The filter's
// answers keep the connection, a denial of a request whose body came with
// it included; one the filter makes within its request-headers call (a 401)
// to a request with a body ends it, as Envoy's HTTP/1 codec hands the
// filters the headers before it parses the body, so that the request is not
// complete. Sent one at a time, then pipelined (all written before any
// answer is read): answered in order, as Envoy's HTTP/1 codec serves one
// request of a connection at a time. Plan tiny: 2 tokens, one back every
// 1000 s, so each answer below is exact; POST /orders costs 5, more than
// the plan holds (a 429 without Retry-After).
func TestOneConnectionManyClients(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	type exchange struct {
		request   string
		status    int
		remaining string // ratelimit-remaining, "" for none
		retry     bool   // a Retry-After
		close     bool   // connection: close
	}
	for _, pipelined := range []bool{false, true} {
		name := map[bool]string{false: "one at a time", true: "pipelined"}[pipelined]
		s.decidedRun(t, name, func(run int) error {
			a, b, c := fmt.Sprintf("shared-a-%t-%d", pipelined, run), fmt.Sprintf("shared-b-%t-%d", pipelined, run),
				fmt.Sprintf("shared-c-%t-%d", pipelined, run)
			get := func(path, key string) string {
				return "GET " + path + " HTTP/1.1\r\nhost: shop\r\n" + key + "\r\n"
			}
			post := func(path, key, body string) string {
				return "POST " + path + " HTTP/1.1\r\nhost: shop\r\n" + key + "content-length: " +
					strconv.Itoa(len(body)) + "\r\n\r\n" + body
			}
			exchanges := []exchange{
				{get("/orders/1", "x-api-key: "+a+"\r\n"), 200, "1", false, false},
				{get("/billing/1", ""), 401, "", false, false},
				{post("/orders/new", "x-api-key: "+b+"\r\n", `{"item":1}`), 429, "2", false, false},
				{get("/orders/2", "authorization: Bearer "+a+"\r\n"), 200, "0", false, false},
				{get("/orders/3", "x-api-key: not a key\r\n"), 401, "", false, false},
				{get("/billing/2", "x-api-key: "+a+"\r\n"), 429, "0", true, false},
				{get("/billing/3", "x-api-key: "+c+"\r\n"), 200, "1", false, false},
				{post("/billing/pay", "x-api-key: "+b+"\r\n", "abc"), 200, "1", false, false},
				{get("/orders/4", "x-api-key: "+c+"\r\n"), 200, "0", false, false},
				// Answered within the filter's request-headers call, as
				// Envoy's HTTP/1 codec hands it the headers before it
				// parses the body: a reply to an incomplete request.
				{post("/orders/5", "", "abc"), 401, "", false, true},
			}
			before := s.totalReceived()
			conn, err := net.DialTimeout("tcp", s.gateways[0].Addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			// hangBound for each answer, far above the 5 ms callout.
			conn.SetDeadline(time.Now().Add(time.Duration(len(exchanges)) * hangBound))
			br := bufio.NewReader(conn)
			if pipelined {
				var all strings.Builder
				for _, e := range exchanges {
					all.WriteString(e.request)
				}
				if _, err := io.WriteString(conn, all.String()); err != nil {
					return err
				}
			}
			for i, e := range exchanges {
				if !pipelined {
					if _, err := io.WriteString(conn, e.request); err != nil {
						return fmt.Errorf("request %d: %v", i, err)
					}
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return fmt.Errorf("request %d (%q): no answer on the shared connection: %v", i, e.request, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != e.status {
					return fmt.Errorf("request %d (%q): status %d (%s), want %d", i, e.request, resp.StatusCode, body, e.status)
				}
				if got := resp.Header.Get("ratelimit-remaining"); got != e.remaining {
					return fmt.Errorf("request %d (%q): ratelimit-remaining %q, want %q (its own key's bucket)", i, e.request, got, e.remaining)
				}
				if got := resp.Header.Get("retry-after") != ""; got != e.retry {
					return fmt.Errorf("request %d (%q): retry-after %q, want one: %t", i, e.request, resp.Header.Get("retry-after"), e.retry)
				}
				if problem := resp.Header.Get("content-type") == "application/problem+json"; problem != (e.status != 200) {
					return fmt.Errorf("request %d (%q): %d with content-type %q", i, e.request, resp.StatusCode, resp.Header.Get("content-type"))
				}
				if resp.Close != e.close {
					return fmt.Errorf("request %d (%q): answered %d with connection %q, want close: %t", i, e.request, resp.StatusCode, resp.Header.Get("connection"), e.close)
				}
			}
			for key, want := range map[string]int64{a: 2, b: 1, c: 2} {
				if got := s.received(key); got != want {
					return fmt.Errorf("the services received %d requests of %s, want %d", got, key, want)
				}
			}
			if got := s.totalReceived() - before; got != 5 {
				return fmt.Errorf("the services received %d requests, want 5 (none without a valid key, no denied one)", got)
			}
			return nil
		})
	}
}

// An HTTP/1.0 request gets a 426 before the filter, as Envoy answers one
// when accept_http_10 is off (envoy.yaml leaves it off): nothing charged,
// nothing at a service.
func TestHTTP10RefusedBeforeTheFilter(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	const key = "http10-client"
	st, body := rawRequest(t, s.gateways[0].Addr, "GET /orders/1 HTTP/1.0\r\nhost: shop\r\nx-api-key: "+key+"\r\n")
	if st != http.StatusUpgradeRequired {
		t.Errorf("HTTP/1.0: status %d (%q), want 426", st, body)
	}
	if got := s.received(key); got != 0 {
		t.Errorf("the services received %d HTTP/1.0 requests", got)
	}
	if tokens, err := s.tokens(key); err == nil {
		t.Errorf("the refused request was charged: its bucket holds %v tokens", tokens)
	}
}

// A browser calling the API from another origin with its key in x-api-key
// first sends a CORS preflight, OPTIONS with Origin and
// Access-Control-Request-Method, which carries no key (Fetch). envoy.yaml's
// CORS filter answers every preflight on a route before the rate limiter
// (TestCORSThroughTheGateway); this test is about a proxy without one (the
// chart with no origins renders none, and a mesh's gateway may have none),
// so its gateway runs envoy.yaml without the CORS filter and its policy.
// There a preflight reaches the service uncharged, and a malformed key on
// one does not reach the service. An OPTIONS without
// Access-Control-Request-Method is an ordinary request: 401 without a key,
// charged with one, as a preflight with a key is. (Plan tiny: 2 tokens,
// one back every 1000 s.)
func TestCORSPreflightReachesTheServiceUncharged(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	svc := startRecordingService(t, http.StatusNoContent)
	g := startGatewayOn(t, s, svc.Server, withoutCORS(t))
	preflight := "OPTIONS /orders/1 HTTP/1.1\r\nhost: api\r\nconnection: close\r\n" +
		"origin: https://app.example\r\naccess-control-request-method: POST\r\n" +
		"access-control-request-headers: content-type, x-api-key\r\n"
	for _, extra := range []string{"", "x-api-key: not a key\r\n", ""} {
		if st, body := rawRequest(t, g.Addr, preflight+extra); st != http.StatusNoContent {
			t.Errorf("preflight with %q: %d %s, want the service's 204", extra, st, body)
		}
	}
	for i, h := range svc.requests() {
		if v := h.Values("x-api-key"); len(v) > 0 {
			t.Errorf("preflight %d reached the service with x-api-key %q, which no bucket paid for", i, v)
		}
	}
	stats, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if got := stats[counter("preflight")]; got != 3 {
		t.Errorf("%s = %d, want 3", counter("preflight"), got)
	}
	plain := "OPTIONS /orders/1 HTTP/1.1\r\nhost: api\r\nconnection: close\r\norigin: https://app.example\r\n"
	if st, body := rawRequest(t, g.Addr, plain); st != http.StatusUnauthorized {
		t.Errorf("OPTIONS without Access-Control-Request-Method nor key: %d %s, want 401", st, body)
	}
	// With a key, either is decided: a 204 with the filter's headers (a
	// callout that missed its 5 ms fails open, without them: sent again,
	// up to decidedAttempts times, as another client).
	for _, preflight := range []bool{false, true} {
		for attempt := 1; ; attempt++ {
			req, err := http.NewRequest(http.MethodOptions, "http://"+g.Addr+"/orders/1", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("origin", "https://app.example")
			if preflight {
				req.Header.Set("access-control-request-method", "POST")
			}
			req.Header.Set("x-api-key", fmt.Sprintf("keyed-%t-%d", preflight, attempt))
			resp, err := s.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent && resp.Header.Get("ratelimit-policy") != "" {
				break
			}
			if attempt == decidedAttempts {
				t.Fatalf("OPTIONS with a key (preflight %t): %d without ratelimit-policy %d times, want it charged",
					preflight, resp.StatusCode, attempt)
			}
		}
	}
}

// A page of envoy.yaml's CORS origin (https://app.example.com) can call
// the API from a browser: its preflight is answered by the CORS filter
// before the rate limiter, and every answer, the filter's 401 and 429
// included, carries Access-Control-Allow-Origin and exposes the
// rate-limit fields, so the page reads a 429's Retry-After instead of a
// network error. Another origin's preflight is answered there too,
// without Access-Control-Allow-Origin, so that no request dressed as a
// preflight reaches a service uncharged, and that origin's answers carry
// no CORS header. Every answer on a route but a preflight's, a service's
// and the limiter's, whatever the Origin, carries Vary: Origin, so that a
// shared cache does not hand a page a response made for another origin
// or for none. (Plan tiny: 2 tokens, one back every 1000 s.)
func TestCORSThroughTheGateway(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	svc := startRecordingService(t, http.StatusNoContent)
	g := startGatewayTo(t, s, svc.Server)
	const app = "https://app.example.com"
	send := func(method, origin string, headers ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+g.Addr+"/orders/1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if origin != "" {
			req.Header.Set("origin", origin)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := s.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// Every response of a route says it varies with Origin, whatever the
	// request's Origin, so that a shared cache keeps one per origin: the
	// CORS filter adds Access-Control-Allow-Origin for one origin alone.
	varies := func(what string, resp *http.Response) {
		t.Helper()
		if !slices.Contains(resp.Header.Values("vary"), "Origin") {
			t.Errorf("%s: vary %q, want Origin among them", what, resp.Header.Values("vary"))
		}
	}
	exposed := func(what string, resp *http.Response) {
		t.Helper()
		if got := resp.Header.Get("access-control-allow-origin"); got != app {
			t.Errorf("%s: access-control-allow-origin %q, want %s", what, got, app)
		}
		if got := resp.Header.Get("access-control-expose-headers"); !strings.Contains(got, "retry-after") || !strings.Contains(got, "ratelimit-policy") {
			t.Errorf("%s: access-control-expose-headers %q, want retry-after and the RateLimit fields", what, got)
		}
	}

	resp := send(http.MethodOptions, app, "access-control-request-method", "POST",
		"access-control-request-headers", "x-api-key,content-type")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("preflight of %s: %d, want the CORS filter's 200", app, resp.StatusCode)
	}
	exposed("preflight", resp)
	if got := resp.Header.Get("access-control-allow-headers"); !strings.Contains(got, "x-api-key") {
		t.Errorf("preflight: access-control-allow-headers %q, want x-api-key among them", got)
	}
	if got := resp.Header.Get("access-control-allow-methods"); !strings.Contains(got, "POST") {
		t.Errorf("preflight: access-control-allow-methods %q, want POST among them", got)
	}
	if n := len(svc.requests()); n != 0 {
		t.Errorf("the preflight of an allowed origin reached the service (%d requests)", n)
	}

	resp = send(http.MethodOptions, "https://other.example", "access-control-request-method", "POST")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("access-control-allow-origin") != "" {
		t.Errorf("preflight of another origin: %d, access-control-allow-origin %q; want the CORS filter's 200, none",
			resp.StatusCode, resp.Header.Get("access-control-allow-origin"))
	}
	if n := len(svc.requests()); n != 0 {
		t.Errorf("the preflight of another origin reached the service (%d requests), which no bucket paid for", n)
	}

	if resp = send(http.MethodGet, app); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET without a key: %d, want 401", resp.StatusCode)
	}
	exposed("401", resp)
	varies("401", resp)
	if resp = send(http.MethodGet, "https://other.example"); resp.Header.Get("access-control-allow-origin") != "" {
		t.Errorf("401 to another origin: access-control-allow-origin %q, want none", resp.Header.Get("access-control-allow-origin"))
	}
	varies("401 to another origin", resp)
	varies("401 without Origin", send(http.MethodGet, ""))
	// Spent until denied: 2 tokens, and a callout that misses its 5 ms
	// fails open (admitted, maybe charged), so at most 2 + decidedAttempts
	// requests before the 429.
	for i := 1; ; i++ {
		resp = send(http.MethodGet, app, "x-api-key", "browser")
		exposed(fmt.Sprintf("GET %d (%d)", i, resp.StatusCode), resp)
		varies(fmt.Sprintf("GET %d (%d)", i, resp.StatusCode), resp)
		if resp.StatusCode == http.StatusTooManyRequests {
			if resp.Header.Get("retry-after") == "" {
				t.Error("429: no retry-after")
			}
			break
		}
		if i == 2+decidedAttempts {
			t.Fatalf("no 429 in %d requests on a plan of 2", i)
		}
	}
}

// shippedConfigWith writes envoy.yaml as edit changes it into the test's
// temporary directory and returns the file's path; an edit that changes
// nothing fails the test, naming what it was to change.
func shippedConfigWith(t *testing.T, what string, edit func(string) string) string {
	t.Helper()
	raw, err := os.ReadFile(repoFile(t, "envoy/envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := edit(string(raw))
	if cfg == string(raw) {
		t.Fatalf("envoy.yaml has no %s to change", what)
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// shortIdleConfig is envoy.yaml with a stream_idle_timeout of 0.5 s, not
// 10 s, for tests that wait it out.
func shortIdleConfig(t *testing.T) string {
	t.Helper()
	return shippedConfigWith(t, "stream_idle_timeout: 10s", func(cfg string) string {
		return strings.Replace(cfg, "stream_idle_timeout: 10s", "stream_idle_timeout: 0.5s", 1)
	})
}

// withoutCORS is envoy.yaml without its CORS filter and the virtual host's
// CORS policy.
func withoutCORS(t *testing.T) string {
	t.Helper()
	cut := func(cfg, what string, re *regexp.Regexp, with string) string {
		if !re.MatchString(cfg) {
			t.Fatalf("envoy.yaml has no %s to remove", what)
		}
		return re.ReplaceAllString(cfg, with)
	}
	return shippedConfigWith(t, "CORS filter", func(cfg string) string {
		// From the policy's key to the next key of the virtual host.
		cfg = cut(cfg, "CORS policy", regexp.MustCompile(`(?s)\n {14}typed_per_filter_config:\n {16}envoy\.filters\.http\.cors:\n.*?\n( {14}# First match wins\.)`), "\n$1")
		// The filter's three lines.
		return cut(cfg, "CORS filter", regexp.MustCompile(`\n {10}- name: envoy\.filters\.http\.cors\n {12}typed_config:\n {14}"@type": [^\n]*\.Cors\n`), "\n")
	})
}
