package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Options configure one VM and the plugin it runs.
type Options struct {
	// PluginName, RootID and VMID are the plugin's name, root_id and vm_id
	// from the Envoy configuration (name and root_id those of the plugin
	// Configure starts; AddPlugin names its own). VMID partitions shared
	// data.
	PluginName, RootID, VMID string
	// VMConfig is the vm_config.configuration handed to proxy_on_vm_start.
	VMConfig string
	// FailOpen lets requests through, unfiltered, once the VM has failed;
	// otherwise they get a 503 as in Envoy.
	FailOpen bool
	// Env is vm_config.environment_variables, what WASI environ_get sees.
	// Defaults to none.
	Env map[string]string
	// Dispatcher sends the plugin's proxy_http_call requests. Without one
	// every cluster is unknown (BAD_ARGUMENT).
	Dispatcher Dispatcher
	// Worker is the index, from 0, of the worker thread this VM stands
	// for; each of its calls carries it (Callout.Worker).
	Worker int
	// Clock is the time source; defaults to SystemClock.
	Clock Clock
	// Stats receives the plugin's metrics; defaults to a store of its own.
	// Give every worker's VM the same one, as Envoy shares its stats scope.
	Stats *Stats
	// SharedData is the shared key/value store; defaults to
	// DefaultSharedData, which is process-wide like Envoy's.
	SharedData *SharedData
	// Log receives every line the plugin logs (proxy_log, and WASI stdout
	// at info and stderr at error), and the host's own reports about the
	// VM. Defaults to slog.Default in Envoy's "wasm log <root_id> <vm_id>:"
	// form.
	Log func(level LogLevel, msg string)
	// LogLevel is what proxy_get_log_level answers. Defaults to trace (0),
	// every level; Envoy's default is info.
	LogLevel LogLevel
	// ManualTicks leaves proxy_on_tick to VM.Tick: the period a plugin sets
	// is recorded but no timer runs. For deterministic tests.
	ManualTicks bool
}

// ErrClosed is returned by a VM that has been closed.
var ErrClosed = errors.New("wasm VM closed")

// ErrConfigRejected is wrapped by Configure when the plugin refuses its
// configuration (proxy_on_vm_start or proxy_on_configure returned false).
var ErrConfigRejected = errors.New("plugin rejected its configuration")

// VM is one instance of a module, as Envoy runs one per worker thread. Every
// call into it runs one at a time: on the caller's goroutine when the VM is
// idle, else on the VM's own goroutine in the order the calls came.
type VM struct {
	mod  *Module
	o    Options
	inst api.Module
	ctx  context.Context // carries the VM to its host functions
	stop context.CancelFunc
	id   int64

	// The executor: tasks run one at a time, in order; busy while one
	// runs, on the VM's goroutine or inline on its caller's (submit).
	qmu    sync.Mutex
	qcond  *sync.Cond
	queue  []task
	busy   bool
	closed bool
	exited chan struct{}

	closing   bool // Close's task has run; read and written by tasks
	failed    atomic.Bool
	failMu    sync.Mutex
	failErr   error
	pollCalls atomic.Int64

	// State below is touched only by the task running (busy), one at a
	// time; qmu orders one task's writes before the next task's reads.
	mem         api.Memory
	callbacks   [numCallbacks]export // the module's, by callback
	allocator   export               // the module's allocator
	allowed     map[string]bool      // non-nil: only these host calls may run
	contexts    map[uint32]*vmContext
	nextCtxID   uint32
	plugin      *Plugin   // the one Configure starts; nil before
	plugins     []*Plugin // every plugin not yet ended, oldest first
	current     *vmContext
	effective   uint32
	after       []func()
	text        textArena // what host calls keep of the module's memory
	draining    bool
	stopIter    bool
	configuring *string // plugin configuration while it may be read
	callResp    *CalloutResponse
	nextCallID  uint32
	calls       map[uint32]*pendingCall
	stacks      [4][8]uint64 // callWithStack's, by call depth
	callDepth   int
	metricIDs   map[uint32]*metric
	metricDefs  map[string]int // ids handed out, by metric name
	nextMetric  [3]uint32
	status      uint32
	statusMsg   string
}

