// Package native is the filter's emulated host: it runs the limiter
// in-process, as plain Go, behind an implementation of abi.Host with Envoy's
// semantics, and serves it to the behaviour table of package filtertest
// through filtertest.Host. e2e/filterwasm is the other host, the compiled
// filter.wasm in the headless Envoy; both run the whole table.
package native

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
	"github.com/edgelimit/edgelimit/internal/grpclocal"
)

// NewHost returns a filtertest.Host that runs the limiter natively: the
// same abi.Plugin the wasm binding drives, behind an emulation of the host
// calls with Envoy's semantics (see filter/RATIONALE.md):
//
//   - stream calls act on the effective context: the stream whose callback
//     runs, or the one proxy_set_effective_context chose; root callbacks
//     (configure, tick, http-call responses) start on the root context, where
//     stream calls fail;
//   - proxy_send_local_response and proxy_continue_stream are deferred until
//     the callback returns; a local reply stops the stream;
//   - request headers are readable and writable while the request is being
//     decided (its callback, or paused), response headers during
//     proxy_on_response_headers, the plugin configuration during
//     proxy_on_configure, a callout's response during its callback;
//   - proxy_http_call is refused (BAD_ARGUMENT) without :method, :path and
//     :authority or without a cluster; tokens are 4, 8, 12, …;
//   - shared data is process-wide with Envoy's compare-and-swap rule;
//   - only proxy_log may be called while the plugin is being created
//     (_initialize in a real module);
//   - what a host call returns is valid until the callback returns, as in
//     the wasm binding, whose arena is reused by the next callback: the
//     emulation hands out views of buffers it overwrites when the callback
//     ends, so a plugin that keeps one without copying it sees garbage;
//   - what a plugin hands a host call is copied during the call;
//   - proxy_on_log and proxy_on_done are not called: the module does not
//     export them, and Envoy skips callbacks a module does not export;
//   - a plugin configuration added to a VM (AddPlugin) is a root context
//     of its own, started with proxy_on_vm_start and proxy_on_configure;
//     its streams, ticks and callout answers go to it; removed, it gets
//     proxy_on_delete while the VM goes on.
//
// Anything the plugin does that Envoy would refuse, or that a proxy must
// never see (a CR, LF or NUL in a header it sets, a log level above
// critical), fails the test.
func NewHost(t *testing.T) filtertest.Host {
	return newEmulated(t, func(h abi.Host) abi.Plugin { return limiter.New(h) })
}

// newEmulated starts a process with one VM running the plugin made by
// load.
func newEmulated(t *testing.T, load func(abi.Host) abi.Plugin) *vm {
	p := &process{clock: nativeEpoch, shared: map[string]*sharedValue{}, metrics: map[string]*metricValue{}, load: load}
	return p.newVM(t)
}

// nativeEpoch is the emulated wall clock's start: 2026-01-01T00:00:00Z.
const nativeEpoch = int64(1767225600) * int64(time.Second)

// process is what the VMs of one proxy process share.
type process struct {
	clock   int64
	cas     uint32
	shared  map[string]*sharedValue
	metrics map[string]*metricValue
	load    func(abi.Host) abi.Plugin
}

type sharedValue struct {
	value []byte
	cas   uint32
}

type metricValue struct {
	kind  abi.MetricType
	value int64 // counter or gauge value; histogram sample count
}

// vm is one VM with the limiter loaded; it is the abi.Host the limiter
// calls.
type vm struct {
	t      *testing.T
	proc   *process
	plugin abi.Plugin

	started bool // creation done: host calls other than proxy_log allowed
	closed  bool
	nextID  uint32
	rootID  uint32   // the first plugin's root context
	roots   []uint32 // every root context not yet deleted, oldest first
	logs    []string

	metricIDs map[uint32]*metricValue
	defines   map[string]int // proxy_define_metric calls by name
	nextToken uint32
	failNext  bool
	calls     map[uint32]*call // pending callouts by token
	streams   map[uint32]*nativeStream
	ticks     map[uint32]time.Duration // tick periods by root context

	// Callback state.
	effective uint32              // effective context id, 0 outside callbacks
	config    []byte              // plugin configuration, during on_configure
	response  *call               // the answered callout, during its callback
	respond   []filtertest.Header // its headers
	body      []byte              // its body
	touched   []*nativeStream     // streams with deferred actions
	lent      [][]byte            // results handed out during the callback
}

