package wasmhost

import (
	"context"
	"strconv"
	"sync"

	"github.com/edgelimit/edgelimit/internal/grpclocal"
)

// State is where the current phase of a stream (its request, then its
// response) stands.
type State int

const (
	// Paused: the plugin holds the phase, e.g. until its HTTP call is
	// answered.
	Paused State = iota
	// Continued: the phase goes on (the request to the upstream, the
	// response to the client).
	Continued
	// Replied: the plugin, or a failed VM, answered with a local reply.
	Replied
	// Reset: the plugin closed the stream (proxy_close_stream).
	Reset
)

func (s State) String() string {
	switch s {
	case Paused:
		return "paused"
	case Continued:
		return "continued"
	case Replied:
		return "replied"
	case Reset:
		return "reset"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// StreamInfo describes the connection and protocol of a stream, for the
// properties a plugin may read.
type StreamInfo struct {
	SourceAddr      string // client "ip:port"
	DestinationAddr string // listener "ip:port"
	Protocol        string // e.g. "HTTP/1.1"
}

// LocalReply is a response sent without the upstream: by the plugin with
// proxy_send_local_response, or a 503 for a failed VM. To a gRPC request it
// is the trailers-only response Envoy makes of it (package grpclocal):
// Status 200, the gRPC status in the grpc-status header, no Body.
type LocalReply struct {
	Status     int
	Headers    []Header // as the client receives them, ":status" first
	Body       []byte
	Details    string // response code details, e.g. "wasm_fail_stream"
	GRPCStatus int32  // -1: none
	// InRequestHeaders: the plugin made the reply within its
	// proxy_on_request_headers, where Envoy's HTTP/1 codec has not yet
	// parsed any body that came with the headers.
	InRequestHeaders bool
}

// Stream is one HTTP stream through the plugin, a filter instance in
// Envoy's terms. Its methods may be called from any goroutine, one at a
// time, in lifecycle order: RequestHeaders, Wait while Paused, then
// ResponseHeaders (unless Replied or Reset), then Done.
type Stream struct {
	vm     *VM
	plugin *Plugin // nil: the VM's (Configure's) when the context is made
	c      *vmContext
	info   StreamInfo

	// Touched only by the VM's tasks.
	reqHeaders   []Header
	respHeaders  []Header
	reqActive    bool // the plugin may read and change the request headers
	inReqHeaders bool // within the plugin's proxy_on_request_headers
	respActive   bool
	logPhase     bool
	logRequest   []Header
	logResponse  []Header
	inResponse   bool
	failReplied  bool
	respCode     int
	done         bool
	// grpc: the request is gRPC (grpclocal.IsGRPC of its content-type as
	// it arrived, with a :path), so its local replies are trailers-only
	// gRPC responses, as Envoy's connection manager decides once the
	// request headers are in (requestHeadersInitialized).
	grpc bool

	// posted counts the tasks the caller posted (the caller's alone).
	posted uint64
	// The headers of the phases the caller posted (start), set before
	// each is submitted and taken by its task. One of each: a caller may
	// go on to the response (a local reply after its wait for the
	// request timed out) while the request's task is still queued.
	reqIn, respIn       []Header
	reqInEOS, respInEOS bool

	mu        sync.Mutex
	state     State
	ran       uint64 // tasks of the caller's that have run
	upstream  []Header
	forwarded bool
	reply     *LocalReply
	respOut   []Header // the response headers once the response left Paused
	// wake holds a token after a change of state or a task that ran; a
	// waiter looks at the state again. One buffered slot, made by the
	// first await that has to block (a stream run on its caller's
	// goroutine while the VM is idle never does), then kept: a state
	// change costs no channel allocation.
	wake chan struct{}
}

// NewStream opens a stream context whose parent is the root context
// Configure made, and waits until it exists. proxy_on_context_create runs
// with the request headers, as in Envoy. Plugin.NewStream opens one under
// another plugin.
func (vm *VM) NewStream(info StreamInfo) (*Stream, error) {
	s := vm.OpenStream(info)
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// open makes the stream's context and waits for it; ErrPluginRemoved if
// its plugin was removed.
func (s *Stream) open() error {
	var err error
	if e := s.vm.do(func() {
		if s.refused() {
			err = ErrPluginRemoved
			return
		}
		s.ensureContext()
	}); e != nil {
		return e
	}
	return err
}

// OpenStream returns a stream whose context is made by its first call
// (RequestHeadersWait, or any other), in that call's task, without a
// round trip of its own. ID is valid once that call returned.
func (vm *VM) OpenStream(info StreamInfo) *Stream {
	return &Stream{vm: vm, info: info}
}

// ensureContext makes the stream's context if it has none yet, under its
// plugin's root context. On the VM's goroutine.
func (s *Stream) ensureContext() {
	if s.c != nil {
		return
	}
	if s.plugin == nil {
		s.plugin = s.vm.plugin
	}
	var root uint32
	if p := s.plugin; p != nil {
		root = p.id
		p.streams++
	}
	s.c = s.vm.newContext(root)
	s.c.plugin = s.plugin
	s.c.stream = s
}

// refused reports whether a stream without a context yet may no longer
// get one: the VM is shutting down, or its plugin was removed.
func (s *Stream) refused() bool {
	if s.c != nil {
		return false
	}
	if s.vm.closing {
		return true
	}
	p := s.plugin
	if p == nil {
		p = s.vm.plugin
	}
	return p != nil && (p.draining || p.gone)
}

// ID returns the stream's context id.
func (s *Stream) ID() uint32 { return s.c.id }

func (s *Stream) setState(st State) {
	s.mu.Lock()
	s.state = st
	if st != Paused && s.inResponse {
		if s.respActive {
			s.respOut = append([]Header(nil), s.respHeaders...)
		} else {
			// No copy: the plugin can no longer change them, as
			// with the request headers (continueRequest).
			s.respOut = s.respHeaders
		}
	}
	s.notifyLocked()
	s.mu.Unlock()
}

// notifyLocked wakes the waiter, if one ever blocked; s.mu is held.
func (s *Stream) notifyLocked() {
	select {
	case s.wake <- struct{}{}:
	default: // nil: nobody has waited yet
	}
}

// State returns where the current phase stands.
func (s *Stream) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Wait blocks while the current phase is Paused and returns the state it
// reached, or ctx's error.
func (s *Stream) Wait(ctx context.Context) (State, error) { return s.await(ctx, 0) }

// await blocks until the caller's task seq has run and the phase is not
// Paused.
func (s *Stream) await(ctx context.Context, seq uint64) (State, error) {
	for {
		s.mu.Lock()
		st, ran := s.state, s.ran
		if ran >= seq && st != Paused {
			s.mu.Unlock()
			return st, nil
		}
		if s.wake == nil {
			s.wake = make(chan struct{}, 1)
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Paused, ctx.Err()
		}
	}
}

// start runs the stream's phase op at once if the VM is idle (and goes on
// to what queued meanwhile while the stream is paused), else queues it for
// the VM's goroutine without waiting (exec), and returns its number for
// await. A VM that is shutting down when the phase's turn comes resets a
// stream that has no context yet, as Close resets the waiting ones; so
// does a plugin that was removed (run).
func (s *Stream) start(op taskOp) (uint64, error) {
	s.posted++
	seq := s.posted
	if !s.vm.exec(task{op: op, s: s, n: seq}, s.paused) {
		return 0, ErrClosed
	}
	return seq, nil
}

// run runs the stream's operation op, on the VM: the caller's phase number
// seq (start), or its end (DoneAsync).
func (s *Stream) run(op taskOp, seq uint64) {
	if op == opEndStream {
		s.end()
		return
	}
	defer func() {
		s.mu.Lock()
		s.ran = seq
		s.notifyLocked()
		s.mu.Unlock()
	}()
	if s.refused() {
		s.setState(Reset)
		return
	}
	switch op {
	case opRequestHeaders:
		h := s.reqIn
		s.reqIn = nil
		s.requestHeaders(h, s.reqInEOS)
	case opResponseHeaders:
		h := s.respIn
		s.respIn = nil
		s.responseHeaders(h, s.respInEOS)
	}
}

// paused reports whether the stream waits (for a callout, or the plugin):
// its caller has nothing to do but wait then (runClaimed).
func (s *Stream) paused() bool { return s.State() == Paused }

// UpstreamHeaders returns the request headers as they go on to the
// upstream, once the request Continued.
func (s *Stream) UpstreamHeaders() []Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Header(nil), s.upstream...)
}

// LocalReply returns the local reply, once the stream was Replied.
func (s *Stream) LocalReply() (LocalReply, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reply == nil {
		return LocalReply{}, false
	}
	r := *s.reply
	r.Headers = append([]Header(nil), r.Headers...)
	return r, true
}

func (s *Stream) create() {
	s.ensureContext()
	if s.c.created {
		return
	}
	s.c.created = true
	s.vm.callDrain(s.c, onContextCreate, uint64(s.c.id), uint64(s.c.parent))
}

// RequestHeaders runs proxy_on_request_headers and the actions it deferred,
// and returns the request's state: Continued, Paused (wait for it), Replied
// or Reset. Names are lower-cased as Envoy's header map does.
func (s *Stream) RequestHeaders(headers []Header, endOfStream bool) (State, error) {
	var st State
	err := s.vm.do(func() { st = s.requestHeaders(headers, endOfStream) })
	return st, err
}

// RequestHeadersWait is RequestHeaders, then Wait while Paused, run on the
// caller's goroutine if the VM is idle, else by the goroutine that holds
// the VM, which wakes the caller: what a proxy needs, which waits either
// way. headers must not change afterwards.
func (s *Stream) RequestHeadersWait(ctx context.Context, headers []Header, endOfStream bool) (State, error) {
	s.reqIn, s.reqInEOS = headers, endOfStream
	seq, err := s.start(opRequestHeaders)
	if err != nil {
		return Paused, err
	}
	return s.await(ctx, seq)
}

func (s *Stream) requestHeaders(headers []Header, eos bool) State {
	vm := s.vm
	s.ensureContext()
	s.reqHeaders = lowerKeys(headers, headerRoom)
	s.grpc = firstValue(s.reqHeaders, ":path") != "" && grpclocal.IsGRPC(firstValue(s.reqHeaders, "content-type"))
	if vm.failed.Load() {
		s.c.created = true
		s.failStream()
		return s.state
	}
	s.create()
	s.reqActive = true
	s.inReqHeaders = true
	r, ok := vm.call(s.c, onRequestHeaders, uint64(s.c.id), uint64(len(s.reqHeaders)), b2u(eos))
	s.inReqHeaders = false
	stopped := vm.stopIter
	vm.stopIter = false
	switch {
	case vm.failed.Load():
		s.failStream()
	case ok && (stopped || r != actionContinue):
		// Envoy turns a pause on headers into StopAllIterationAndWatermark:
		// nothing goes upstream until the plugin resumes the stream.
	default:
		s.continueRequest()
	}
	vm.drain()
	return s.State()
}

func (s *Stream) continueRequest() {
	s.reqActive = false
	s.mu.Lock()
	// No copy: with reqActive false the plugin can no longer change the
	// request headers, and nothing else writes them.
	s.upstream = s.reqHeaders
	s.forwarded = true
	s.mu.Unlock()
	s.setState(Continued)
}

// Forwarded reports whether the request went on to the upstream.
func (s *Stream) Forwarded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.forwarded
}