// vmContext is a proxy-wasm context: a plugin's root context or one
// stream's.
type vmContext struct {
	id      uint32
	parent  uint32 // 0 for a root context
	plugin  *Plugin
	stream  *Stream
	created bool // proxy_on_context_create has run (in_vm_context_created_)
	props   map[string][]byte
}

// vmCtx is the context the VM's calls into the module carry, so that its
// host functions find the VM: one type assertion (guard), where a value
// context would compare keys through an interface on every host call.
type vmCtx struct {
	context.Context
	vm *VM
}

// NewVM instantiates the module and runs its initialization: _initialize
// (then main or __main_void if exported), or _start. Only proxy_log and the
// WASI calls Envoy allows may run meanwhile; any other host call traps and
// NewVM fails.
func (m *Module) NewVM(ctx context.Context, o Options) (*VM, error) {
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.Stats == nil {
		o.Stats = NewStats()
	}
	if o.SharedData == nil {
		o.SharedData = DefaultSharedData
	}
	if o.LogLevel > logLevelMax {
		return nil, fmt.Errorf("log level: want 0..5, got %d", o.LogLevel)
	}
	if o.Worker < 0 {
		return nil, fmt.Errorf("worker: want >= 0, got %d", o.Worker)
	}
	vm := &VM{
		mod:        m,
		o:          o,
		id:         m.vms.Add(1),
		exited:     make(chan struct{}),
		contexts:   map[uint32]*vmContext{},
		nextCtxID:  1, // 0 is the VM itself
		calls:      map[uint32]*pendingCall{},
		metricIDs:  map[uint32]*metric{},
		metricDefs: map[string]int{},
		// Metric ids carry their kind in the low two bits and step by 4,
		// as Envoy numbers them.
		nextMetric: [3]uint32{uint32(MetricCounter), uint32(MetricGauge), uint32(MetricHistogram)},
	}
	if vm.o.Log == nil {
		vm.o.Log = vm.defaultLog
	}
	vm.qcond = sync.NewCond(&vm.qmu)
	base, stop := context.WithCancel(context.WithoutCancel(ctx))
	vm.ctx = &vmCtx{base, vm}
	vm.stop = stop
	go vm.loop()

	var err error
	if e := vm.do(func() { err = vm.initialize() }); e != nil {
		return nil, e
	}
	if err != nil {
		vm.Close()
		return nil, err
	}
	return vm, nil
}

func (vm *VM) defaultLog(level LogLevel, msg string) {
	slevel := slog.LevelInfo
	switch {
	case level <= LogDebug:
		slevel = slog.LevelDebug
	case level == LogWarn:
		slevel = slog.LevelWarn
	case level >= LogError:
		slevel = slog.LevelError
	}
	// The root_id of the plugin whose context is running, as Envoy's
	// prefix names it.
	rootID := vm.o.RootID
	if vm.current != nil && vm.current.plugin != nil {
		rootID = vm.current.plugin.rootID
	}
	slog.Default().Log(context.Background(), slevel, fmt.Sprintf("wasm log %s %s: %s", rootID, vm.o.VMID, msg))
}

func (vm *VM) initialize() error {
	inst, err := vm.mod.rt.InstantiateModule(vm.ctx, vm.mod.compiled,
		wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		return fmt.Errorf("instantiate: %w", err)
	}
	vm.inst = inst
	vm.mem = inst.Memory()
	fns := map[string]export{}
	for name := range vm.mod.exports {
		if f := inst.ExportedFunction(name); f != nil {
			def := f.Definition()
			fns[name] = export{fn: f, stack: max(len(def.ParamTypes()), len(def.ResultTypes())),
				result: len(def.ResultTypes()) > 0}
		}
	}
	for cb, name := range callbackNames {
		vm.callbacks[cb] = fns[name]
	}
	vm.allocator = fns[vm.mod.alloc]
	vm.allowed = initAllowed(vm.mod.poll)
	defer func() { vm.allowed = nil }()
	run := func(name string, args ...uint64) error {
		if _, err := vm.callWithStack(fns[name], args...); err != nil {
			vm.fail(fmt.Errorf("%s: %w", name, err))
			return vm.Err()
		}
		return nil
	}
	switch {
	case fns["_initialize"].fn != nil:
		if err := run("_initialize"); err != nil {
			return err
		}
		if fns["main"].fn != nil {
			return run("main", 0, 0)
		} else if fns["__main_void"].fn != nil {
			return run("__main_void")
		}
	case fns["_start"].fn != nil:
		return run("_start")
	}
	return nil
}

