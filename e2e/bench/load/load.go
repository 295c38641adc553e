// Package load sends the benchmarks' traffic: open-loop streams, each a
// client sending at a fixed rate whatever the answers, and a closed loop
// that sends as fast as answers come back.
//
// Open loop is what real clients do and what latency must be measured
// under: a request's latency runs from the moment it was due to be sent, so
// a generator that falls behind (a stalled machine, a slow answer hogging a
// connection) shows up as latency instead of silently sending less.
package load

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Stream is one client's traffic in an open-loop run.
type Stream struct {
	Name     string        // label in results; defaults to Client
	Client   string        // sent as x-api-key; "" sends none
	Rate     float64       // requests per second; > 0
	Start    time.Duration // offset from the run's start
	Duration time.Duration // how long it sends; > 0
	Paths    []string      // taken in turn; at least one
	Method   string        // defaults to GET
}

// Staggered is the Start of the i-th of n streams that each send at rate
// per second, so that together their requests come evenly, one every
// 1/(n × rate) s, rather than n at once: independent clients do not send
// in step, and n requests due together queue behind each other on a
// small machine, a latency no client would see.
func Staggered(i, n int, rate float64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / (float64(n) * rate))
}

// Options shape a run.
type Options struct {
	Target string // host:port every request goes to
	// MaxInFlight bounds the requests outstanding at once; a request due
	// while it is reached is counted Dropped, not sent late. Defaults to
	// DefaultMaxInFlight.
	MaxInFlight int
	// Timeout bounds one request. Defaults to 10 s.
	Timeout time.Duration
	// Progress, if set, is called about every 500 ms with the time elapsed
	// and the requests sent so far.
	Progress func(elapsed time.Duration, sent int64)

	scheduled func() // called once every request has been sent or dropped (tests)
}

// Sample is one answered or failed request.
type Sample struct {
	Due     time.Duration // when it was due, from the run's start
	Sent    time.Duration // when it left
	Latency time.Duration // from Due to the end of the answer
	Status  int           // HTTP status; 0 when the request failed
	Path    int           // index into the stream's Paths
}

// StreamResult is what one stream saw.
type StreamResult struct {
	Stream
	Samples []Sample // in the order they completed
	Dropped int      // due while MaxInFlight requests were outstanding
}

// Count returns how many samples had status code (0: failed requests).
func (r *StreamResult) Count(code int) int {
	n := 0
	for _, s := range r.Samples {
		if s.Status == code {
			n++
		}
	}
	return n
}

// Latencies returns the latencies of the samples with status code, or of
// every answered sample when code is 0.
func (r *StreamResult) Latencies(code int) []time.Duration {
	var out []time.Duration
	for _, s := range r.Samples {
		if (code == 0 && s.Status != 0) || (code != 0 && s.Status == code) {
			out = append(out, s.Latency)
		}
	}
	return out
}

// Window returns the time between the first and the last request sent.
func (r *StreamResult) Window() time.Duration {
	if len(r.Samples) == 0 {
		return 0
	}
	first, last := r.Samples[0].Sent, r.Samples[0].Sent
	for _, s := range r.Samples {
		first, last = min(first, s.Sent), max(last, s.Sent)
	}
	return last - first
}

// Result is an open-loop run.
type Result struct {
	Streams []StreamResult
	Elapsed time.Duration
}

// Client sends load: keep-alive connections, as many as the requests in
// flight need.
//
// It is fasthttp's client, which writes a request and reads its answer on
// the sender's own goroutine. net/http's hands each request to a
// connection's writing goroutine and the answer back from its reading one,
// and on the 2-CPU machines the benchmarks run on the generator shares the
// CPUs with what it measures: every handoff is CPU the gateway, the
// sidecar and Redis wait behind.
type Client struct {
	c       *fasthttp.Client
	timeout time.Duration
}

// NewClient returns a Client whose requests each end after timeout at
// most, the wait for a connection included.
func NewClient(timeout time.Duration) *Client { return newClient(timeout, DefaultMaxInFlight) }

