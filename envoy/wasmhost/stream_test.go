package wasmhost

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var getReq = []Header{{":method", "GET"}, {":path", "/orders/1"}, {":authority", "shop"}, {":scheme", "http"}, {"A", "1"}, {"a", "2"}}

// grpcReq is a gRPC call as a client sends it.
var grpcReq = []Header{{":method", "POST"}, {":path", "/orders.v1.Orders/Get"}, {":authority", "shop"}, {":scheme", "http"}, {"content-type", "application/grpc"}, {"te", "trailers"}}

const callout = "call sidecar :method=POST,:path=/v1/check,:authority=rl - 100;return 1"

func newStream(t *testing.T, vm *probeVM) *Stream {
	t.Helper()
	s, err := vm.NewStream(StreamInfo{SourceAddr: "127.0.0.1:5555", DestinationAddr: "127.0.0.1:8080", Protocol: "HTTP/1.1"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStreamHeaderMaps(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	err := vm.Configure(script(map[string]string{"request_headers": "get 0 a;get 0 A;get 0 missing;pairs 0;size 0;" +
		"add 0 X-Added yes;replace 0 :path /new;replace 0 x-new n;remove 0 absent;remove 0 a;get 0 a;" +
		"setpairsraw 1 00;get 1 x;get 2 x;get 6 x;add 6 a b"}))
	if err != nil {
		t.Fatal(err)
	}
	s := newStream(t, vm)
	st, err := s.RequestHeaders(getReq, true)
	if err != nil || st != Continued {
		t.Fatalf("RequestHeaders = %v, %v", st, err)
	}
	checkLines(t, vm.logs, []string{"request_headers n=6 eos=1", "get=0 value=1", "get=0 value=1", "get=1 value=",
		"pairs=0 ptr0=false pairs=:method=GET,:path=%2Forders%2F1,:authority=shop,:scheme=http,a=1,a=2", "size=0 size=53",
		"add=0", "replace=0", "replace=0", "remove=0", "remove=0", "get=1 value=",
		"setpairsraw=2", "get=2 value=", "get=2 value=", "get=2 value=", "add=2"})
	// Replace removes every value and adds one; pseudo-headers stay ahead
	// of the others, as in Envoy's header list.
	want := []Header{{":method", "GET"}, {":authority", "shop"}, {":scheme", "http"}, {":path", "/new"}, {"x-added", "yes"}, {"x-new", "n"}}
	if got := s.UpstreamHeaders(); !slices.Equal(got, want) {
		t.Errorf("upstream headers %q, want %q", got, want)
	}
}

func TestMalformedPairsBecomeAnEmptyMap(t *testing.T) {
	cases := map[string]string{
		"truncated":        "0100000001000000",
		"no NUL":           "01000000010000000100000061ff62ff",
		"trailing byte":    "0100000001000000010000006100620000",
		"too many pairs":   "01040000",
		"valid, two pairs": "0200000001000000010000000100000000000000610062006300" + "00",
	}
	want := map[string]string{
		"truncated": "", "no NUL": "", "trailing byte": "", "too many pairs": "", "valid, two pairs": "a=b,c=",
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			vm := newProbeVM(t, PollSleep, Options{})
			if err := vm.Configure(script(map[string]string{"request_headers": "setpairsraw 0 " + raw + ";pairs 0"})); err != nil {
				t.Fatal(err)
			}
			s := newStream(t, vm)
			s.RequestHeaders(getReq, true)
			ptr0 := "true"
			if want[name] != "" {
				ptr0 = "false"
			}
			checkLines(t, vm.logs, []string{"setpairsraw=0", "pairs=0 ptr0=" + ptr0 + " pairs=" + want[name]})
		})
	}
	big := make([]Header, 1025)
	for i := range big {
		big[i] = Header{"k", "v"}
	}
	if DecodePairs(EncodePairs(big)) != nil {
		t.Error("a map of 1025 pairs decoded")
	}
	if got := DecodePairs(EncodePairs(big[:1024])); len(got) != 1024 {
		t.Errorf("a map of 1024 pairs decoded to %d", len(got))
	}
}

// pausedStream sets up a VM whose request_headers make a callout and pause,
// with the given callback script, and returns it with a paused stream.
func pausedStream(t *testing.T, o Options, phases map[string]string) (*probeVM, *fakeDispatcher, *Stream) {
	t.Helper()
	d := newFakeDispatcher("sidecar")
	o.Dispatcher = d
	vm := newProbeVM(t, PollSleep, o)
	if phases["request_headers"] == "" {
		phases["request_headers"] = callout
	}
	if err := vm.Configure(script(phases)); err != nil {
		t.Fatal(err)
	}
	s := newStream(t, vm)
	st, err := s.RequestHeaders(getReq, true)
	if err != nil || st != Paused {
		t.Fatalf("RequestHeaders = %v, %v; want paused", st, err)
	}
	return vm, d, s
}

func respond200(t *testing.T, vm *probeVM, d *fakeDispatcher) {
	t.Helper()
	d.last(t).respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
	vm.Sync()
}

func TestPausedStreamResumes(t *testing.T) {
	vm, d, s := pausedStream(t, Options{}, map[string]string{
		"http_call_response": "effective stream;add 0 x-decision allow;continue 0;get 0 :path"})
	if st := s.State(); st != Paused {
		t.Fatalf("state %v before the response", st)
	}
	respond200(t, vm, d)
	st, err := s.Wait(context.Background())
	if err != nil || st != Continued {
		t.Fatalf("Wait = %v, %v", st, err)
	}
	// continue_stream takes the request headers away at once.
	checkLines(t, vm.logs, []string{"effective=0", "add=0", "continue=0", "get=2 value="})
	if v := firstValue(s.UpstreamHeaders(), "x-decision"); v != "allow" {
		t.Errorf("x-decision %q upstream", v)
	}
}

func TestLocalReplies(t *testing.T) {
	cases := []struct {
		name       string
		phases     map[string]string
		respond    bool
		wantStatus int
		wantHdrs   []Header
		wantBody   string
		wantLines  []string
		req        []Header // nil: getReq
	}{
		{"from the callback, through on_response_headers",
			map[string]string{"http_call_response": "effective stream;local 429 rate%20limited slow%20down retry-after=3,X-Up=1 -1",
				"response_headers": "add 2 x-seen-by-plugin yes"},
			true, 429,
			[]Header{{":status", "429"}, {"retry-after", "3"}, {"x-up", "1"}, {"content-length", "9"}, {"content-type", "text/plain"}, {"x-seen-by-plugin", "yes"}},
			"slow down", []string{"local=0", "response_headers n=5 eos=0", "add=0"}, nil},
		{"deferred until on_request_headers returns, then it stops",
			map[string]string{"request_headers": "local 403 - - - -1;get 0 :path;return 0"},
			false, 403, []Header{{":status", "403"}}, "", []string{"local=0", "get=0 value=%2Forders%2F1", "response_headers n=1 eos=1"}, nil},
		{"empty body drops content headers",
			map[string]string{"request_headers": "local 401 - - content-length=5,content-type=x -1"},
			false, 401, []Header{{":status", "401"}}, "", nil, nil},
		// A gRPC request's local reply is the trailers-only response Envoy
		// makes of it (Http::Utility::prepareLocalReply): 200, the plugin's
		// headers, content-type application/grpc, grpc-status (without one
		// from the plugin, the HTTP status mapped: 429 is UNAVAILABLE) and
		// the body as grpc-message; no body, end of stream with the headers.
		{"a gRPC request's, a trailers-only 200 with the status mapped",
			map[string]string{"request_headers": "local 429 rate%20limited slow%2520down retry-after=3,content-type=application/problem%2Bjson -1",
				"response_headers": "add 2 x-seen-by-plugin yes"},
			false, 200,
			[]Header{{":status", "200"}, {"retry-after", "3"}, {"content-type", "application/grpc"}, {"grpc-status", "14"}, {"grpc-message", "slow%2520down"}, {"x-seen-by-plugin", "yes"}},
			"", []string{"local=0", "response_headers n=5 eos=1", "add=0"}, grpcReq},
		{"a gRPC request's with the plugin's gRPC status",
			map[string]string{"request_headers": "local 429 - - - 8"},
			false, 200, []Header{{":status", "200"}, {"content-type", "application/grpc"}, {"grpc-status", "8"}}, "", nil,
			append(slices.Clone(grpcReq[:4]), Header{"content-type", "application/grpc+proto"})},
		{"a gRPC-Web request's is an HTTP reply",
			map[string]string{"request_headers": "local 429 - - - 8"},
			false, 429, []Header{{":status", "429"}}, "", nil,
			append(slices.Clone(grpcReq[:4]), Header{"content-type", "application/grpc-web"})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newFakeDispatcher("sidecar")
			vm := newProbeVM(t, PollSleep, Options{Dispatcher: d})
			if c.phases["request_headers"] == "" {
				c.phases["request_headers"] = callout
			}
			if err := vm.Configure(script(c.phases)); err != nil {
				t.Fatal(err)
			}
			s := newStream(t, vm)
			req := getReq
			if c.req != nil {
				req = c.req
			}
			st, _ := s.RequestHeaders(req, true)
			if c.respond {
				if st != Paused {
					t.Fatalf("state %v before the response", st)
				}
				respond200(t, vm, d)
			}
			if st, _ := s.Wait(context.Background()); st != Replied {
				t.Fatalf("state %v, want replied", st)
			}
			r, _ := s.LocalReply()
			if r.Status != c.wantStatus || !slices.Equal(r.Headers, c.wantHdrs) || string(r.Body) != c.wantBody {
				t.Errorf("reply %d %q %q; want %d %q %q", r.Status, r.Headers, r.Body, c.wantStatus, c.wantHdrs, c.wantBody)
			}
			checkLines(t, vm.logs, c.wantLines)
		})
	}
}