// Configure starts the plugin in this VM as Envoy does: proxy_on_context_create
// for its root context, proxy_on_vm_start with the VM configuration, then
// proxy_on_configure with config; the plugin is Options' PluginName and
// RootID. A false return from either wraps ErrConfigRejected; a trap fails
// the VM and is returned. Called again, it configures the same root context
// again (proxy_on_configure only, once one succeeded). AddPlugin starts
// further plugins beside it.
func (vm *VM) Configure(config string) error {
	var err error
	if e := vm.do(func() { err = vm.configure(config) }); e != nil {
		return e
	}
	return err
}

func (vm *VM) configure(config string) error {
	if vm.failed.Load() {
		return vm.Err()
	}
	if vm.plugin == nil {
		vm.plugin = vm.newPlugin(vm.o.PluginName, vm.o.RootID)
	}
	return vm.plugin.configure(config)
}

func (vm *VM) newContext(parent uint32) *vmContext {
	for vm.contexts[vm.nextCtxID] != nil || vm.nextCtxID == 0 {
		vm.nextCtxID++
	}
	c := &vmContext{id: vm.nextCtxID, parent: parent}
	vm.nextCtxID++
	vm.contexts[c.id] = c
	return c
}

// RootContextID returns the id of the root context Configure made (0
// before Configure).
func (vm *VM) RootContextID() uint32 {
	var id uint32
	vm.do(func() {
		if vm.plugin != nil {
			id = vm.plugin.id
		}
	})
	return id
}

// Failed reports whether the VM has failed (trapped); Err says why.
func (vm *VM) Failed() bool { return vm.failed.Load() }

// Err returns why the VM failed, or nil.
func (vm *VM) Err() error {
	vm.failMu.Lock()
	defer vm.failMu.Unlock()
	return vm.failErr
}

// fail marks the VM failed, as Envoy does on a trap: no more calls go into
// it, streams are answered 503 (or let through with FailOpen).
func (vm *VM) fail(err error) {
	vm.failMu.Lock()
	first := vm.failErr == nil
	if first {
		vm.failErr = fmt.Errorf("wasm VM failed: %w", err)
	}
	vm.failMu.Unlock()
	if !first {
		return
	}
	vm.failed.Store(true)
	vm.o.Log(LogCritical, vm.failErr.Error())
	for _, p := range vm.plugins {
		p.stopTick()
	}
	for token, c := range vm.calls {
		c.finish()
		delete(vm.calls, token)
	}
	// Streams waiting for a callback stay paused, as in Envoy, which sends
	// them nothing more: the proxy's stream idle timeout ends them
	// (RATIONALE.md: a failed VM).
}

// call runs an export for context c (nil: no context) and reports its
// result. It returns ok false if the export is absent or the VM failed.
func (vm *VM) call(c *vmContext, cb callback, args ...uint64) (uint64, bool) {
	if vm.failed.Load() {
		return 0, false
	}
	f := vm.callbacks[cb]
	if f.fn == nil {
		return 0, false
	}
	prevCur, prevEff := vm.current, vm.effective
	vm.current, vm.effective = c, 0
	res, err := vm.callWithStack(f, args...)
	vm.current, vm.effective = prevCur, prevEff
	if err != nil {
		vm.fail(fmt.Errorf("%s: %w", callbackNames[cb], err))
		return 0, false
	}
	return res, true
}

// callback is an export the host calls by its proxy-wasm name, as an index
// into VM.callbacks, which initialize fills: a call finds its function
// without a map lookup by name (several calls a request).
type callback uint8

const (
	onContextCreate callback = iota
	onVMStart
	onConfigure
	onRequestHeaders
	onResponseHeaders
	onHTTPCallResponse
	onTick
	onLog
	onDone
	onDelete
	numCallbacks
)

var callbackNames = [numCallbacks]string{
	onContextCreate:    "proxy_on_context_create",
	onVMStart:          "proxy_on_vm_start",
	onConfigure:        "proxy_on_configure",
	onRequestHeaders:   "proxy_on_request_headers",
	onResponseHeaders:  "proxy_on_response_headers",
	onHTTPCallResponse: "proxy_on_http_call_response",
	onTick:             "proxy_on_tick",
	onLog:              "proxy_on_log",
	onDone:             "proxy_on_done",
	onDelete:           "proxy_on_delete",
}

