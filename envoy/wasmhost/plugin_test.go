package wasmhost

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pluginScript is a probe script that logs "<tag>-<phase>" in every
// callback of its root context and its streams, plus extra commands.
func pluginScript(tag string, extra map[string]string) string {
	phases := map[string]string{}
	for _, phase := range []string{"context_create", "vm_start", "configure", "request_headers", "http_call_response", "tick", "done", "delete"} {
		phases[phase] = "log 2 " + tag + "-" + phase
	}
	for phase, cmds := range extra {
		phases[phase] += ";" + cmds
	}
	return script(phases)
}

// marks returns the lines the scripts logged with tags, in order, without
// the level.
func (l *logSink) marks(tags ...string) []string {
	var out []string
	for _, line := range l.all() {
		msg := strings.TrimPrefix(line, "info ")
		for _, tag := range tags {
			if strings.HasPrefix(msg, tag+"-") {
				out = append(out, msg)
			}
		}
	}
	return out
}

func (l *logSink) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = nil
}

// A second plugin in a running VM gets a root context of its own, started
// as Envoy starts it (context_create, vm_start, configure), and lives
// beside the first: each stream is created under its plugin's root and
// runs that plugin's configuration, each root has its own tick, and an
// HTTP call's answer comes to the root context of whoever made it.
func TestSecondPluginInOneVM(t *testing.T) {
	d := newFakeDispatcher("sidecar")
	vm := newProbeVM(t, PollSleep, Options{PluginName: "plugin-a", RootID: "root-a", Dispatcher: d, ManualTicks: true})
	if err := vm.Configure(pluginScript("a", map[string]string{"configure": "tick 100"})); err != nil {
		t.Fatal(err)
	}
	b, err := vm.AddPlugin("plugin-b", "root-b", pluginScript("b", map[string]string{
		"configure":       "tick 250",
		"request_headers": "prop plugin_root_id;prop plugin_name;parent;call sidecar :method=POST,:path=/b,:authority=rl - 0",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := vm.logs.marks("a", "b"), []string{"a-context_create", "a-vm_start", "a-configure", "b-context_create", "b-vm_start", "b-configure"}; !slices.Equal(got, want) {
		t.Errorf("start-up %q, want %q", got, want)
	}
	if b.RootContextID() == vm.RootContextID() || b.RootContextID() == 0 {
		t.Errorf("root contexts %d and %d, want two", vm.RootContextID(), b.RootContextID())
	}
	if vm.TickPeriod() != 100*time.Millisecond || b.TickPeriod() != 250*time.Millisecond {
		t.Errorf("tick periods %v and %v, want 100ms and 250ms", vm.TickPeriod(), b.TickPeriod())
	}

	vm.logs.reset()
	sa, err := vm.NewStream(StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.NewStream(StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.RequestHeaders([]Header{{":path", "/"}}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.RequestHeaders([]Header{{":path", "/"}}, true); err != nil {
		t.Fatal(err)
	}
	if got, want := vm.logs.marks("a", "b"), []string{"a-context_create", "a-request_headers", "b-context_create", "b-request_headers"}; !slices.Equal(got, want) {
		t.Errorf("streams ran %q, want %q", got, want)
	}
	for _, want := range []string{"prop=0 value=root-b", "prop=0 value=plugin-b", "parent=" + strconv.FormatUint(uint64(b.RootContextID()), 10)} {
		if !slices.Contains(vm.logs.results(strings.SplitN(want, "=", 2)[0]), want) {
			t.Errorf("stream of b: no %q in %q", want, vm.logs.all())
		}
	}
	vm.logs.reset()
	d.last(t).respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
	vm.Sync()
	if err := b.Tick(); err != nil {
		t.Fatal(err)
	}
	if err := vm.Tick(); err != nil {
		t.Fatal(err)
	}
	if got, want := vm.logs.marks("a", "b"), []string{"b-http_call_response", "b-tick", "a-tick"}; !slices.Equal(got, want) {
		t.Errorf("root callbacks %q, want %q", got, want)
	}
	sa.Done()
	sb.Done()
}

// Envoy's proxy_define_metric hands out a new id on every call and the
// stats scope the same stat for the same name: two plugins of a VM
// defining one name get two ids and update one metric.
func TestPluginsDefiningOneMetric(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(script(map[string]string{"configure": "define 0 shared.count;inc last 2"})); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.AddPlugin("b", "b", script(map[string]string{"configure": "define 0 shared.count;inc last 3;getm last"})); err != nil {
		t.Fatal(err)
	}
	if got, want := vm.logs.results("define"), []string{"define=0 id=4", "define=0 id=8"}; !slices.Equal(got, want) {
		t.Errorf("defines %q, want %q", got, want)
	}
	if got := vm.logs.result("getm"); got != "getm=0 value=5" {
		t.Errorf("%s, want value=5 (one counter)", got)
	}
	if v, _ := vm.Stats().Value("shared.count"); v != 5 {
		t.Errorf("shared.count = %d, want 5", v)
	}
	if n := vm.MetricDefinitions("shared.count"); n != 2 {
		t.Errorf("MetricDefinitions = %d, want 2", n)
	}
}

// Removing a plugin ends its root context once its last stream has ended
// (proxy_on_done, proxy_on_delete), cancels the HTTP calls its root waits
// for and stops its tick; the VM and the other plugin go on.
func TestRemovePlugin(t *testing.T) {
	d := newFakeDispatcher("sidecar")
	vm := newProbeVM(t, PollSleep, Options{Dispatcher: d, ManualTicks: true})
	if err := vm.Configure(pluginScript("a", nil)); err != nil {
		t.Fatal(err)
	}
	b, err := vm.AddPlugin("b", "b", pluginScript("b", map[string]string{"configure": "tick 100;call sidecar :method=GET,:path=/,:authority=rl - 0"}))
	if err != nil {
		t.Fatal(err)
	}
	rootCall := d.last(t)
	s, err := b.NewStream(StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RequestHeaders(nil, true); err != nil {
		t.Fatal(err)
	}
	vm.logs.reset()
	if err := b.Remove(); err != nil {
		t.Fatal(err)
	}
	if b.Removed() || len(vm.logs.marks("b")) != 0 {
		t.Fatalf("removed while its stream is open: %t, %q", b.Removed(), vm.logs.marks("b"))
	}
	if _, err := b.NewStream(StreamInfo{}); !errors.Is(err, ErrPluginRemoved) {
		t.Errorf("new stream on a removed plugin: %v, want ErrPluginRemoved", err)
	}
	s.Done()
	// The stream's proxy_on_done and proxy_on_delete, then the root's.
	if got, want := vm.logs.marks("b"), []string{"b-done", "b-delete", "b-done", "b-delete"}; !slices.Equal(got, want) || !b.Removed() {
		t.Errorf("after its last stream: %q (removed %t), want %q", got, b.Removed(), want)
	}
	if rootCall.ctx.Err() == nil || vm.PendingCalls() != 0 {
		t.Errorf("the removed root's call is still pending (%d pending)", vm.PendingCalls())
	}
	rootCall.respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
	b.Tick()
	vm.Sync()
	if got := vm.logs.marks("b"); len(got) != 4 {
		t.Errorf("a removed plugin got callbacks: %q", got)
	}

	// The first plugin and the VM go on.
	vm.logs.reset()
	sa, err := vm.NewStream(StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	sa.RequestHeaders(nil, true)
	sa.Done()
	vm.Tick()
	if got, want := vm.logs.marks("a", "b"), []string{"a-context_create", "a-request_headers", "a-done", "a-delete", "a-tick"}; !slices.Equal(got, want) {
		t.Errorf("first plugin after the removal: %q, want %q", got, want)
	}
	vm.logs.reset()
	vm.Close()
	if got, want := vm.logs.marks("a", "b"), []string{"a-done", "a-delete"}; !slices.Equal(got, want) {
		t.Errorf("Close: %q, want %q", got, want)
	}
}

// A root context whose proxy_on_done returns false stays until it calls
// proxy_done; proxy_on_delete follows once that call returns. proxy_done
// from any other context is NOT_FOUND.
func TestRemovePluginWaitsForProxyDone(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{ManualTicks: true})
	if err := vm.Configure(pluginScript("a", map[string]string{"tick": "done"})); err != nil {
		t.Fatal(err)
	}
	b, err := vm.AddPlugin("b", "b", pluginScript("b", map[string]string{"done": "return 0", "tick": "done"}))
	if err != nil {
		t.Fatal(err)
	}
	vm.Tick()
	if got := vm.logs.result("done"); got != "done=1" {
		t.Errorf("proxy_done from a live root: %q, want done=1 (NOT_FOUND)", got)
	}
	vm.logs.reset()
	b.Remove()
	if b.Removed() {
		t.Fatal("removed although proxy_on_done returned false")
	}
	b.Tick()
	if got, want := vm.logs.marks("b"), []string{"b-done", "b-tick", "b-delete"}; !slices.Equal(got, want) || !b.Removed() {
		t.Errorf("%q (removed %t), want %q", got, b.Removed(), want)
	}
	if got := vm.logs.result("done"); got != "done=0" {
		t.Errorf("proxy_done from the pending root: %q, want done=0", got)
	}
}

// A plugin that refuses its configuration is ended again and the VM keeps
// serving the others.
func TestAddPluginRejected(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(pluginScript("a", nil)); err != nil {
		t.Fatal(err)
	}
	vm.logs.reset()
	_, err := vm.AddPlugin("b", "b", pluginScript("b", map[string]string{"configure": "return 0"}))
	if !errors.Is(err, ErrConfigRejected) {
		t.Fatalf("AddPlugin: %v, want ErrConfigRejected", err)
	}
	if got, want := vm.logs.marks("b"), []string{"b-context_create", "b-vm_start", "b-configure", "b-done", "b-delete"}; !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
	if vm.Failed() {
		t.Fatal(vm.Err())
	}
	s, err := vm.NewStream(StreamInfo{})
	if err != nil {
		t.Fatal(err)
	}
	s.RequestHeaders(nil, true)
	if !slices.Contains(vm.logs.marks("a"), "a-request_headers") {
		t.Errorf("the first plugin no longer runs: %q", vm.logs.all())
	}
	s.Done()
}