type call struct {
	token   uint32
	root    uint32        // the context that made it, when a root context
	stream  *nativeStream // the stream that made it, if any
	callout filtertest.Callout
}

func (p *process) newVM(t *testing.T) *vm {
	v := &vm{t: t, proc: p, metricIDs: map[uint32]*metricValue{}, defines: map[string]int{}, calls: map[uint32]*call{}, streams: map[uint32]*nativeStream{}, ticks: map[uint32]time.Duration{}}
	v.plugin = p.load(v)
	v.started = true
	v.rootID = v.newRoot()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log of VM %p:\n  %s", v, strings.Join(v.logs, "\n  "))
		}
	})
	return v
}

func (v *vm) newID() uint32 {
	v.nextID++
	return v.nextID
}

// newRoot creates a root context (proxy_on_context_create with parent 0).
func (v *vm) newRoot() uint32 {
	id := v.newID()
	v.roots = append(v.roots, id)
	v.callback(id, func() { v.plugin.OnContextCreate(id, 0) })
	return id
}

func (v *vm) isRoot(id uint32) bool { return slices.Contains(v.roots, id) }

// callback runs fn as a proxy callback on context id, then applies what the
// plugin deferred.
func (v *vm) callback(id uint32, fn func()) {
	if v.effective != 0 {
		v.t.Fatalf("native host: nested callback")
	}
	v.effective = id
	fn()
	v.effective = 0
	for _, b := range v.lent {
		for i := range b {
			b[i] = poison
		}
	}
	v.lent = v.lent[:0]
	touched := v.touched
	v.touched = nil
	for _, s := range touched {
		s.applyDeferred()
	}
}

// poison overwrites the results of a callback's host calls when it returns.
const poison = '#'

// lend returns a copy of b that is overwritten when the callback returns.
func (v *vm) lend(b []byte) []byte {
	c := slices.Clone(b)
	v.lent = append(v.lent, c)
	return c
}

func (v *vm) lendString(s string) string {
	if s == "" {
		return ""
	}
	b := v.lend([]byte(s))
	return unsafe.String(&b[0], len(b))
}

func (v *vm) refuse(call string) {
	if !v.started {
		v.t.Errorf("native host: %s called while the plugin is created; Envoy allows only proxy_log then", call)
	}
}

// ---- filtertest.Host (the test's side) ----

func (v *vm) Configure(config string) bool { return v.configure(v.rootID, config) }

// configure runs proxy_on_vm_start and proxy_on_configure on root, as
// Envoy does for every root context it starts.
func (v *vm) configure(root uint32, config string) bool {
	ok := true
	v.callback(root, func() { ok = v.plugin.OnVMStart(root, 0) })
	if !ok {
		return false
	}
	v.callback(root, func() {
		v.config = []byte(config)
		ok = v.plugin.OnConfigure(root, len(config))
		v.config = nil
	})
	return ok
}

func (v *vm) NewStream() filtertest.Stream { return v.newStream(v.rootID) }

func (v *vm) newStream(root uint32) filtertest.Stream {
	if !v.isRoot(root) {
		v.t.Fatalf("native host: stream on root context %d, which was removed", root)
	}
	s := &nativeStream{vm: v, id: v.newID(), root: root}
	v.streams[s.id] = s
	v.callback(s.id, func() { v.plugin.OnContextCreate(s.id, root) })
	return s
}

func (v *vm) Metric(name string) (int64, bool) {
	m, ok := v.proc.metrics[name]
	if !ok {
		return 0, false
	}
	return m.value, true
}

func (v *vm) Logs() []string { return slices.Clone(v.logs) }