// export is one of the module's exported functions, with what a call
// needs to know of its signature: asking wazero (Definition's ParamTypes
// and ResultTypes) makes new slices on every call.
type export struct {
	fn     api.Function
	stack  int  // the stack a call needs: its parameters or results, the more of them
	result bool // whether it returns anything
}

// callWithStack calls f with args and returns its first result (0 if it
// has none). It passes them on one of the VM's reused stacks rather than
// through api.Function.Call, which allocates the stack and the result
// slice on every call. A call from a host function (the allocator) nests
// inside another: each depth has its own stack.
func (vm *VM) callWithStack(f export, args ...uint64) (uint64, error) {
	var stack []uint64
	if vm.callDepth < len(vm.stacks) {
		stack = vm.stacks[vm.callDepth][:]
	} else {
		stack = make([]uint64, len(vm.stacks[0]))
	}
	if f.stack > len(stack) {
		stack = make([]uint64, f.stack)
	}
	copy(stack, args)
	vm.callDepth++
	err := f.fn.CallWithStack(vm.ctx, stack)
	vm.callDepth--
	if err != nil || !f.result {
		return 0, err
	}
	return stack[0], nil
}

// callDrain is call followed by the deferred actions, as every callback in
// Envoy is wrapped in DeferAfterCallActions.
func (vm *VM) callDrain(c *vmContext, cb callback, args ...uint64) (uint64, bool) {
	r, ok := vm.call(c, cb, args...)
	vm.stopIter = false
	vm.drain()
	return r, ok
}

// defer_ queues work for when the current call into the VM has returned.
func (vm *VM) defer_(f func()) { vm.after = append(vm.after, f) }

// drain runs the deferred actions, including any they add.
func (vm *VM) drain() {
	if vm.draining {
		return
	}
	vm.draining = true
	// By index, so that the slice keeps its array for the next call; an
	// action may append more, which this loop runs too. If one panics,
	// the ones after it stay queued, as before it.
	i := 0
	defer func() {
		vm.draining = false
		if i == len(vm.after) {
			clear(vm.after)
			vm.after = vm.after[:0]
		} else {
			vm.after = vm.after[i:]
		}
	}()
	for i < len(vm.after) {
		f := vm.after[i]
		i++
		f()
	}
}

// Tick runs proxy_on_tick on the root context Configure made, now, on the
// VM's goroutine.
func (vm *VM) Tick() error {
	return vm.do(func() {
		if vm.plugin != nil {
			vm.plugin.onTick()
		}
	})
}

// TickPeriod returns the period the plugin Configure started set with
// proxy_set_tick_period_milliseconds (0: none).
func (vm *VM) TickPeriod() time.Duration {
	var d time.Duration
	vm.do(func() {
		if vm.plugin != nil {
			d = vm.plugin.tickPeriod
		}
	})
	return d
}

// MemoryBytes returns the size of the module's linear memory, which grows
// with its heap and never shrinks.
func (vm *VM) MemoryBytes() uint32 {
	var n uint32
	vm.do(func() {
		if vm.mem != nil {
			n = vm.mem.Size()
		}
	})
	return n
}

// PollOneoffCalls returns how many times the module called WASI
// poll_oneoff. A standard-Go module calls it only once its runtime started
// the network poller (its first timer, or os/fmt opening stdio): from then
// on at every garbage collection, which Envoy's older ENOSYS answer turns
// into a crash.
func (vm *VM) PollOneoffCalls() int64 { return vm.pollCalls.Load() }

// MetricDefinitions returns how many ids the module was given for the
// metric name (without "wasmcustom.") in this VM. Envoy keeps every id for
// the VM's life, so a module defining its metrics again for each new
// plugin configuration makes this grow.
func (vm *VM) MetricDefinitions(name string) int {
	var n int
	vm.do(func() { n = vm.metricDefs[name] })
	return n
}

// Stats returns the metrics store the VM writes to.
func (vm *VM) Stats() *Stats { return vm.o.Stats }