// newClient is NewClient for at most conns requests in flight to a target.
func newClient(timeout time.Duration, conns int) *Client {
	return &Client{timeout: timeout, c: &fasthttp.Client{
		// The run bounds the requests in flight: one never waits for a
		// connection here.
		MaxConnsPerHost:     max(conns, 1),
		MaxIdleConnDuration: 30 * time.Second,
		// The connection used last goes out first, as with net/http's
		// client: at a rate that needs few connections the same few carry
		// it, where fasthttp's default (the oldest first) would take each
		// connection opened by a burst in turn.
		ConnPoolStrategy: fasthttp.LIFO,
		// A request is sent again only when the connection it went out on
		// turned out closed before any of its answer came (a keep-alive
		// connection the server had closed), as net/http's client does:
		// any other retry would be a request the run did not count.
		MaxIdemponentCallAttempts: 2,
		RetryIfErr:                func(_ *fasthttp.Request, _ int, err error) (bool, bool) { return false, closedUnanswered(err) },
		NoDefaultUserAgentHeader:  true,
	}}
}

// closedUnanswered reports whether err is a connection found closed before
// any byte of the answer was read.
func closedUnanswered(err error) bool {
	var nothing fasthttp.ErrNothingRead
	return errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed) || errors.As(err, &nothing) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// CloseIdleConnections closes the connections no request is using.
func (c *Client) CloseIdleConnections() { c.c.CloseIdleConnections() }

// check validates the streams, naming the bad one.
func check(streams []Stream) error {
	if len(streams) == 0 {
		return fmt.Errorf("streams: none")
	}
	for i, s := range streams {
		switch {
		case !(s.Rate > 0):
			return fmt.Errorf("stream %d (%s): rate: must be > 0, got %v", i, s.Name, s.Rate)
		case s.Duration <= 0:
			return fmt.Errorf("stream %d (%s): duration: must be > 0, got %v", i, s.Name, s.Duration)
		case s.Start < 0:
			return fmt.Errorf("stream %d (%s): start: must be >= 0, got %v", i, s.Name, s.Start)
		case len(s.Paths) == 0:
			return fmt.Errorf("stream %d (%s): paths: none", i, s.Name)
		}
	}
	return nil
}

// due is the next request of one stream.
type due struct {
	at     time.Duration
	stream int
	n      int // how many the stream has sent
}

type schedule []due

func (s schedule) Len() int           { return len(s) }
func (s schedule) Less(i, j int) bool { return s[i].at < s[j].at }
func (s schedule) Swap(i, j int)      { s[i], s[j] = s[j], s[i] }
func (s *schedule) Push(x any)        { *s = append(*s, x.(due)) }
func (s *schedule) Pop() any {
	old := *s
	x := old[len(old)-1]
	*s = old[:len(old)-1]
	return x
}

// Run sends every stream's requests at its rate, open loop, and waits for
// the answers. It stops sending early, with what it has, when ctx ends;
// the requests already sent run to their answers or their timeout.
func Run(ctx context.Context, o Options, streams []Stream) (*Result, error) {
	if err := check(streams); err != nil {
		return nil, err
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	client := newClient(o.Timeout, o.MaxInFlight)
	defer client.CloseIdleConnections()

	res := &Result{Streams: make([]StreamResult, len(streams))}
	mu := make([]sync.Mutex, len(streams))
	sched := make(schedule, 0, len(streams))
	for i, s := range streams {
		if s.Name == "" {
			streams[i].Name = s.Client
		}
		if s.Method == "" {
			streams[i].Method = http.MethodGet
		}
		res.Streams[i].Stream = streams[i]
		sched = append(sched, due{at: s.Start, stream: i})
	}
	heap.Init(&sched)

	slots := make(chan struct{}, o.MaxInFlight)
	var wg sync.WaitGroup
	var sent atomic.Int64
	start := time.Now()
	stopProgress := progress(o.Progress, start, &sent)
	defer stopProgress()

	for sched.Len() > 0 && ctx.Err() == nil {
		d := sched[0]
		if wait := d.at - time.Since(start); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				continue
			}
		}
		heap.Pop(&sched)
		s := &streams[d.stream]
		if next := d.n + 1; float64(next)/s.Rate < s.Duration.Seconds() {
			heap.Push(&sched, due{at: s.Start + time.Duration(float64(next)/s.Rate*float64(time.Second)), stream: d.stream, n: next})
		}
		select {
		case slots <- struct{}{}:
		default:
			mu[d.stream].Lock()
			res.Streams[d.stream].Dropped++
			mu[d.stream].Unlock()
			continue
		}
		sent.Add(1)
		wg.Add(1)
		go func(d due) {
			defer wg.Done()
			defer func() { <-slots }()
			s := &streams[d.stream]
			p := d.n % len(s.Paths)
			sentAt := time.Since(start)
			status := send(client, o.Target, s.Method, s.Paths[p], s.Client)
			sm := Sample{Due: d.at, Sent: sentAt, Latency: time.Since(start) - d.at, Status: status, Path: p}
			mu[d.stream].Lock()
			res.Streams[d.stream].Samples = append(res.Streams[d.stream].Samples, sm)
			mu[d.stream].Unlock()
		}(d)
	}
	if o.scheduled != nil {
		o.scheduled()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, ctx.Err()
}

