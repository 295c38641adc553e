// Package filterwasm runs the compiled filter.wasm in the headless Envoy
// (envoy/wasmhost) behind the filtertest.Host interface, so the filter's table
// of behaviour runs against the real module exactly as it runs natively
// (filter/filtertest/native).
package filterwasm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/internal/gotool"
)

// Build compiles ./filter of the module rooted at repoRoot into dir as the
// Makefile builds build/filter.wasm (gotool.BuildWasm: go build, then
// wasm-opt) and returns the module's path.
func Build(repoRoot, dir string) (string, error) {
	return build(repoRoot, filepath.Join(dir, "filter.wasm"), "./filter")
}

// BuildSoakGC compiles the garbage-collection soak's variant of the filter
// (filter/soakgc.go, -tags soakgc): the same filter, with the collector and
// the scavenger driven hard and the runtime's state logged on every tick.
// It links one runtime variable by name, which the linker allows only with
// -checklinkname=0; the shipped module has neither.
func BuildSoakGC(repoRoot, dir string) (string, error) {
	return build(repoRoot, filepath.Join(dir, "filter-soakgc.wasm"), "./filter", "-tags", "soakgc", "-ldflags=-checklinkname=0")
}

// build compiles the wasip1 reactor pkg of the module rooted at repoRoot
// to out.
func build(repoRoot, out, pkg string, flags ...string) (string, error) {
	if err := gotool.BuildWasm(context.Background(), repoRoot, pkg, out, flags...); err != nil {
		return "", fmt.Errorf("build %s: %w", filepath.Base(out), err)
	}
	return out, nil
}

// Start is the clock time a host starts at.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewHost returns a filtertest.Host: one VM of mod in a proxy process of
// its own (clock, shared data and metrics, which Worker VMs share), with its
// own log, its callouts answered by the test. Callout timeouts run on the
// process clock, as in Envoy with simulated time: a callout still
// unanswered when Advance passes its timeout gets Envoy's 504.
func NewHost(t *testing.T, mod *wasmhost.Module) filtertest.Host {
	p := &process{mod: mod, clock: wasmhost.NewManualClock(Start), stats: wasmhost.NewStats(), shared: wasmhost.NewSharedData()}
	return p.newHost(t)
}

// process is what the VMs of one proxy process share.
type process struct {
	mod    *wasmhost.Module
	clock  *wasmhost.ManualClock
	stats  *wasmhost.Stats
	shared *wasmhost.SharedData
}

func (p *process) newHost(t *testing.T) *host {
	h := &host{t: t, p: p, clock: p.clock, stats: p.stats}
	vm, err := p.mod.NewVM(context.Background(), wasmhost.Options{
		PluginName:  "edgelimit",
		RootID:      "edgelimit",
		VMID:        "edgelimit",
		Dispatcher:  h,
		Clock:       p.clock,
		Stats:       p.stats,
		SharedData:  p.shared,
		Log:         h.log,
		LogLevel:    wasmhost.LogInfo,
		ManualTicks: true,
	})
	if err != nil {
		t.Fatalf("start filter.wasm: %v", err)
	}
	h.vm = vm
	t.Cleanup(h.Close)
	return h
}

type host struct {
	t     *testing.T
	p     *process
	vm    *wasmhost.VM
	clock *wasmhost.ManualClock
	stats *wasmhost.Stats

	mu       sync.Mutex
	logs     []string
	failNext bool
	calls    []*call
	closed   bool
}

type call struct {
	wasmhost.Callout
	respond  func(wasmhost.CalloutResponse)
	answered bool
}

func (h *host) log(_ wasmhost.LogLevel, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logs = append(h.logs, msg)
}

// Cluster accepts every cluster name but filtertest.UnknownCluster: the
// filter's configuration names the sidecar's cluster, and the table
// decides what answers.
func (h *host) Cluster(name string) bool { return name != filtertest.UnknownCluster }