// Close shuts every plugin down as Envoy does (proxy_on_done, then
// proxy_on_delete, on each root context, oldest first), then stops the VM.
// Safe to call more than once.
func (vm *VM) Close() {
	_ = vm.do(func() {
		vm.closing = true
		for _, p := range slices.Clone(vm.plugins) {
			root := p.root
			if root.created && !p.pendingDone && !vm.failed.Load() {
				if r, ok := vm.callDrain(root, onDone, uint64(root.id)); !ok || r != 0 {
					vm.callDrain(root, onDelete, uint64(root.id))
				}
			}
			p.gone = true
			p.stopTick()
		}
		for token, c := range vm.calls {
			c.finish()
			delete(vm.calls, token)
		}
		// Streams still waiting are torn down with the VM.
		for _, c := range vm.contexts {
			if s := c.stream; s != nil && s.state == Paused {
				s.reset()
			}
		}
	})
	vm.qmu.Lock()
	if !vm.closed {
		vm.closed = true
		vm.qcond.Broadcast()
	}
	vm.qmu.Unlock()
	// Ends the context host functions see; a call running in the module
	// is waited for, as Envoy cannot stop one either (RATIONALE.md).
	vm.stop()
	<-vm.exited
	if vm.inst != nil {
		vm.inst.Close(context.Background())
	}
}

// loop is the VM's goroutine: it runs the queued tasks that no caller
// running inline went on to (runClaimed), one at a time, in order, each
// once no task runs inline (submit); it ends once the VM is closed, idle
// and nothing is queued.
func (vm *VM) loop() {
	defer close(vm.exited)
	for {
		vm.qmu.Lock()
		for vm.busy || (len(vm.queue) == 0 && !vm.closed) {
			vm.qcond.Wait()
		}
		if len(vm.queue) == 0 {
			vm.qmu.Unlock()
			return
		}
		t := vm.next()
		vm.busy = true
		vm.qmu.Unlock()
		vm.run(t)
		vm.qmu.Lock()
		vm.busy = false
		vm.qmu.Unlock()
		t.ran()
	}
}

// submit takes t for the VM under one lock: with inline set and the VM
// idle (no task running and none queued, so t is next in order anyway) it
// marks the VM busy and reports runNow, and the caller runs t itself
// (runClaimed); else t is queued for the VM's goroutine. ok is false, and
// nothing done, if the VM is closed.
//
// Envoy runs a worker's VM on the thread that has the event in hand; here
// an idle VM costs the caller no handoff to the VM's goroutine and back,
// each of which can wake a thread on another CPU (RATIONALE.md, "What a
// request costs the host"). An inline submit must not come from a task,
// nor from a caller holding a lock that a task takes.
func (vm *VM) submit(t task, inline bool) (runNow, ok bool) {
	vm.qmu.Lock()
	defer vm.qmu.Unlock()
	if vm.closed {
		return false, false
	}
	if inline && !vm.busy && len(vm.queue) == 0 {
		vm.busy = true
		return true, true
	}
	vm.queue = append(vm.queue, t)
	if !vm.busy {
		// A busy VM's runner looks at the queue when its task ends
		// (loop, runClaimed): waking the VM's goroutine now would only
		// have it wait again.
		vm.qcond.Signal()
	}
	return false, true
}

// runClaimed runs f, which submit let the caller run. Then, while idle
// (nil: never) reports that the caller has nothing to do but wait (its
// stream paused, its request answered), the caller goes on to what was
// queued meanwhile, in order, up to maxDrain tasks, as an Envoy worker
// goes on to the events that came while it was busy. What is left, and
// everything once the VM is closed, goes to the VM's goroutine: a caller
// with work of its own hands it over at once, and the VM's goroutine runs
// it beside that work.
func (vm *VM) runClaimed(t task, idle func() bool) {
	vm.run(t)
	for n := 0; n < maxDrain && idle != nil && idle(); n++ {
		vm.qmu.Lock()
		if len(vm.queue) == 0 || vm.closed {
			vm.qmu.Unlock()
			break
		}
		t := vm.next()
		vm.qmu.Unlock()
		vm.run(t)
		t.ran()
	}
	vm.qmu.Lock()
	vm.busy = false
	if len(vm.queue) > 0 || vm.closed {
		vm.qcond.Signal()
	}
	vm.qmu.Unlock()
}