// Get sends one GET of path to target as client key (none if "") with c,
// and reads the answer to the end: its status, 0 when it failed.
func Get(c *Client, target, path, key string) int {
	return send(c, target, http.MethodGet, path, key)
}

// send makes one request and reads its answer to the end; 0 on failure.
func send(c *Client, target, method, path, key string) int {
	status, _ := sendDecided(c, target, method, path, key, false)
	return status
}

// sendDecided is send, and tells whether the answer carried the limiter's
// RateLimit header (the field it adds to every answer it decided). With
// closeConn the request says connection: close, and its connection is
// closed after the answer.
func sendDecided(c *Client, target, method, path, key string, closeConn bool) (status int, decided bool) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	if closeConn {
		req.SetConnectionClose()
	}
	req.SetRequestURI("http://" + target + path)
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	if err := c.c.DoTimeout(req, resp, c.timeout); err != nil {
		return 0, false
	}
	return resp.StatusCode(), resp.Header.Peek("ratelimit") != nil
}

func progress(f func(time.Duration, int64), start time.Time, sent *atomic.Int64) (stop func()) {
	if f == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f(time.Since(start), sent.Load())
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// ClosedResult is a closed-loop run.
type ClosedResult struct {
	Requests  int
	ByStatus  map[int]int // 0: failed requests
	Elapsed   time.Duration
	Latencies []time.Duration
}

// Rate returns the requests answered per second.
func (r *ClosedResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests-r.ByStatus[0]) / r.Elapsed.Seconds()
}