// resume is the deferred part of proxy_continue_stream.
func (s *Stream) resume(t StreamType) {
	if s.done || s.State() != Paused {
		return
	}
	switch {
	case t == StreamRequest && !s.inResponse:
		s.continueRequest()
	case t == StreamResponse && s.inResponse:
		s.respActive = false
		s.setState(Continued)
	}
}

// reset is the deferred part of proxy_close_stream.
func (s *Stream) reset() {
	if s.done {
		return
	}
	s.setState(Reset)
}

// sendLocalReply is the deferred part of proxy_send_local_response. During
// the request it goes through the encoder path, as Envoy's local replies
// do: the plugin's proxy_on_response_headers sees (and may change) its own
// reply. Once response headers have arrived it replaces them directly.
func (s *Stream) sendLocalReply(r LocalReply) {
	if s.done || s.State() != Paused {
		return
	}
	headers := localReplyHeaders(r.Status, r.Headers, len(r.Body))
	if s.grpc {
		headers, r.Body = grpclocal.Reply(headers, r.Body, r.GRPCStatus), nil
	}
	if !s.inResponse {
		s.inResponse = true
		s.respHeaders = headers
		s.respActive = true
		s.vm.call(s.c, onResponseHeaders, uint64(s.c.id), uint64(len(headers)), b2u(len(r.Body) == 0))
		s.vm.stopIter = false
		s.respActive = false
		headers = s.respHeaders
		if code, err := strconv.Atoi(firstValue(headers, ":status")); err == nil {
			r.Status = code
		}
	}
	r.Headers = headers
	s.finish(r)
}