func TestCallbackWithoutEffectiveContextCannotTouchTheStream(t *testing.T) {
	vm, d, s := pausedStream(t, Options{}, map[string]string{
		"http_call_response": "add 0 x y;local 429 - - - -1;continue 0", "tick": "add 0 x y"})
	respond200(t, vm, d)
	if st := s.State(); st != Paused {
		t.Errorf("state %v: the root context's calls reached the stream", st)
	}
	checkLines(t, vm.logs, []string{"add=2", "local=0", "continue=0"})
	// The effective context lasts one call only.
	vm2, d2, s2 := pausedStream(t, Options{ManualTicks: true}, map[string]string{
		"http_call_response": "effective stream", "tick": "add 0 x y"})
	respond200(t, vm2, d2)
	vm2.Tick()
	checkLines(t, vm2.logs, []string{"effective=0", "add=2"})
	_ = s2
}

func TestCloseStreamResets(t *testing.T) {
	vm, d, s := pausedStream(t, Options{}, map[string]string{"http_call_response": "effective stream;close 0"})
	respond200(t, vm, d)
	if st, _ := s.Wait(context.Background()); st != Reset {
		t.Errorf("state %v, want reset", st)
	}
}

func TestResponseHeadersAndLifecycle(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	err := vm.Configure(script(map[string]string{
		"request_headers":  "log 2 REQ",
		"response_headers": "get 0 :path;add 2 x-r 1;get 2 :status;add 0 late 1;replace 0 :path /late",
		"log":              "log 2 LOG;get 0 :path;get 2 x-r;add 0 a b;get 6 x;pairs 2;replace 2 content-type x",
		"done":             "log 2 DONE",
		"delete":           "log 2 DELETE",
	}))
	if err != nil {
		t.Fatal(err)
	}
	s := newStream(t, vm)
	s.RequestHeaders(getReq, true)
	upstream := s.UpstreamHeaders()
	st, out, err := s.ResponseHeaders([]Header{{":status", "200"}, {"Content-Type", "text/plain"}}, false)
	if err != nil || st != Continued {
		t.Fatalf("ResponseHeaders = %v, %v", st, err)
	}
	want := []Header{{":status", "200"}, {"content-type", "text/plain"}, {"x-r", "1"}}
	if !slices.Equal(out, want) {
		t.Errorf("response headers %q, want %q", out, want)
	}
	s.Done()
	s.Done() // a second Done does nothing
	// The request headers went upstream as they were when the request
	// continued: the plugin's later tries to change them were refused
	// (add=2 and replace=2 in on_response_headers, add=2 in on_log) and
	// changed nothing.
	if got := s.UpstreamHeaders(); !slices.Equal(got, upstream) {
		t.Errorf("upstream headers after the stream %q, want %q as the request continued", got, upstream)
	}
	checkLines(t, vm.logs, []string{"log=0", "response_headers n=2 eos=0", "get=2 value=", "add=0", "get=0 value=200", "add=2", "replace=2",
		"log=0", "get=0 value=%2Forders%2F1", "get=0 value=1", "add=2", "get=1 value=",
		"pairs=0 ptr0=false pairs=:status=200,content-type=text%2Fplain,x-r=1", "replace=2", "log=0", "log=0"})
	var order []string
	for _, l := range vm.logs.all() {
		if l == "info REQ" || l == "info LOG" || l == "info DONE" || l == "info DELETE" {
			order = append(order, strings.TrimPrefix(l, "info "))
		}
	}
	if strings.Join(order, ",") != "REQ,LOG,DONE,DELETE" {
		t.Errorf("lifecycle order %v", order)
	}

	// The response headers ResponseHeadersWait returns are the stream's
	// own, uncopied: they stay as they were when the response continued,
	// the plugin's replace in on_log refused.
	s2 := vm.OpenStream(StreamInfo{})
	if st, err := s2.RequestHeadersWait(context.Background(), getReq, true); err != nil || st != Continued {
		t.Fatalf("RequestHeadersWait = %v, %v", st, err)
	}
	st, out, err = s2.ResponseHeadersWait(context.Background(), []Header{{":status", "200"}, {"Content-Type", "text/plain"}}, false)
	if err != nil || st != Continued || !slices.Equal(out, want) {
		t.Fatalf("ResponseHeadersWait = %v, %q, %v; want Continued, %q", st, out, err, want)
	}
	s2.Done()
	if !slices.Equal(out, want) {
		t.Errorf("response headers after the stream %q, want %q as the response continued", out, want)
	}
}

