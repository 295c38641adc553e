package wasmhost

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"
)

// Dispatcher sends the HTTP calls plugins make with proxy_http_call, like
// Envoy's cluster manager and async HTTP client.
type Dispatcher interface {
	// Cluster reports whether a cluster of that name exists. A call to an
	// unknown cluster fails with BAD_ARGUMENT and no callback.
	Cluster(name string) bool
	// Dispatch starts call and returns at once. It must call respond
	// exactly once, from any goroutine (also before returning), unless it
	// returns an error: then the call fails with INTERNAL_FAILURE and no
	// callback comes. respond may run the plugin's callback before it
	// returns (when the VM is idle), so it must not be called with a lock
	// held that Dispatch takes. ctx ends when the host stops waiting (the
	// timeout passed, or the VM closed); a response after that is dropped.
	// Transport failures are answered the way an Envoy cluster answers
	// them: a local reply (ConnectFailure), or Reset once a response had
	// begun.
	Dispatch(ctx context.Context, call Callout, respond func(CalloutResponse)) error
}

// WatchingDispatcher is a Dispatcher that can also tell whether a call's
// response has reached the proxy before its reader has handed it over.
// DispatchWatched is Dispatch that also returns arrived, which reports
// whether bytes of the response are in the connection's socket or being
// parsed. A timeout that finds them lets the response win, as Envoy's
// event loop reads a socket that is ready before it runs a timer that
// expired in the same iteration (RATIONALE.md: the callout timeout).
type WatchingDispatcher interface {
	Dispatcher
	DispatchWatched(ctx context.Context, call Callout, respond func(CalloutResponse)) (arrived func() bool, err error)
}

// Callout is one HTTP call a plugin dispatched.
type Callout struct {
	Token     uint32
	ContextID uint32 // the context that made the call (callbacks go to the root)
	Cluster   string
	Headers   []Header // lower-case names, pseudo-headers included
	Body      []byte
	Trailers  []Header
	Timeout   time.Duration // 0: none
	// Worker is the calling VM's Options.Worker: a dispatcher keeps each
	// worker's connections apart, as Envoy's connection pools are.
	Worker int
}

// CalloutResponse is what answers a Callout.
type CalloutResponse struct {
	Headers  []Header // ":status" first
	Body     []byte
	Trailers []Header
	// Reset delivers the callback with no headers, body or trailers, as
	// Envoy does when the stream is reset after the response began.
	Reset bool
}

// Status returns the response's ":status" (0 if absent or not a number).
func (r CalloutResponse) Status() int {
	for _, h := range r.Headers {
		if h[0] == ":status" {
			n, _ := strconv.Atoi(h[1])
			return n
		}
	}
	return 0
}

// ErrNoSuchCluster may be returned by Dispatch for a cluster that vanished
// between Cluster and Dispatch; the call fails with BAD_ARGUMENT.
var ErrNoSuchCluster = errors.New("no such cluster")

// LocalReplyResponse is a response as Envoy's router makes it up when it
// answers on an upstream's behalf: the status, and for a non-empty body its
// content-length and content-type text/plain.
func LocalReplyResponse(status int, body string) CalloutResponse {
	h := []Header{{":status", strconv.Itoa(status)}}
	if body != "" {
		h = append(h, Header{"content-length", strconv.Itoa(len(body))}, Header{"content-type", "text/plain"})
	}
	return CalloutResponse{Headers: h, Body: []byte(body)}
}

// TimeoutResponse is what a callout that timed out delivers: Envoy's 504
// local reply.
func TimeoutResponse() CalloutResponse { return LocalReplyResponse(504, "upstream request timeout") }

// ConnectFailure is what a callout delivers when no connection to the
// cluster could be made: Envoy's 503 local reply with its reset reason.
func ConnectFailure(reason string) CalloutResponse {
	return LocalReplyResponse(503, "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: "+reason)
}