// Closed runs workers loops for d, each sending its next request as soon as
// the previous one is answered: the most the target can serve at that
// concurrency. next builds worker w's i-th request.
func Closed(ctx context.Context, target string, workers int, d time.Duration, next func(w, i int) (method, path, key string)) (*ClosedResult, error) {
	if workers < 1 {
		return nil, fmt.Errorf("workers: must be >= 1, got %d", workers)
	}
	client := newClient(10*time.Second, workers)
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	res := &ClosedResult{ByStatus: map[int]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			by := map[int]int{}
			for i := 0; ctx.Err() == nil; i++ {
				m, p, k := next(w, i)
				t := time.Now()
				st := send(client, target, m, p, k)
				lat = append(lat, time.Since(t))
				by[st]++
			}
			mu.Lock()
			for k, v := range by {
				res.ByStatus[k] += v
				res.Requests += v
			}
			res.Latencies = append(res.Latencies, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, nil
}

// Burst is one client's traffic at a total rate, over several targets (the
// gateways) in turn.
type Burst struct {
	Targets []string // host:port, taken in turn; at least one
	Client  string   // sent as x-api-key
	Path    string
	// Methods are the requests' methods, taken in turn (the first request
	// the first, and so on); empty: every request a GET.
	Methods []string
	Rate    float64       // requests per second in total; > 0
	Window  time.Duration // how long it sends; > 0
	// Senders > 0 fire together: every tick each of them sends one request
	// at once, the ticks spaced so that the total is Rate. 0 is an open
	// loop: requests evenly spaced at Rate, each sent whatever the answers.
	Senders int
	// MaxInFlight bounds the requests outstanding at once (each on a
	// connection of its own); a request due while it is reached is
	// counted Dropped, not sent. 0 is DefaultMaxInFlight.
	MaxInFlight int
	// NewConnections sends each request on a connection of its own,
	// closed after its answer (connection: close), as an SDK that opens
	// a connection per request does; false reuses keep-alive
	// connections.
	NewConnections bool
}

// BurstResult counts what the client saw.
type BurstResult struct {
	Sent, OK, Denied, Other int64
	// Methods are the methods sent, Burst.Methods or GET alone. OKBy counts
	// the 200s by method, in that order, and Limited those of them that
	// carried a decision of the limiter's (its RateLimit header): a 200
	// without one went through undecided, as a request that failed open
	// does.
	Methods       []string
	OKBy, Limited []int64
	// Undecided are the 200s without the limiter's decision, each from
	// when it was sent to when its answer was read, in the order they
	// were answered.
	Undecided Spans
	// Dropped were due while MaxInFlight requests were outstanding, and
	// not sent: the target was that far behind.
	Dropped int64
	Window  time.Duration // first to last request sent
}

// Span is a request's time on the wire: from its send to its answer.
type Span struct{ Sent, Answered time.Time }

// Spans are requests' times on the wire.
type Spans []Span

// During counts the requests for whose wait stalled reports true.
func (s Spans) During(stalled func(from, to time.Time) bool) int64 {
	var n int64
	for _, r := range s {
		if stalled(r.Sent, r.Answered) {
			n++
		}
	}
	return n
}

// DefaultMaxInFlight is a run's and a Burst's MaxInFlight when none is
// given: past it the target is seconds behind at any rate the machine can
// offer, and the process would run out of file descriptors.
const DefaultMaxInFlight = 4096

// RunBurst sends b and waits for every answer.
func RunBurst(ctx context.Context, b Burst) (BurstResult, error) {
	switch {
	case len(b.Targets) == 0:
		return BurstResult{}, fmt.Errorf("targets: none")
	case !(b.Rate > 0):
		return BurstResult{}, fmt.Errorf("rate: must be > 0, got %v", b.Rate)
	case b.Window <= 0:
		return BurstResult{}, fmt.Errorf("window: must be > 0, got %v", b.Window)
	case b.Senders < 0:
		return BurstResult{}, fmt.Errorf("senders: must be >= 0, got %d", b.Senders)
	case b.MaxInFlight < 0:
		return BurstResult{}, fmt.Errorf("max in flight: must be >= 0, got %d", b.MaxInFlight)
	}
	if b.MaxInFlight == 0 {
		b.MaxInFlight = DefaultMaxInFlight
	}
	var res BurstResult
	res.Methods = b.Methods
	if len(res.Methods) == 0 {
		res.Methods = []string{http.MethodGet}
	}
	methods := res.Methods
	client := newClient(10*time.Second, b.MaxInFlight)
	defer client.CloseIdleConnections()
	var ok, denied, other atomic.Int64
	okBy, limited := make([]atomic.Int64, len(methods)), make([]atomic.Int64, len(methods))
	var undecidedMu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, b.MaxInFlight)
	batch := max(b.Senders, 1)
	interval := time.Duration(float64(time.Second) * float64(batch) / b.Rate)
	start := time.Now()
	var last time.Time
	for tick := 0; ctx.Err() == nil; tick++ {
		due := start.Add(time.Duration(tick) * interval)
		if due.Sub(start) >= b.Window {
			break
		}
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		last = time.Now()
		for range batch {
			select {
			case slots <- struct{}{}:
			default:
				res.Dropped++
				continue
			}
			target := b.Targets[res.Sent%int64(len(b.Targets))]
			m := int(res.Sent % int64(len(methods)))
			res.Sent++
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				sent := time.Now()
				status, decided := sendDecided(client, target, methods[m], b.Path, b.Client, b.NewConnections)
				switch status {
				case http.StatusOK:
					ok.Add(1)
					okBy[m].Add(1)
					if decided {
						limited[m].Add(1)
						break
					}
					span := Span{sent, time.Now()}
					undecidedMu.Lock()
					res.Undecided = append(res.Undecided, span)
					undecidedMu.Unlock()
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	res.OK, res.Denied, res.Other = ok.Load(), denied.Load(), other.Load()
	for i := range methods {
		res.OKBy = append(res.OKBy, okBy[i].Load())
		res.Limited = append(res.Limited, limited[i].Load())
	}
	res.Window = last.Sub(start)
	return res, ctx.Err()
}