func TestPausedResponseResumes(t *testing.T) {
	d := newFakeDispatcher("sidecar")
	vm := newProbeVM(t, PollSleep, Options{Dispatcher: d})
	err := vm.Configure(script(map[string]string{
		"response_headers":   "call sidecar :method=GET,:path=/,:authority=a - 0;return 1",
		"http_call_response": "effective stream;add 2 x-late 1;continue 1",
	}))
	if err != nil {
		t.Fatal(err)
	}
	s := newStream(t, vm)
	s.RequestHeaders(getReq, true)
	st, _, _ := s.ResponseHeaders([]Header{{":status", "200"}}, true)
	if st != Paused {
		t.Fatalf("response state %v", st)
	}
	respond200(t, vm, d)
	if st, _ := s.Wait(context.Background()); st != Continued {
		t.Fatalf("state %v", st)
	}
	if v := firstValue(s.ResponseHeadersOut(), "x-late"); v != "1" {
		t.Errorf("x-late %q", v)
	}
}

func TestFailedVM(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		name := "fail closed"
		if failOpen {
			name = "fail open"
		}
		t.Run(name, func(t *testing.T) {
			vm, d, paused := pausedStream(t, Options{FailOpen: failOpen}, map[string]string{
				"http_call_response": "panic boom"})
			respond200(t, vm, d)
			if !vm.Failed() || !strings.Contains(vm.Err().Error(), "proxy_on_http_call_response") {
				t.Fatalf("VM not failed after a panic: %v", vm.Err())
			}
			if !vm.logs.contains("error panic: ") || !vm.logs.contains("error boom") {
				t.Error("the module's panic message did not reach the log")
			}
			// A new stream gets what a failed VM gives it.
			fresh := newStream(t, vm)
			fresh.RequestHeaders(getReq, true)
			st, _ := fresh.Wait(context.Background())
			if failOpen {
				if st != Continued || len(fresh.UpstreamHeaders()) == 0 {
					t.Errorf("fail open: state %v", st)
				}
			} else if r, ok := fresh.LocalReply(); st != Replied || !ok || r.Status != 503 || r.Details != "wasm_fail_stream" {
				t.Errorf("fail closed: state %v reply %+v", st, r)
			}
			if !failOpen {
				// A gRPC call gets Envoy's gRPC form of the 503: a
				// trailers-only 200 with UNAVAILABLE.
				g := newStream(t, vm)
				g.RequestHeaders(grpcReq, true)
				g.Wait(context.Background())
				want := []Header{{":status", "200"}, {"content-type", "application/grpc"}, {"grpc-status", "14"}}
				if r, ok := g.LocalReply(); !ok || r.Status != 200 || !slices.Equal(r.Headers, want) || len(r.Body) != 0 {
					t.Errorf("fail closed, gRPC call: reply %+v, want %v", r, want)
				}
				g.Done()
			}
			// The stream that was waiting for its callback is sent nothing
			// more, as in Envoy: it waits for the proxy's stream idle
			// timeout. (The VM runs its tasks in order, so the new stream's
			// answer means the failure was handled.)
			if st := paused.State(); st != Paused {
				t.Errorf("the stream paused when the VM failed: %v, want still Paused", st)
			}
			// A failed VM is left alone from then on.
			st, hdrs, _ := fresh.ResponseHeaders([]Header{{":status", "200"}}, true)
			fresh.Done()
			if failOpen && (st != Continued || len(hdrs) != 1) {
				t.Errorf("response through a failed VM: %v %q", st, hdrs)
			}
		})
	}
}