// pendingCall is a dispatched call waiting for its response.
type pendingCall struct {
	root      *vmContext  // the root context its callback goes to; nil: none
	ctx       callContext // the dispatcher's: ends with the call
	stopTimer func() bool
	once      sync.Once
	// arrived, from a WatchingDispatcher, reports whether the response is
	// in the proxy's socket though not yet received; nil otherwise.
	arrived func() bool

	// received is the response once the dispatcher has it, set from the
	// dispatcher's goroutine before the delivery is queued: the timeout
	// task reads it to let a response that already arrived win, as
	// Envoy's event loop runs the socket's read event before the expired
	// timer of the same iteration (RATIONALE.md: the callout timeout).
	mu       sync.Mutex
	got      bool
	received CalloutResponse
}

func (p *pendingCall) finish() {
	p.once.Do(func() {
		p.ctx.end()
		if p.stopTimer != nil {
			p.stopTimer()
		}
	})
}

// receive records the response; only the first counts.
func (p *pendingCall) receive(r CalloutResponse) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.got {
		return false
	}
	p.received, p.got = r, true
	return true
}

// response returns the received response, or nil. It does not change
// once received.
func (p *pendingCall) response() *CalloutResponse {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.got {
		return nil
	}
	return &p.received
}

// httpCall is proxy_http_call(cluster ptr/len, headers ptr/len, body
// ptr/len, trailers ptr/len, timeout_ms, token ptr).
func (vm *VM) httpCall(s []uint64) Status {
	// Views of the module's memory, copied below into what the call
	// keeps before anything else runs in the module.
	clusterView, ok1 := vm.mem.Read(u32(s[0]), u32(s[1]))
	hdrs, ok2 := vm.mem.Read(u32(s[2]), u32(s[3]))
	body, ok3 := vm.read(u32(s[4]), u32(s[5]))
	trls, ok4 := vm.mem.Read(u32(s[6]), u32(s[7]))
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return StatusInvalidMemAccess
	}
	tokenPtr := u32(s[9])
	// Envoy writes the token slot first, to learn it is writable before
	// anything starts.
	if !vm.writeU32(tokenPtr, 0) {
		return StatusInvalidMemAccess
	}
	// The timeout is an int in Envoy: above 2^31-1 ms it is negative.
	timeoutMs := int32(u32(s[8]))
	if timeoutMs < 0 {
		return StatusBadArgument
	}
	cluster := vm.text.bytes(clusterView)
	if vm.o.Dispatcher == nil || !vm.o.Dispatcher.Cluster(cluster) {
		return StatusBadArgument
	}
	headers := vm.text.pairs(hdrs, 1) // room for a content-length
	var path, method, authority bool
	for _, h := range headers {
		switch h[0] {
		case ":path":
			path = true
		case ":method":
			method = true
		case ":authority":
			authority = true
		}
	}
	if !path || !method || !authority {
		return StatusBadArgument
	}
	if len(body) > 0 {
		headers = setHeader(headers, "content-length", strconv.Itoa(len(body)))
	}
	caller := vm.ctxOrEffective()
	vm.nextCallID += 4 // tokens 4, 8, 12, ... as Envoy numbers HTTP calls
	token := vm.nextCallID
	call := Callout{
		Token:     token,
		ContextID: caller.id,
		Cluster:   cluster,
		Headers:   headers,
		Body:      body,
		Trailers:  vm.text.pairs(trls, 0),
		Timeout:   time.Duration(timeoutMs) * time.Millisecond,
		Worker:    vm.o.Worker,
	}
	p := &pendingCall{}
	p.ctx.init(vm.ctx)
	ctx := &p.ctx
	if caller.plugin != nil {
		// cpp-host makes the call on the caller's root context.
		p.root = caller.plugin.root
	}
	vm.calls[token] = p
	// The answer is delivered at once by the goroutine that has it (the
	// connection's reader, which then has nothing to do but wait for the
	// next) when the VM is idle, as Envoy's worker handles the read event
	// it was woken for; else after what is queued (exec). A dispatcher
	// answering inside the call, from the VM's own task, finds it busy and
	// queues.
	respond := func(r CalloutResponse) {
		if p.receive(r) {
			vm.exec(task{op: opDeliver, n: uint64(token)}, always)
		}
	}
	var err error
	if wd, ok := vm.o.Dispatcher.(WatchingDispatcher); ok {
		p.arrived, err = wd.DispatchWatched(ctx, call, respond)
	} else {
		err = vm.o.Dispatcher.Dispatch(ctx, call, respond)
	}
	if err != nil {
		delete(vm.calls, token)
		p.ctx.end()
		if errors.Is(err, ErrNoSuchCluster) {
			return StatusBadArgument
		}
		return StatusInternalFailure
	}
	if call.Timeout > 0 {
		p.stopTimer = vm.o.Clock.AfterFunc(call.Timeout, func() { vm.post(func() { vm.timeout(token) }) })
	}
	vm.writeU32(tokenPtr, token)
	return StatusOK
}