func (h *host) Dispatch(_ context.Context, c wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failNext {
		h.failNext = false
		return errors.New("dispatch failed (FailNextDispatch)")
	}
	h.calls = append(h.calls, &call{Callout: c, respond: respond})
	return nil
}

func (h *host) Configure(config string) bool {
	err := h.vm.Configure(config)
	if err != nil && !errors.Is(err, wasmhost.ErrConfigRejected) {
		h.t.Logf("configure: %v", err)
	}
	return err == nil
}

func (h *host) NewStream() filtertest.Stream {
	s, err := h.vm.NewStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:40000", DestinationAddr: "127.0.0.1:10000", Protocol: "HTTP/1.1"})
	if err != nil {
		h.t.Fatalf("new stream: %v", err)
	}
	return &stream{h: h, s: s}
}

func (h *host) Metric(name string) (int64, bool) { return h.stats.Value(name) }

func (h *host) Logs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.logs...)
}

func (h *host) FailNextDispatch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failNext = true
}

func (h *host) Advance(d time.Duration) {
	h.clock.Advance(d)
	h.vm.Sync() // timeouts that fell due deliver their callbacks
}

func (h *host) StepWall(d time.Duration) { h.clock.StepWall(d) }

func (h *host) Worker() filtertest.Host { return h.p.newHost(h.t) }

// AddPlugin starts a second plugin configuration in the VM, named as the
// first: Envoy gives a new configuration of the same filter a root
// context of its own.
func (h *host) AddPlugin(config string) (filtertest.Host, bool) {
	p, err := h.vm.AddPlugin("edgelimit", "edgelimit", config)
	if err != nil {
		if !errors.Is(err, wasmhost.ErrConfigRejected) {
			h.t.Logf("add plugin: %v", err)
		}
		return nil, false
	}
	return &plugin{host: h, p: p}, true
}

func (h *host) Remove() {
	if p := h.vm.Plugin(); p != nil {
		removePlugin(h.t, p)
	}
}

func removePlugin(t *testing.T, p *wasmhost.Plugin) {
	if err := p.Remove(); err != nil {
		t.Fatalf("remove plugin: %v", err)
	}
	if !p.Removed() {
		t.Fatal("remove plugin: a stream of it is still open")
	}
}

func (h *host) MetricDefinitions(name string) int { return h.vm.MetricDefinitions(name) }

// plugin is a second plugin configuration in a host's VM (AddPlugin): the
// stream, configure, tick and remove calls act on its root context, the
// rest on the VM.
type plugin struct {
	*host
	p *wasmhost.Plugin
}

func (p *plugin) Configure(config string) bool {
	err := p.p.Configure(config)
	if err != nil && !errors.Is(err, wasmhost.ErrConfigRejected) {
		p.t.Logf("configure: %v", err)
	}
	return err == nil
}

func (p *plugin) NewStream() filtertest.Stream {
	s, err := p.p.NewStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:40000", DestinationAddr: "127.0.0.1:10000", Protocol: "HTTP/1.1"})
	if err != nil {
		p.t.Fatalf("new stream: %v", err)
	}
	return &stream{h: p.host, s: s}
}

func (p *plugin) Tick() {
	if err := p.p.Tick(); err != nil {
		p.t.Fatalf("tick: %v", err)
	}
}

func (p *plugin) Remove() { removePlugin(p.t, p.p) }

func (p *plugin) TickPeriod() time.Duration { return p.p.TickPeriod() }

func (p *plugin) RootCallouts() []filtertest.Callout { return p.rootCallouts(p.p.RootContextID()) }

func (p *plugin) RespondRootCallouts(headers []filtertest.Header) {
	p.respondRoot(p.p.RootContextID(), headers)
}

func (h *host) Tick() {
	if err := h.vm.Tick(); err != nil {
		h.t.Fatalf("tick: %v", err)
	}
}

func (h *host) TickPeriod() time.Duration { return h.vm.TickPeriod() }

func (h *host) RootCallouts() []filtertest.Callout { return h.rootCallouts(h.vm.RootContextID()) }