func TestTrapInOnRequestHeaders(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(script(map[string]string{"request_headers": "panic in-headers"})); err != nil {
		t.Fatal(err)
	}
	s := newStream(t, vm)
	st, err := s.RequestHeaders(getReq, true)
	if err != nil || st != Replied {
		t.Fatalf("RequestHeaders = %v, %v", st, err)
	}
	if r, _ := s.LocalReply(); r.Status != 503 {
		t.Errorf("reply %d", r.Status)
	}
}

// TestCalloutsHammer pauses many streams on one VM and answers their
// callouts concurrently from many goroutines: every stream resumes.
func TestCalloutsHammer(t *testing.T) {
	vm, d, first := pausedStream(t, Options{}, map[string]string{
		"http_call_response": "effective caller;add 0 x-token ok;continue 0"})
	const n = 200
	streams := []*Stream{first}
	for i := 1; i < n; i++ {
		s := newStream(t, vm)
		if st, _ := s.RequestHeaders(getReq, true); st != Paused {
			t.Fatalf("stream %d: %v", i, st)
		}
		streams = append(streams, s)
	}
	calls := d.all()
	if len(calls) != n {
		t.Fatalf("%d calls for %d streams", len(calls), n)
	}
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			calls[i].respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s := streams[i]
			if st, err := s.Wait(ctx); st != Continued || firstValue(s.UpstreamHeaders(), "x-token") != "ok" {
				errs <- st.String() + " " + errString(err)
			}
			s.Done()
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if p := vm.PendingCalls(); p != 0 {
		t.Errorf("%d calls still pending", p)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestCloseEndsWaitingStreams(t *testing.T) {
	vm, _, s := pausedStream(t, Options{}, map[string]string{})
	vm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := s.Wait(ctx); err != nil || st != Reset {
		t.Errorf("Wait after Close = %v, %v; want reset", st, err)
	}
	if _, err := s.RequestHeaders(getReq, true); err != ErrClosed {
		t.Errorf("a call into a closed VM: %v", err)
	}
}

// TestWaitingCallsMatchTheSyncOnes runs one paused request and response
// through the calls a proxy uses (OpenStream, RequestHeadersWait,
// ResponseHeadersWait, DoneAsync) and through the step-by-step ones: the
// plugin sees the same callbacks in the same order, and the caller the same
// headers.
func TestWaitingCallsMatchTheSyncOnes(t *testing.T) {
	phases := map[string]string{
		"request_headers":    "log 2 REQ;" + callout,
		"http_call_response": "effective stream;add 0 x-decision allow;continue 0",
		"response_headers":   "log 2 RESP;add 2 x-r 1",
		"log":                "log 2 LOG;get 0 x-decision;get 2 x-r",
		"done":               "log 2 DONE",
		"delete":             "log 2 DELETE",
	}
	type result struct {
		logs     []string
		upstream []Header
		out      []Header
		id       uint32
	}
	run := func(waiting bool) result {
		d := newFakeDispatcher("sidecar")
		vm := newProbeVM(t, PollSleep, Options{Dispatcher: d})
		if err := vm.Configure(script(phases)); err != nil {
			t.Fatal(err)
		}
		// Answer the callout once it is made, from another goroutine as
		// a dispatcher does.
		go func() {
			for len(d.all()) == 0 {
				time.Sleep(time.Millisecond)
			}
			d.all()[0].respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
		}()
		resp := []Header{{":status", "200"}}
		var r result
		if waiting {
			s := vm.OpenStream(StreamInfo{SourceAddr: "127.0.0.1:5555", DestinationAddr: "127.0.0.1:8080", Protocol: "HTTP/1.1"})
			if st, err := s.RequestHeadersWait(context.Background(), getReq, true); err != nil || st != Continued {
				t.Fatalf("RequestHeadersWait = %v, %v", st, err)
			}
			st, out, err := s.ResponseHeadersWait(context.Background(), resp, true)
			if err != nil || st != Continued {
				t.Fatalf("ResponseHeadersWait = %v, %v", st, err)
			}
			s.DoneAsync()
			vm.Sync()
			r = result{upstream: s.UpstreamHeaders(), out: out, id: s.ID()}
		} else {
			s := newStream(t, vm)
			if st, err := s.RequestHeaders(getReq, true); err != nil || st != Paused {
				t.Fatalf("RequestHeaders = %v, %v", st, err)
			}
			if st, err := s.Wait(context.Background()); err != nil || st != Continued {
				t.Fatalf("Wait = %v, %v", st, err)
			}
			st, out, err := s.ResponseHeaders(resp, true)
			if err != nil || st != Continued {
				t.Fatalf("ResponseHeaders = %v, %v", st, err)
			}
			s.Done()
			r = result{upstream: s.UpstreamHeaders(), out: out, id: s.ID()}
		}
		r.logs = vm.logs.all()
		return r
	}
	sync, waiting := run(false), run(true)
	if strings.Join(sync.logs, "\n") != strings.Join(waiting.logs, "\n") {
		t.Errorf("callbacks differ:\nstep by step:\n%s\nwaiting:\n%s", strings.Join(sync.logs, "\n"), strings.Join(waiting.logs, "\n"))
	}
	if !slices.Equal(sync.upstream, waiting.upstream) || firstValue(waiting.upstream, "x-decision") != "allow" {
		t.Errorf("upstream headers %q, step by step %q", waiting.upstream, sync.upstream)
	}
	if !slices.Equal(sync.out, waiting.out) || firstValue(waiting.out, "x-r") != "1" {
		t.Errorf("response headers %q, step by step %q", waiting.out, sync.out)
	}
	if sync.id != waiting.id {
		t.Errorf("context id %d, step by step %d", waiting.id, sync.id)
	}
}

// TestOpenStreamOnAClosedVM: a stream opened on a closed VM is refused at
// its first call.
func TestOpenStreamOnAClosedVM(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(script(map[string]string{})); err != nil {
		t.Fatal(err)
	}
	s := vm.OpenStream(StreamInfo{})
	vm.Close()
	if _, err := s.RequestHeadersWait(context.Background(), getReq, true); err != ErrClosed {
		t.Errorf("RequestHeadersWait on a closed VM: %v, want ErrClosed", err)
	}
	s.DoneAsync() // nothing to end, no panic
}