// setHeader replaces name's first value in h, or adds it.
func setHeader(h []Header, name, value string) []Header {
	for i := range h {
		if h[i][0] == name {
			h[i][1] = value
			return h
		}
	}
	return append(h, Header{name, value})
}

// deliverReceived delivers the response the dispatcher received for the
// call, unless the call already ended (its timeout was delivered, or the
// VM failed or closed).
func (vm *VM) deliverReceived(token uint32) {
	p := vm.calls[token]
	if p == nil {
		return
	}
	vm.deliver(token, p, p.response())
}

// timeout is the call's timer event on the VM's goroutine. A response the
// dispatcher received before this task ran wins over the timeout, as in
// Envoy, where the read event that epoll reported is processed before the
// timer that expired in the same loop iteration; otherwise the call gets
// Envoy's 504 and a later response is dropped. A response whose bytes (or
// the close that ends it) are already in the socket, its reader not yet
// scheduled, is one Envoy's loop would read first too: the timeout looks
// again once that reader has had a turn (arrivalRecheck), and fires only
// if by then nothing was received and nothing more is waiting in the
// socket.
func (vm *VM) timeout(token uint32) {
	p := vm.calls[token]
	if p == nil {
		return
	}
	if r := p.response(); r != nil {
		vm.deliver(token, p, r)
		return
	}
	if p.arrived != nil && p.arrived() {
		p.stopTimer = vm.o.Clock.AfterFunc(arrivalRecheck, func() { vm.post(func() { vm.timeout(token) }) })
		return
	}
	r := TimeoutResponse()
	vm.deliver(token, p, &r)
}

// arrivalRecheck is how long a timeout that found its response in the
// socket waits before looking again: long enough for the reader's
// goroutine to be scheduled, short against the callout's milliseconds.
const arrivalRecheck = 100 * time.Microsecond

// deliver runs proxy_on_http_call_response for the call's one answer and
// ends the call. The response is readable only during the callback.
func (vm *VM) deliver(token uint32, p *pendingCall, r *CalloutResponse) {
	delete(vm.calls, token)
	p.finish()
	root := p.root
	if vm.failed.Load() || root == nil || vm.contexts[root.id] != root {
		return
	}
	if r.Reset {
		// No response exists: its headers and body are not readable.
		vm.status, vm.statusMsg = uint32(StatusBrokenConnection), "reset"
		vm.call(root, onHTTPCallResponse, uint64(root.id), uint64(token), 0, 0, 0)
		vm.statusMsg = ""
	} else {
		vm.callResp = r
		vm.call(root, onHTTPCallResponse, uint64(root.id), uint64(token),
			uint64(len(r.Headers)), uint64(len(r.Body)), uint64(len(r.Trailers)))
	}
	vm.callResp = nil
	vm.stopIter = false
	vm.drain()
}

// PendingCalls returns how many dispatched calls await their response.
func (vm *VM) PendingCalls() int {
	n := 0
	vm.do(func() { n = len(vm.calls) })
	return n
}
