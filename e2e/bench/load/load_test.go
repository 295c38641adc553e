package load

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRunSendsTheSchedule(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{} // client path → count
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Header.Get("x-api-key")+" "+r.URL.Path]++
		mu.Unlock()
		if r.Header.Get("x-api-key") == "b" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	target := strings.TrimPrefix(srv.URL, "http://")
	streams := []Stream{
		// Requests are due at n/rate for n/rate < duration: 100/s for 0.25 s
		// is exactly 25 requests, 40/s for 0.2 s from 0.1 s is 8.
		{Client: "a", Rate: 100, Duration: 250 * time.Millisecond, Paths: []string{"/x", "/y"}},
		{Client: "b", Rate: 40, Start: 100 * time.Millisecond, Duration: 200 * time.Millisecond, Paths: []string{"/z"}},
	}
	res, err := Run(context.Background(), Options{Target: target}, streams)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &res.Streams[0], &res.Streams[1]
	if len(a.Samples) != 25 || a.Count(200) != 25 || len(b.Samples) != 8 || b.Count(429) != 8 {
		t.Fatalf("a: %d samples, %d ok; b: %d samples, %d 429", len(a.Samples), a.Count(200), len(b.Samples), b.Count(429))
	}
	if got["a /x"] != 13 || got["a /y"] != 12 || got["b /z"] != 8 {
		t.Fatalf("server saw %v", got)
	}
	if a.Name != "a" || len(a.Latencies(200)) != 25 || len(a.Latencies(0)) != 25 || len(b.Latencies(200)) != 0 {
		t.Fatalf("latencies or name wrong: %q", a.Name)
	}
	for _, s := range b.Samples {
		if s.Due < 100*time.Millisecond || s.Sent < s.Due || s.Latency <= 0 {
			t.Fatalf("sample %+v: sent before due, or before the stream's start", s)
		}
	}
	var lastDue time.Duration
	for _, s := range b.Samples {
		lastDue = max(lastDue, s.Due)
	}
	if lastDue != 275*time.Millisecond {
		t.Fatalf("b's last request due at %v, want 100 ms + 7/40 s", lastDue)
	}
}

func TestWindow(t *testing.T) {
	r := StreamResult{Samples: []Sample{{Sent: 30}, {Sent: 10}, {Sent: 50}, {Sent: 20}}}
	if w := r.Window(); w != 40 {
		t.Fatalf("Window = %v, want 40ns", w)
	}
	if w := (&StreamResult{}).Window(); w != 0 {
		t.Fatalf("empty Window = %v", w)
	}
}

func TestRunDropsBeyondMaxInFlight(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	// The server holds every request until the schedule is over, so only
	// two can be outstanding: the other eight due are dropped.
	o := Options{Target: strings.TrimPrefix(srv.URL, "http://"), MaxInFlight: 2}
	o.scheduled = func() {
		release <- struct{}{}
		release <- struct{}{}
	}
	res, err := Run(context.Background(), o, []Stream{{Client: "a", Rate: 1000, Duration: 10 * time.Millisecond, Paths: []string{"/"}}})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Streams[0]; len(s.Samples) != 2 || s.Dropped != 8 {
		t.Fatalf("%d samples, %d dropped; want 2 and 8", len(s.Samples), s.Dropped)
	}
}

func TestRunBurstDropsBeyondMaxInFlight(t *testing.T) {
	arrived, release := make(chan struct{}, 5), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	defer srv.Close()
	// One tick (5 senders at 5 requests/s: the next tick is 1 s away, past
	// the window) of five requests, at most three outstanding: the server
	// holds the first three until all have arrived, so the other two are
	// due while three are outstanding, and dropped.
	go func() {
		for range 3 {
			<-arrived
		}
		close(release)
	}()
	res, err := RunBurst(context.Background(), Burst{Targets: []string{strings.TrimPrefix(srv.URL, "http://")}, Client: "a", Path: "/",
		Rate: 5, Window: 100 * time.Millisecond, Senders: 5, MaxInFlight: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 3 || res.Dropped != 2 || res.OK != 3 {
		t.Fatalf("sent %d, dropped %d, ok %d; want 3, 2, 3", res.Sent, res.Dropped, res.OK)
	}
}

// Methods are taken in turn, and each method's 200s are counted apart,
// with those that carried the limiter's decision; those that did not are
// timed.
func TestRunBurstCountsByMethod(t *testing.T) {
	before := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("ratelimit", `"edge";r=9;t=1`)
		case http.MethodDelete:
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	// One tick of six senders: two requests of each method.
	res, err := RunBurst(context.Background(), Burst{Targets: []string{strings.TrimPrefix(srv.URL, "http://")}, Client: "a", Path: "/",
		Rate: 6, Window: 100 * time.Millisecond, Senders: 6, Methods: []string{http.MethodGet, http.MethodPost, http.MethodDelete}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 6 || res.OK != 4 || res.Denied != 2 {
		t.Fatalf("sent %d, ok %d, denied %d; want 6, 4, 2", res.Sent, res.OK, res.Denied)
	}
	if !slices.Equal(res.Methods, []string{http.MethodGet, http.MethodPost, http.MethodDelete}) {
		t.Fatalf("methods %v", res.Methods)
	}
	if !slices.Equal(res.OKBy, []int64{2, 2, 0}) || !slices.Equal(res.Limited, []int64{2, 0, 0}) {
		t.Fatalf("200s by method %v, with a decision %v; want [2 2 0] and [2 0 0]", res.OKBy, res.Limited)
	}
	after := time.Now()
	if len(res.Undecided) != 2 {
		t.Fatalf("%d undecided 200s timed, want the 2 POSTs: %v", len(res.Undecided), res.Undecided)
	}
	for _, sp := range res.Undecided {
		if sp.Sent.Before(before) || sp.Answered.Before(sp.Sent) || sp.Answered.After(after) {
			t.Errorf("undecided request sent %v, answered %v, not within the run (%v to %v)", sp.Sent, sp.Answered, before, after)
		}
	}
}

// NewConnections sends each request on a connection of its own, which
// says connection: close; without it none says so (how many keep-alive
// connections the requests share depends on how fast each is answered).
func TestRunBurstNewConnections(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		var mu sync.Mutex
		conns, closing := map[string]bool{}, 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			conns[r.RemoteAddr] = true
			if r.Close {
				closing++
			}
		}))
		res, err := RunBurst(context.Background(), Burst{Targets: []string{strings.TrimPrefix(srv.URL, "http://")}, Client: "a", Path: "/",
			Rate: 50, Window: 100 * time.Millisecond, NewConnections: fresh})
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		want := 0
		if fresh {
			want = int(res.Sent)
		}
		if res.Sent != 5 || closing != want || fresh && len(conns) != want {
			t.Errorf("new connections %t: %d requests on %d connections, %d with connection: close; want 5, %d with it, each on its own when new",
				fresh, res.Sent, len(conns), closing, want)
		}
		mu.Unlock()
	}
}