func (v *vm) FailNextDispatch() { v.failNext = true }

func (v *vm) Advance(d time.Duration) { v.proc.clock += int64(d) }

// StepWall moves the one clock this host has: nothing of it runs on a
// monotonic clock (callouts time out only when a case says so).
func (v *vm) StepWall(d time.Duration) { v.proc.clock += int64(d) }

func (v *vm) Tick() { v.tick(v.rootID) }

func (v *vm) TickPeriod() time.Duration { return v.ticks[v.rootID] }

func (v *vm) RootCallouts() []filtertest.Callout { return v.rootCallouts(v.rootID) }

func (v *vm) RespondRootCallouts(headers []filtertest.Header) { v.respondRoot(v.rootID, headers) }

// rootPending returns the unanswered calls root made itself, oldest first.
func (v *vm) rootPending(root uint32) []*call {
	var out []*call
	for _, c := range v.calls {
		if c.stream == nil && c.root == root {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *call) int { return int(a.token) - int(b.token) })
	return out
}

func (v *vm) rootCallouts(root uint32) []filtertest.Callout {
	var out []filtertest.Callout
	for _, c := range v.rootPending(root) {
		out = append(out, c.callout)
	}
	return out
}

func (v *vm) respondRoot(root uint32, headers []filtertest.Header) {
	for _, c := range v.rootPending(root) {
		delete(v.calls, c.token)
		if !v.isRoot(root) {
			continue
		}
		v.callback(root, func() {
			v.response, v.respond, v.body = c, slices.Clone(headers), nil
			v.plugin.OnHTTPCallResponse(root, c.token, len(headers), 0, 0)
			v.response, v.respond, v.body = nil, nil, nil
		})
	}
}

func (v *vm) tick(root uint32) {
	if v.isRoot(root) {
		v.callback(root, func() { v.plugin.OnTick(root) })
	}
}

func (v *vm) Worker() filtertest.Host { return v.proc.newVM(v.t) }

func (v *vm) AddPlugin(config string) (filtertest.Host, bool) {
	p := &addedPlugin{vm: v, root: v.newRoot()}
	if !v.configure(p.root, config) {
		// Envoy tries a configuration in a canary VM first: no worker
		// keeps a plugin that refused it.
		v.remove(p.root)
		return nil, false
	}
	return p, true
}

func (v *vm) Remove() { v.remove(v.rootID) }

// remove deletes a root context, whose streams have all ended.
func (v *vm) remove(root uint32) {
	if !v.isRoot(root) {
		return
	}
	for _, s := range v.streams {
		if s.root == root && s.state != done {
			v.t.Fatalf("native host: plugin removed while its stream %d is open", s.id)
		}
	}
	v.callback(root, func() { v.plugin.OnDelete(root) })
	v.roots = slices.DeleteFunc(v.roots, func(id uint32) bool { return id == root })
}

func (v *vm) MetricDefinitions(name string) int { return v.defines[name] }

func (v *vm) Close() {
	if v.closed {
		return
	}
	v.closed = true
	for _, root := range slices.Clone(v.roots) {
		v.callback(root, func() { v.plugin.OnDelete(root) })
	}
	v.roots = nil
}

// addedPlugin is a second plugin configuration in a VM (AddPlugin): the
// stream, configure, tick and remove calls act on its root context, the
// rest on the VM.
type addedPlugin struct {
	*vm
	root uint32
}

func (p *addedPlugin) Configure(config string) bool { return p.configure(p.root, config) }
func (p *addedPlugin) NewStream() filtertest.Stream { return p.newStream(p.root) }
func (p *addedPlugin) Tick()                        { p.tick(p.root) }
func (p *addedPlugin) TickPeriod() time.Duration    { return p.ticks[p.root] }
func (p *addedPlugin) RootCallouts() []filtertest.Callout {
	return p.rootCallouts(p.root)
}
func (p *addedPlugin) RespondRootCallouts(headers []filtertest.Header) {
	p.respondRoot(p.root, headers)
}
func (p *addedPlugin) Remove() { p.remove(p.root) }