func (s *Stream) finish(r LocalReply) {
	s.respCode = r.Status
	s.logResponse = r.Headers
	s.mu.Lock()
	s.reply = &r
	s.mu.Unlock()
	s.setState(Replied)
}

// failStream is Envoy's answer when the VM has failed: with fail_open the
// phase goes on without the plugin, otherwise a 503 local reply that the
// plugin never sees.
func (s *Stream) failStream() {
	if s.done || s.State() != Paused {
		return
	}
	if s.vm.o.FailOpen {
		if s.inResponse {
			s.respActive = false
			s.setState(Continued)
		} else {
			s.continueRequest()
		}
		return
	}
	s.failReplied = true
	r := LocalReply{
		Status:     503,
		Headers:    []Header{{":status", "503"}},
		Details:    "wasm_fail_stream",
		GRPCStatus: grpclocal.Unavailable,
	}
	if s.grpc {
		r.Status, r.Headers = 200, grpclocal.Reply(r.Headers, nil, r.GRPCStatus)
	}
	s.finish(r)
}

// localReplyHeaders builds a local reply's headers as Envoy does: the
// status, the plugin's additional headers, then for a body its length and,
// unless given, content-type text/plain; without a body neither.
func localReplyHeaders(status int, extra []Header, bodyLen int) []Header {
	h := []Header{{":status", strconv.Itoa(status)}}
	h = append(h, extra...)
	if bodyLen > 0 {
		h = setHeader(h, "content-length", strconv.Itoa(bodyLen))
		if firstValue(h, "content-type") == "" {
			h = append(h, Header{"content-type", "text/plain"})
		}
		return h
	}
	out := h[:0]
	for _, x := range h {
		if x[0] != "content-length" && x[0] != "content-type" {
			out = append(out, x)
		}
	}
	return out
}