func TestRunRejectsBadStreams(t *testing.T) {
	tests := []struct {
		s    []Stream
		want string
	}{
		{nil, "streams: none"},
		{[]Stream{{Name: "x", Rate: 0, Duration: time.Second, Paths: []string{"/"}}}, "stream 0 (x): rate: must be > 0, got 0"},
		{[]Stream{{Name: "x", Rate: 1, Paths: []string{"/"}}}, "stream 0 (x): duration: must be > 0, got 0s"},
		{[]Stream{{Name: "x", Rate: 1, Duration: time.Second, Start: -1, Paths: []string{"/"}}}, "stream 0 (x): start: must be >= 0, got -1ns"},
		{[]Stream{{Name: "x", Rate: 1, Duration: time.Second}}, "stream 0 (x): paths: none"},
	}
	for _, tt := range tests {
		if _, err := Run(context.Background(), Options{Target: "127.0.0.1:1"}, tt.s); err == nil || err.Error() != tt.want {
			t.Errorf("Run(%+v): %v, want %q", tt.s, err, tt.want)
		}
	}
}

func TestClosed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/deny" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	res, err := Closed(context.Background(), strings.TrimPrefix(srv.URL, "http://"), 2, 100*time.Millisecond,
		func(w, i int) (string, string, string) {
			if i%2 == 1 {
				return "GET", "/deny", "k"
			}
			return "GET", "/", "k"
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 || res.ByStatus[200]+res.ByStatus[429] != res.Requests || res.ByStatus[429] == 0 || len(res.Latencies) != res.Requests || res.Rate() <= 0 {
		t.Fatalf("closed loop: %+v", res)
	}
	if _, err := Closed(context.Background(), "x", 0, time.Second, nil); err == nil {
		t.Fatal("0 workers accepted")
	}
}

// A keep-alive connection the server closed while it was idle is found
// closed by the next request, before any answer: the client sends that
// request again on a new connection, so a run does not count as failed a
// request the server never saw. A request that got an answer, whatever its
// status and even one that cannot be read, is not sent again.
func TestClientResendsOnlyOnAConnectionFoundClosed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var paths []string
	var wg sync.WaitGroup
	defer wg.Wait() // after the listener's Close below, which ends Accept
	defer l.Close()
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				// One request a connection, answered without
				// "connection: close", then the connection is closed:
				// the client keeps it as idle and reuses it.
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				mu.Lock()
				paths = append(paths, req.URL.Path)
				mu.Unlock()
				switch req.URL.Path {
				case "/unavailable":
					fmt.Fprint(c, "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
				case "/garbled":
					fmt.Fprint(c, "not an HTTP answer\r\n\r\n")
				default:
					fmt.Fprint(c, "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
				}
			})
		}
	})
	c := NewClient(5 * time.Second)
	defer c.CloseIdleConnections()
	for _, tt := range []struct {
		path string
		want int
	}{{"/first", 200}, {"/second", 200}, {"/unavailable", 503}, {"/garbled", 0}, {"/third", 200}} {
		if tt.path == "/garbled" {
			// On a new connection, so that the one attempt a found-closed
			// connection would take is not what stops a resend.
			c.CloseIdleConnections()
		}
		if got := Get(c, l.Addr().String(), tt.path, "k"); got != tt.want {
			t.Fatalf("GET %s: %d, want %d", tt.path, got, tt.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"/first", "/second", "/unavailable", "/garbled", "/third"}; !slices.Equal(paths, want) {
		t.Fatalf("server read %v, want each request once: %v", paths, want)
	}
}

// TestStaggered: n streams at rate each, started Staggered, send one
// request every 1/(n x rate) s between them, none two at once.
func TestStaggered(t *testing.T) {
	const n, rate = 30, 10.0
	period := time.Duration(float64(time.Second) / rate)
	var due []time.Duration
	for i := 0; i < n; i++ {
		for k := 0; k < 3; k++ {
			due = append(due, Staggered(i, n, rate)+time.Duration(k)*period)
		}
	}
	slices.Sort(due)
	gap := period / n
	for i := 1; i < len(due); i++ {
		if d := due[i] - due[i-1]; d < gap-time.Microsecond || d > gap+time.Microsecond {
			t.Fatalf("requests %d and %d due %v apart, want %v (1/(%d x %g/s))", i-1, i, d, gap, n, rate)
		}
	}
}