// ---- abi.Host (the plugin's side) ----

var _ abi.Host = (*vm)(nil)

func (v *vm) Log(level abi.LogLevel, msg string) abi.Status {
	if level > abi.LogCritical {
		v.t.Errorf("native host: proxy_log level %d", level)
		return abi.StatusBadArgument
	}
	v.logs = append(v.logs, strings.Clone(msg))
	return abi.StatusOK
}

func (v *vm) GetBuffer(t abi.BufferType, start, max int) ([]byte, abi.Status) {
	v.refuse("proxy_get_buffer_bytes")
	var buf []byte
	switch {
	case t == abi.BufferPluginConfiguration && v.config != nil:
		buf = v.config
	case t == abi.BufferHTTPCallResponseBody && v.response != nil:
		buf = v.body
	default:
		return nil, abi.StatusNotFound
	}
	if start < 0 || max < 0 || start > len(buf) {
		return nil, abi.StatusBadArgument
	}
	buf = buf[start:]
	if len(buf) > max {
		buf = buf[:max]
	}
	if len(buf) == 0 {
		return nil, abi.StatusOK
	}
	return v.lend(buf), abi.StatusOK
}

// headerMap returns the map m of the effective context, nil when Envoy would
// not have it now.
func (v *vm) headerMap(m abi.MapType) *[]filtertest.Header {
	if m == abi.MapHTTPCallResponseHeaders {
		if v.response == nil {
			return nil
		}
		return &v.respond
	}
	s := v.streams[v.effective]
	if s == nil {
		return nil
	}
	switch {
	case m == abi.MapRequestHeaders && (s.state == deciding || s.state == paused):
		return &s.request
	case m == abi.MapResponseHeaders && s.inResponse:
		return &s.response
	}
	return nil
}

func (v *vm) GetHeader(m abi.MapType, key string) (string, abi.Status) {
	v.refuse("proxy_get_header_map_value")
	hm := v.headerMap(m)
	if hm == nil {
		return "", abi.StatusNotFound
	}
	if val, ok := filtertest.Get(*hm, strings.ToLower(key)); ok {
		return v.lendString(val), abi.StatusOK
	}
	return "", abi.StatusNotFound
}

func (v *vm) GetHeaders(m abi.MapType, dst [][2]string) ([][2]string, abi.Status) {
	v.refuse("proxy_get_header_map_pairs")
	hm := v.headerMap(m)
	if hm == nil {
		return dst, abi.StatusNotFound
	}
	for _, h := range *hm {
		dst = append(dst, filtertest.Header{v.lendString(h[0]), v.lendString(h[1])})
	}
	return dst, abi.StatusOK
}

func (v *vm) setHeader(call string, m abi.MapType, key, value string, replace bool) abi.Status {
	v.refuse(call)
	if strings.ContainsAny(key, "\r\n\x00") || strings.ContainsAny(value, "\r\n\x00") {
		v.t.Errorf("native host: %s(%q, %q): CR, LF or NUL in a header", call, key, value)
		return abi.StatusBadArgument
	}
	hm := v.headerMap(m)
	if hm == nil || m == abi.MapHTTPCallResponseHeaders {
		return abi.StatusNotFound
	}
	key, value = strings.Clone(strings.ToLower(key)), strings.Clone(value)
	if replace {
		*hm = slices.DeleteFunc(*hm, func(h filtertest.Header) bool { return h[0] == key })
	}
	*hm = append(*hm, filtertest.Header{key, value})
	return abi.StatusOK
}

func (v *vm) AddHeader(m abi.MapType, key, value string) abi.Status {
	return v.setHeader("proxy_add_header_map_value", m, key, value, false)
}

func (v *vm) ReplaceHeader(m abi.MapType, key, value string) abi.Status {
	return v.setHeader("proxy_replace_header_map_value", m, key, value, true)
}