func (h *host) RespondRootCallouts(headers []filtertest.Header) {
	h.respondRoot(h.vm.RootContextID(), headers)
}

// rootPending returns the unanswered calls root made itself, oldest first.
func (h *host) rootPending(root uint32) []*call {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*call
	for _, c := range h.calls {
		if c.ContextID == root && !c.answered {
			out = append(out, c)
		}
	}
	return out
}

func (h *host) rootCallouts(root uint32) []filtertest.Callout {
	var out []filtertest.Callout
	for _, c := range h.rootPending(root) {
		out = append(out, filtertest.Callout{Cluster: c.Cluster, Headers: c.Headers, Body: c.Body, TimeoutMs: uint32(c.Timeout / time.Millisecond)})
	}
	return out
}

func (h *host) respondRoot(root uint32, headers []filtertest.Header) {
	for _, c := range h.rootPending(root) {
		h.mu.Lock()
		c.answered = true
		h.mu.Unlock()
		if headers == nil {
			c.respond(wasmhost.CalloutResponse{Reset: true})
		} else {
			c.respond(wasmhost.CalloutResponse{Headers: headers})
		}
	}
}

func (h *host) Close() {
	h.mu.Lock()
	closed := h.closed
	h.closed = true
	h.mu.Unlock()
	if !closed {
		h.vm.Close()
	}
}

type stream struct {
	h *host
	s *wasmhost.Stream
}

func (s *stream) RequestHeaders(headers []filtertest.Header) bool {
	st, err := s.s.RequestHeaders(headers, true)
	if err != nil {
		s.h.t.Fatalf("request headers: %v", err)
	}
	return st == wasmhost.Continued
}

// pending returns the stream's unanswered callout.
func (s *stream) pending() *call {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	for _, c := range s.h.calls {
		if c.ContextID == s.s.ID() && !c.answered {
			return c
		}
	}
	return nil
}

func (s *stream) Callout() (filtertest.Callout, bool) {
	c := s.pending()
	if c == nil {
		return filtertest.Callout{}, false
	}
	return filtertest.Callout{
		Cluster:   c.Cluster,
		Headers:   c.Headers,
		Body:      c.Body,
		TimeoutMs: uint32(c.Timeout / time.Millisecond),
	}, true
}

func (s *stream) RespondCallout(headers []filtertest.Header, body []byte) {
	c := s.pending()
	if c == nil {
		s.h.t.Fatal("RespondCallout: the stream has no callout waiting")
	}
	s.h.mu.Lock()
	c.answered = true
	s.h.mu.Unlock()
	if headers == nil {
		c.respond(wasmhost.CalloutResponse{Reset: true})
	} else {
		c.respond(wasmhost.CalloutResponse{Headers: headers, Body: body})
	}
	s.h.vm.Sync()
}

func (s *stream) Continued() bool { return s.s.Forwarded() }

func (s *stream) LocalReply() (filtertest.Reply, bool) {
	r, ok := s.s.LocalReply()
	if !ok {
		return filtertest.Reply{}, false
	}
	var headers []filtertest.Header
	for _, h := range r.Headers {
		if h[0] != ":status" {
			headers = append(headers, h)
		}
	}
	return filtertest.Reply{Status: r.Status, Headers: headers, Body: r.Body, Details: r.Details}, true
}

func (s *stream) UpstreamHeaders() []filtertest.Header { return s.s.UpstreamHeaders() }

func (s *stream) ResponseHeaders(headers []filtertest.Header) []filtertest.Header {
	st, out, err := s.s.ResponseHeaders(headers, false)
	if err != nil {
		s.h.t.Fatalf("response headers: %v", err)
	}
	if st == wasmhost.Paused {
		if _, err := s.s.Wait(context.Background()); err != nil {
			s.h.t.Fatalf("response headers: %v", err)
		}
		out = s.s.ResponseHeadersOut()
	}
	return out
}

func (s *stream) Done() { s.s.Done() }