func firstValue(h []Header, name string) string {
	for _, x := range h {
		if x[0] == name {
			return x[1]
		}
	}
	return ""
}

// ResponseHeaders runs proxy_on_response_headers on the upstream's response
// headers and returns the response's state and its headers as the client
// should receive them. When Paused, Wait, then read ResponseHeadersOut.
// Replied means the plugin (or a failed VM) replaced the response.
func (s *Stream) ResponseHeaders(headers []Header, endOfStream bool) (State, []Header, error) {
	var st State
	var out []Header
	err := s.vm.do(func() {
		st = s.responseHeaders(headers, endOfStream)
		out = append([]Header(nil), s.respHeaders...)
	})
	return st, out, err
}

// ResponseHeadersWait is ResponseHeaders, then Wait while Paused and
// ResponseHeadersOut, run as RequestHeadersWait's phase is. headers must
// not change afterwards.
func (s *Stream) ResponseHeadersWait(ctx context.Context, headers []Header, endOfStream bool) (State, []Header, error) {
	s.respIn, s.respInEOS = headers, endOfStream
	seq, err := s.start(opResponseHeaders)
	if err != nil {
		return Paused, nil, err
	}
	st, err := s.await(ctx, seq)
	if err != nil {
		return st, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return st, s.respOut, nil
}

// ResponseHeadersOut returns the response headers as they stand (after a
// paused response was resumed).
func (s *Stream) ResponseHeadersOut() []Header {
	var out []Header
	s.vm.do(func() { out = append([]Header(nil), s.respHeaders...) })
	return out
}

func (s *Stream) responseHeaders(headers []Header, eos bool) State {
	vm := s.vm
	s.ensureContext()
	s.inResponse = true
	s.respHeaders = lowerKeys(headers, headerRoom)
	if code, err := strconv.Atoi(firstValue(s.respHeaders, ":status")); err == nil {
		s.respCode = code
	}
	s.setState(Paused)
	// Envoy leaves a stream alone whose context never started or whose
	// failure reply went out.
	if !s.c.created || s.failReplied {
		s.setState(Continued)
		return Continued
	}
	if vm.failed.Load() {
		s.failStream()
		return s.State()
	}
	s.respActive = true
	r, ok := vm.call(s.c, onResponseHeaders, uint64(s.c.id), uint64(len(s.respHeaders)), b2u(eos))
	stopped := vm.stopIter
	vm.stopIter = false
	switch {
	case vm.failed.Load():
		s.failStream()
	case ok && (stopped || r != actionContinue):
	default:
		s.respActive = false
		s.setState(Continued)
	}
	vm.drain()
	s.logResponse = s.respHeaders
	return s.State()
}

// Done ends the stream as Envoy does: proxy_on_log (the access-log phase,
// where the final request and response headers are readable), then
// proxy_on_done and proxy_on_delete.
func (s *Stream) Done() { s.vm.do(s.end) }

// DoneAsync is Done without waiting for a busy VM: the callbacks run at
// once if the VM is idle, else on the VM's goroutine after everything
// queued before them, which is all a proxy that has answered its client
// needs.
func (s *Stream) DoneAsync() { s.vm.exec(task{op: opEndStream, s: s}, always) }

func (s *Stream) end() {
	if s.done {
		return
	}
	if s.c == nil {
		// Never started: no context to end.
		s.done = true
		return
	}
	vm := s.vm
	if !vm.failed.Load() {
		s.create()
		s.logPhase = true
		s.logRequest = s.reqHeaders
		if s.logResponse == nil {
			s.logResponse = s.respHeaders
		}
		vm.callDrain(s.c, onLog, uint64(s.c.id))
		s.logPhase = false
		vm.callDrain(s.c, onDone, uint64(s.c.id))
		vm.callDrain(s.c, onDelete, uint64(s.c.id))
	}
	s.done = true
	delete(vm.contexts, s.c.id)
	if p := s.c.plugin; p != nil {
		p.streamEnded()
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