func (v *vm) RemoveHeader(m abi.MapType, key string) abi.Status {
	v.refuse("proxy_remove_header_map_value")
	hm := v.headerMap(m)
	if hm == nil || m == abi.MapHTTPCallResponseHeaders {
		return abi.StatusNotFound
	}
	key = strings.ToLower(key)
	*hm = slices.DeleteFunc(*hm, func(h filtertest.Header) bool { return h[0] == key })
	return abi.StatusOK
}

// undecidedStream returns the effective context's stream if it is still deciding or
// paused: the only time a local reply or a resume means something.
func (v *vm) undecidedStream() *nativeStream {
	s := v.streams[v.effective]
	if s == nil || (s.state != deciding && s.state != paused) {
		return nil
	}
	return s
}

func (v *vm) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) abi.Status {
	v.refuse("proxy_send_local_response")
	s := v.undecidedStream()
	if s == nil {
		return abi.StatusBadArgument
	}
	for _, h := range headers {
		if strings.ContainsAny(h[0]+h[1], "\r\n\x00") {
			v.t.Errorf("native host: local reply header %q: CR, LF or NUL", h)
			return abi.StatusBadArgument
		}
	}
	if strings.ContainsAny(details, " \t\r\n") {
		v.t.Errorf("native host: local reply details %q: Envoy's response code details hold no whitespace", details)
	}
	r := &filtertest.Reply{Status: int(status), Headers: cloneHeaders(headers), Body: slices.Clone(body), Details: strings.Clone(details)}
	path, _ := filtertest.Get(s.request, ":path")
	if ct, _ := filtertest.Get(s.request, "content-type"); path != "" && grpclocal.IsGRPC(ct) {
		// What Envoy sends a gRPC request instead: a trailers-only 200.
		all := grpclocal.Reply(append([]filtertest.Header{{":status", strconv.Itoa(r.Status)}}, r.Headers...), r.Body, grpcStatus)
		r.Status, r.Headers, r.Body = 200, all[1:], nil
	} else if len(r.Body) == 0 {
		// Envoy sends a bodiless reply without content-type and
		// content-length, whatever the plugin gave
		// (Http::Utility::prepareLocalReply).
		r.Headers = slices.DeleteFunc(r.Headers, func(h filtertest.Header) bool {
			return h[0] == "content-type" || h[0] == "content-length"
		})
	}
	s.deferredReply = r
	v.touched = append(v.touched, s)
	return abi.StatusOK
}

func (v *vm) HTTPCall(cluster string, encoded []byte, body []byte, trailers [][2]string, timeoutMs uint32) (uint32, abi.Status) {
	v.refuse("proxy_http_call")
	// Envoy reads the map the module handed over; one that does not
	// decode is a bug of the filter's, which a test must see.
	headers, err := abi.DecodePairs(encoded)
	if err != nil {
		v.t.Errorf("native host: callout headers: %v", err)
		return 0, abi.StatusBadArgument
	}
	if cluster == "" || cluster == filtertest.UnknownCluster {
		return 0, abi.StatusBadArgument
	}
	for _, pseudo := range []string{":method", ":path", ":authority"} {
		if val, ok := filtertest.Get(headers, pseudo); !ok || val == "" {
			return 0, abi.StatusBadArgument
		}
	}
	for _, h := range headers {
		if strings.ContainsAny(h[0]+h[1], "\r\n\x00") {
			v.t.Errorf("native host: callout header %q: CR, LF or NUL", h)
			return 0, abi.StatusBadArgument
		}
	}
	if v.failNext {
		// A failure of the send itself, after the arguments were accepted.
		v.failNext = false
		return 0, abi.StatusInternalFailure
	}
	v.nextToken += 4
	c := &call{token: v.nextToken, root: v.effective, stream: v.streams[v.effective], callout: filtertest.Callout{
		Cluster: strings.Clone(cluster), Headers: cloneHeaders(headers), Body: slices.Clone(body), TimeoutMs: timeoutMs,
	}}
	v.calls[c.token] = c
	if c.stream != nil {
		c.stream.call = c
	}
	return c.token, abi.StatusOK
}