// next takes the first queued task off the queue, which is not empty;
// vm.qmu is held.
func (vm *VM) next() task {
	t := vm.queue[0]
	vm.queue[0] = task{}
	if len(vm.queue) == 1 {
		// Empty again: keep the array for the next task (the usual case
		// at a VM that is not in a burst) rather than append a new one.
		vm.queue = vm.queue[:0]
	} else {
		vm.queue = vm.queue[1:]
	}
	return t
}

// maxDrain bounds the queued tasks a caller runs after its own (runClaimed):
// under sustained load a handler whose stream has ended, or a connection's
// reader, gets back to its connection.
const maxDrain = 16

// exec runs t at once if the VM is idle, else queues it as post does
// (submit); it reports false if the VM is closed. idle is runClaimed's.
func (vm *VM) exec(t task, idle func() bool) bool {
	runNow, ok := vm.submit(t, true)
	if runNow {
		vm.runClaimed(t, idle)
	}
	return ok
}

// always is an idle for a caller that only waits after its task.
func always() bool { return true }

// task is one entry of the VM's queue: f, or one of the operations every
// request makes (op), named rather than made a closure, so that a request
// allocates none for them. done, if not nil, gets a token once the task has
// run (do's wait).
type task struct {
	f    func()
	op   taskOp
	s    *Stream // the stream of a stream's operation
	n    uint64  // the stream's task number (Stream.start), or the call's token (opDeliver)
	done chan struct{}
}

type taskOp uint8

const (
	opFunc            taskOp = iota // f
	opRequestHeaders                // the stream's request headers (RequestHeadersWait)
	opResponseHeaders               // its response headers (ResponseHeadersWait)
	opEndStream                     // its end (DoneAsync)
	opDeliver                       // a callout's received answer, to its callback
)

// ran tells the task's waiter, if any (do), that it has run.
func (t task) ran() {
	if t.done != nil {
		t.done <- struct{}{}
	}
}

// doneChans are do's reusable channels, one buffered slot each: a task
// signals its waiter without a channel made and closed per call.
var doneChans = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

// run runs one task; a panic in the host's own code fails the VM instead of
// the process.
func (vm *VM) run(t task) {
	defer func() {
		if r := recover(); r != nil {
			// Whatever was deferred belonged to the broken call; what
			// fail queues (answers to waiting streams) must still run.
			vm.after, vm.draining, vm.callDepth = nil, false, 0
			vm.fail(fmt.Errorf("host panic: %v\n%s", r, debug.Stack()))
			vm.drainQuietly()
		}
	}()
	switch t.op {
	case opFunc:
		t.f()
	case opDeliver:
		vm.deliverReceived(uint32(t.n))
	default:
		t.s.run(t.op, t.n)
	}
}

// drainQuietly runs the deferred actions after a host panic, dropping any
// further panic: the VM is failed already.
func (vm *VM) drainQuietly() {
	defer func() {
		if recover() != nil {
			vm.after, vm.draining = nil, false
		}
	}()
	vm.drain()
}

// post queues f to run on the VM's goroutine and returns at once; it
// reports false if the VM is closed.
func (vm *VM) post(f func()) bool {
	_, ok := vm.submit(task{f: f}, false)
	return ok
}

// do runs f, at once if the VM is idle, else on the VM's goroutine after
// what is queued (submit), and waits for it. It must not be called from a
// task.
func (vm *VM) do(f func()) error {
	done := doneChans.Get().(chan struct{})
	runNow, ok := vm.submit(task{f: f, done: done}, true)
	if !ok || runNow {
		doneChans.Put(done)
		if !ok {
			return ErrClosed
		}
		vm.runClaimed(task{f: f}, nil)
		return nil
	}
	select {
	case <-done:
		doneChans.Put(done)
		return nil
	case <-vm.exited:
		// Closed while f was queued or running.
		select {
		case <-done:
			doneChans.Put(done)
			return nil
		default:
			// The token may still come: the channel is not reused.
			return ErrClosed
		}
	}
}

// Sync waits until every task queued so far (HTTP-call callbacks included)
// has run.
func (vm *VM) Sync() error { return vm.do(func() {}) }

// log sends a line to the configured log.
func (vm *VM) log(level LogLevel, msg string) { vm.o.Log(level, msg) }