func (v *vm) ContinueStream(t abi.StreamType) abi.Status {
	v.refuse("proxy_continue_stream")
	s := v.undecidedStream()
	if s == nil || t != abi.StreamRequest {
		return abi.StatusBadArgument
	}
	s.deferredContinue = true
	v.touched = append(v.touched, s)
	return abi.StatusOK
}

func (v *vm) SetEffectiveContext(id uint32) abi.Status {
	v.refuse("proxy_set_effective_context")
	if v.effective == 0 {
		return abi.StatusBadArgument
	}
	if s := v.streams[id]; (s == nil || s.state == done) && !v.isRoot(id) {
		return abi.StatusBadArgument
	}
	v.effective = id
	return abi.StatusOK
}

func (v *vm) GetSharedData(key string) ([]byte, uint32, abi.Status) {
	v.refuse("proxy_get_shared_data")
	sv, ok := v.proc.shared[key]
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return v.lend(sv.value), sv.cas, abi.StatusOK
}

func (v *vm) SetSharedData(key string, value []byte, cas uint32) abi.Status {
	v.refuse("proxy_set_shared_data")
	sv, ok := v.proc.shared[key]
	if ok && cas != 0 && cas != sv.cas {
		return abi.StatusCASMismatch
	}
	v.proc.cas++
	v.proc.shared[strings.Clone(key)] = &sharedValue{value: slices.Clone(value), cas: v.proc.cas}
	return abi.StatusOK
}

func (v *vm) DefineMetric(t abi.MetricType, name string) (uint32, abi.Status) {
	v.refuse("proxy_define_metric")
	if t > abi.MetricHistogram || name == "" {
		return 0, abi.StatusBadArgument
	}
	v.defines[strings.Clone(name)]++
	m, ok := v.proc.metrics[name]
	if !ok {
		m = &metricValue{kind: t}
		v.proc.metrics[strings.Clone(name)] = m
	}
	if m.kind != t {
		return 0, abi.StatusBadArgument
	}
	id := uint32(len(v.metricIDs) + 1)
	v.metricIDs[id] = m
	return id, abi.StatusOK
}

func (v *vm) IncrementMetric(id uint32, delta int64) abi.Status {
	v.refuse("proxy_increment_metric")
	m := v.metricIDs[id]
	switch {
	case m == nil:
		return abi.StatusNotFound
	case m.kind == abi.MetricHistogram, m.kind == abi.MetricCounter && delta <= 0:
		return abi.StatusBadArgument
	}
	m.value += delta
	return abi.StatusOK
}

func (v *vm) RecordMetric(id uint32, value uint64) abi.Status {
	v.refuse("proxy_record_metric")
	m := v.metricIDs[id]
	switch {
	case m == nil:
		return abi.StatusNotFound
	case m.kind == abi.MetricCounter:
		return abi.StatusBadArgument
	case m.kind == abi.MetricHistogram:
		m.value++
	default:
		m.value = int64(value)
	}
	return abi.StatusOK
}

// SetTickPeriod sets the root context's tick period, also when a stream
// calls it, as Envoy does (proxy-wasm-cpp-host's setTimerPeriod takes the
// calling context's root).
func (v *vm) SetTickPeriod(ms uint32) abi.Status {
	v.refuse("proxy_set_tick_period_milliseconds")
	root := v.effective
	if s := v.streams[root]; s != nil {
		root = s.root
	}
	if !v.isRoot(root) {
		return abi.StatusBadArgument
	}
	v.ticks[root] = time.Duration(ms) * time.Millisecond
	return abi.StatusOK
}

func (v *vm) Now() int64 {
	v.refuse("proxy_get_current_time_nanoseconds")
	return v.proc.clock
}

// ---- filtertest.Stream ----

type streamState uint8

const (
	fresh     streamState = iota
	deciding              // in proxy_on_request_headers
	paused                // waiting for the filter
	continued             // went upstream
	replied               // answered by the filter
	done
)

type nativeStream struct {
	vm    *vm
	id    uint32
	root  uint32 // the root context it was created under
	state streamState

	request    []filtertest.Header
	upstream   []filtertest.Header
	wentUp     bool
	response   []filtertest.Header
	inResponse bool
	reply      *filtertest.Reply
	call       *call // pending callout dispatched for this stream

	deferredReply    *filtertest.Reply
	deferredContinue bool
}

// applyDeferred does what the plugin asked during the last callback: a local
// reply wins over a resume.
func (s *nativeStream) applyDeferred() {
	switch {
	case s.deferredReply != nil && (s.state == deciding || s.state == paused):
		s.reply, s.state = s.deferredReply, replied
	case s.deferredContinue && (s.state == deciding || s.state == paused):
		s.goUpstream()
	}
	s.deferredReply, s.deferredContinue = nil, false
}

func (s *nativeStream) goUpstream() {
	s.state, s.wentUp = continued, true
	s.upstream = slices.Clone(s.request)
}

func (s *nativeStream) RequestHeaders(headers []filtertest.Header) bool {
	if s.state != fresh {
		s.vm.t.Fatalf("native host: RequestHeaders twice on one stream")
	}
	s.request = slices.Clone(headers)
	s.state = deciding
	var action abi.Action
	s.vm.callback(s.id, func() { action = s.vm.plugin.OnRequestHeaders(s.id, len(headers), true) })
	if s.state == deciding {
		// Nothing deferred applied: the callback's result decides.
		if action == abi.ActionContinue {
			s.goUpstream()
		} else {
			s.state = paused
		}
	}
	return s.state == continued
}

func (s *nativeStream) Callout() (filtertest.Callout, bool) {
	if s.call == nil {
		return filtertest.Callout{}, false
	}
	return s.call.callout, true
}

func (s *nativeStream) RespondCallout(headers []filtertest.Header, body []byte) {
	v, c := s.vm, s.call
	if c == nil {
		v.t.Fatalf("native host: RespondCallout without a pending callout")
	}
	s.call = nil
	delete(v.calls, c.token)
	if !v.isRoot(s.root) {
		return // cancelled with its root context
	}
	// The answer comes to the root context that made the call.
	v.callback(s.root, func() {
		v.response, v.respond, v.body = c, slices.Clone(headers), slices.Clone(body)
		v.plugin.OnHTTPCallResponse(s.root, c.token, len(headers), len(body), 0)
		v.response, v.respond, v.body = nil, nil, nil
	})
}

func (s *nativeStream) Continued() bool { return s.wentUp }

func (s *nativeStream) LocalReply() (filtertest.Reply, bool) {
	if s.reply == nil {
		return filtertest.Reply{}, false
	}
	return *s.reply, true
}

func (s *nativeStream) UpstreamHeaders() []filtertest.Header { return slices.Clone(s.upstream) }

func (s *nativeStream) ResponseHeaders(headers []filtertest.Header) []filtertest.Header {
	if s.state != continued {
		s.vm.t.Fatalf("native host: ResponseHeaders on a request that did not go upstream")
	}
	s.response = slices.Clone(headers)
	s.inResponse = true
	s.vm.callback(s.id, func() { s.vm.plugin.OnResponseHeaders(s.id, len(headers), true) })
	s.inResponse = false
	return slices.Clone(s.response)
}

func (s *nativeStream) Done() {
	if s.state == done {
		return
	}
	v := s.vm
	v.callback(s.id, func() { v.plugin.OnDelete(s.id) })
	s.state = done
}

// cloneHeaders copies headers a plugin handed over, strings included: the
// plugin may reuse their memory once the call returns.
func cloneHeaders(headers [][2]string) []filtertest.Header {
	if headers == nil {
		return nil
	}
	c := make([]filtertest.Header, len(headers))
	for i, h := range headers {
		c[i] = filtertest.Header{strings.Clone(h[0]), strings.Clone(h[1])}
	}
	return c
}
