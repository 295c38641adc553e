package wasmhost

import (
	"context"
	"encoding/binary"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// rootCase runs a script in the root context's phases and checks the
// probe's result line for each listed command, in order of appearance.
type rootCase struct {
	name   string
	phases map[string]string
	want   []string // exact result lines, matched in order among the probe's
}

func checkLines(t *testing.T, logs *logSink, want []string) {
	t.Helper()
	var got []string
	for _, l := range logs.all() {
		if r, ok := strings.CutPrefix(l, "info probe: "); ok {
			got = append(got, strings.TrimSpace(r))
		}
	}
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("missing result line %q (in order); probe said:\n  %s", want[i], strings.Join(got, "\n  "))
	}
}

func TestRootHostCalls(t *testing.T) {
	cases := []rootCase{
		{"log levels and memory", map[string]string{"configure": "log 2 hello;log 5 crit;log 6 bad;badmem;loglevel"},
			[]string{"log=0", "log=0", "log=2", "badmem=6", "loglevel=0 level=0"}},
		{"plugin configuration readable in on_configure only", map[string]string{
			"vm_start":  "buf 7 0 100",
			"configure": "buf 7 1 9;buf 7 100000 5;buf 7 0 0;bufstatus 7",
			"tick":      "buf 7 0 10"},
			// The configuration text starts "[configure]\n".
			[]string{"buf=1 ptr0=true len=0 data=", "buf=0 ptr0=false len=9 data=configure", "buf=0 ptr0=true len=0 data=",
				"buf=0 ptr0=true len=0 data=", "bufstatus=0 len=100", "buf=1 ptr0=true len=0 data="}},
		{"other buffers", map[string]string{"configure": "buf 6 0 100;buf 4 0 10;buf 9 0 1;buf 0 0 10;bufstatus 4"},
			[]string{"buf=0 ptr0=false len=6 data=vm-cfg", "buf=1 ptr0=true len=0 data=", "buf=2 ptr0=true len=0 data=", "buf=0 ptr0=true len=0 data=", "bufstatus=1 len=0"}},
		{"header maps outside a stream", map[string]string{"configure": "get 0 x;pairs 0;add 0 a b;replace 2 a b;remove 0 a;get 8 x;pairs 6;size 0;setpairs 0 a=b"},
			[]string{"get=2 value=", "pairs=0 ptr0=true pairs=", "add=2", "replace=2", "remove=2", "get=2 value=", "pairs=0 ptr0=true pairs=", "size=2 size=0", "setpairs=2"}},
		{"metrics", map[string]string{"configure": "define 0 reqs;inc last 2;inc last 0;inc last -1;record last 5;getm last;" +
			"define 1 level;inc last -3;getm last;record last 9;getm last;" +
			"define 2 lat;record last 7;getm last;inc last 1;define 3 x;inc 8 1;record 9 1;getm 12"},
			[]string{"define=0 id=4", "inc=0", "inc=2", "inc=2", "record=0", "getm=0 value=7",
				"define=0 id=5", "inc=0", "getm=0 value=18446744073709551613", "record=0", "getm=0 value=9",
				"define=0 id=6", "record=0", "getm=2 value=0", "inc=2", "define=2 id=0", "inc=1", "record=1", "getm=1 value=0"}},
		{"shared data CAS", map[string]string{"configure": "sget k;sset k v1 0;sget k;sset k v2 cas;sset k v3 cas;sget k;sset k v4 0;sget k"},
			[]string{"sget=1 value= cas=0", "sset=0", "sget=0 value=v1 cas=1", "sset=0", "sset=8", "sget=0 value=v2 cas=2", "sset=0", "sget=0 value=v4 cas=3"}},
		{"time", map[string]string{"configure": "now;clock"}, []string{"now=0 ns=1700000000000000000", "clock=1700000000000000000"}},
		{"status, done, foreign functions, effective context", map[string]string{"configure": "status;done;foreign compress;effective 999;effective self"},
			[]string{"status=0 code=0 msg=", "done=1", "foreign=1", "effective=2", "effective=0"}},
		{"properties of the plugin", map[string]string{"configure": "prop plugin_name;prop plugin_root_id;prop plugin_vm_id;prop request%00path;setprop a b"},
			[]string{"prop=0 value=probe-plugin", "prop=0 value=probe-root", "prop=0 value=the-vm", "prop=1 value=", "setprop=1"}},
		{"continue and close outside a stream", map[string]string{"configure": "continue 0;continue 3;continue 4;close 1;close 9"},
			[]string{"continue=0", "continue=12", "continue=2", "close=0", "close=2"}},
		{"WASI as Envoy provides it", map[string]string{"configure": "stdout to-stdout;stderr to-stderr;env A;args;random 32"},
			[]string{"env=1", "args=0", "random=<nil> n=32"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vm := newProbeVM(t, PollSleep, Options{PluginName: "probe-plugin", RootID: "probe-root", VMID: "the-vm",
				VMConfig: "vm-cfg", Env: map[string]string{"A": "1"}, ManualTicks: true,
				SharedData: NewSharedData()})
			if err := vm.Configure(script(c.phases)); err != nil {
				t.Fatal(err)
			}
			if c.phases["tick"] != "" {
				vm.Tick()
			}
			checkLines(t, vm.logs, c.want)
		})
	}
}

func TestWASIStdioGoesToTheLog(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(script(map[string]string{"configure": "stdout to-stdout;stderr to-stderr"})); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"info to-stdout", "error to-stderr"} {
		found := false
		for _, l := range vm.logs.all() {
			found = found || l == want
		}
		if !found {
			t.Errorf("log line %q missing: %q", want, vm.logs.all())
		}
	}
}

func TestMetricsAreSharedAndNamedLikeEnvoy(t *testing.T) {
	stats := NewStats()
	cfg := script(map[string]string{"configure": "define 0 hits;inc last 3;define 2 lat;record last 10;record last 30"})
	for i := 0; i < 2; i++ {
		vm := newProbeVM(t, PollSleep, Options{Stats: stats})
		if err := vm.Configure(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if v, ok := stats.Value("hits"); !ok || v != 6 {
		t.Errorf("hits = %d, %t; want 6 (two VMs, 3 each, one metric)", v, ok)
	}
	if v, ok := stats.Value("lat"); !ok || v != 4 {
		t.Errorf("lat samples = %d, %t; want 4", v, ok)
	}
	var b strings.Builder
	stats.WriteText(&b)
	for _, want := range []string{"wasmcustom.hits: 6\n", "wasmcustom.lat: P0(10,10) P25(10,10) P50(10,10) P75(30,30)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("stats text lacks %q:\n%s", want, b.String())
		}
	}
}

// /stats/prometheus names a plugin's metrics as Envoy does (no wasmcustom,
// no envoy_ prefix, '.' made '_') and writes a histogram's cumulative
// buckets: the bootstrap's for a matching name, Envoy's defaults otherwise.
func TestMetricsInThePrometheusFormat(t *testing.T) {
	stats := NewStats()
	stats.SetHistogramBuckets(func(name string) []float64 {
		if name == "wasmcustom.edge.lat_us" {
			return []float64{10, 20, 30}
		}
		return nil
	})
	cfg := script(map[string]string{"configure": "define 0 edge.hits;inc last 3;define 2 edge.lat_us;record last 10;record last 11;record last 30;record last 31;" +
		"define 2 other;record last 7"})
	vm := newProbeVM(t, PollSleep, Options{Stats: stats})
	if err := vm.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := stats.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# TYPE edge_hits counter\nedge_hits{} 3\n",
		"# TYPE edge_lat_us histogram\n" +
			`edge_lat_us_bucket{le="10"} 1` + "\n" + // 10 is at or below 10
			`edge_lat_us_bucket{le="20"} 2` + "\n" +
			`edge_lat_us_bucket{le="30"} 3` + "\n" +
			`edge_lat_us_bucket{le="+Inf"} 4` + "\n" +
			"edge_lat_us_sum{} 82\nedge_lat_us_count{} 4\n",
		// Envoy's default bounds: 7 is above 5 and at or below 10; the
		// largest written in full, as Envoy's %.32g does.
		`other_bucket{le="5"} 0` + "\n" + `other_bucket{le="10"} 1` + "\n",
		`other_bucket{le="3600000"} 1` + "\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("prometheus text lacks %q:\n%s", want, b.String())
		}
	}
}

// Tagged metrics are written as Envoy writes them: one family per
// tag-extracted name, counters before gauges before histograms, each
// family's metrics by full name, the tags as labels in their order (le
// after them), values escaped; a plugin metric left without a usable name
// is not written.
func TestTaggedMetricsInThePrometheusFormat(t *testing.T) {
	stats := NewStats()
	stats.SetTagExtractor(func(name string) (string, []Tag) {
		switch name {
		case "wasmcustom.req.ok":
			return "wasmcustom.req", []Tag{{"result", "ok"}}
		case "wasmcustom.req.fail.slow":
			return "wasmcustom.req", []Tag{{"result", "fail"}, {"why.it", `sl"ow`}}
		case "wasmcustom.lat.a":
			return "wasmcustom.lat", []Tag{{"path", "a"}}
		}
		return name, nil
	})
	cfg := script(map[string]string{"configure": "define 0 req.fail.slow;inc last 2;define 0 req.ok;inc last 5;define 1 gauge;record last 4;" +
		"define 2 lat.a;record last 3;define 0 9lives;inc last 1;define 0 zz;inc last 1"})
	vm := newProbeVM(t, PollSleep, Options{Stats: stats})
	if err := vm.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := stats.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	want := "# TYPE req counter\n" +
		`req{result="fail",why_it="sl\"ow"} 2` + "\n" +
		`req{result="ok"} 5` + "\n" +
		"# TYPE zz counter\nzz{} 1\n" +
		"# TYPE gauge gauge\ngauge{} 4\n" +
		"# TYPE lat histogram\n"
	got := b.String()
	if !strings.HasPrefix(got, want) {
		t.Errorf("prometheus text:\n%s\nwant it to begin:\n%s", got, want)
	}
	for _, want := range []string{`lat_bucket{path="a",le="5"} 1` + "\n", `lat_bucket{path="a",le="+Inf"} 1` + "\n", `lat_sum{path="a"} 3` + "\n", `lat_count{path="a"} 1` + "\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("prometheus text lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "9lives") {
		t.Errorf("a name starting with a digit was written:\n%s", got)
	}
	if n, _ := PrometheusName("cluster.a.upstream_rq"); n != "envoy_cluster_a_upstream_rq" {
		t.Errorf("PrometheusName of a name outside wasmcustom = %q", n)
	}
}

func TestSharedDataAcrossVMs(t *testing.T) {
	shared := NewSharedData()
	a := newProbeVM(t, PollSleep, Options{VMID: "one", SharedData: shared})
	b := newProbeVM(t, PollSleep, Options{VMID: "one", SharedData: shared})
	c := newProbeVM(t, PollSleep, Options{VMID: "two", SharedData: shared})
	if err := a.Configure(script(map[string]string{"configure": "sset k from-a 0"})); err != nil {
		t.Fatal(err)
	}
	for _, v := range []*probeVM{b, c} {
		if err := v.Configure(script(map[string]string{"configure": "sget k"})); err != nil {
			t.Fatal(err)
		}
	}
	checkLines(t, b.logs, []string{"sget=0 value=from-a cas=1"})
	checkLines(t, c.logs, []string{"sget=1 value= cas=0"})
}

func TestTickTimer(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(script(map[string]string{"configure": "tick 100", "tick": "log 2 tick"})); err != nil {
		t.Fatal(err)
	}
	if got := vm.TickPeriod(); got != 100*time.Millisecond {
		t.Fatalf("tick period %v, want 100ms", got)
	}
	ticks := func() int {
		vm.Sync()
		return len(vm.logs.results("log"))
	}
	vm.clock.Advance(99 * time.Millisecond)
	if n := ticks(); n != 0 {
		t.Fatalf("%d ticks before the period passed", n)
	}
	vm.clock.Advance(time.Millisecond)
	vm.Sync() // the tick re-arms on the VM's goroutine
	vm.clock.Advance(100 * time.Millisecond)
	if n := ticks(); n != 2 {
		t.Fatalf("%d ticks after two periods, want 2", n)
	}
}

func TestHTTPCall(t *testing.T) {
	good := ":method=GET,:path=/check,:authority=sidecar"
	cases := []struct {
		name      string
		cmds      string
		fail      error
		want      []string
		wantCalls int
	}{
		{"unknown cluster", "call nowhere " + good + " - 5", nil, []string{"call=2 token=0"}, 0},
		{"missing :path", "call sidecar :method=GET,:authority=s - 5", nil, []string{"call=2 token=0"}, 0},
		{"missing :method", "call sidecar :path=/,:authority=s - 5", nil, []string{"call=2 token=0"}, 0},
		{"missing :authority", "call sidecar :method=GET,:path=/ - 5", nil, []string{"call=2 token=0"}, 0},
		{"negative timeout", "call sidecar " + good + " - 4294967295", nil, []string{"call=2 token=0"}, 0},
		{"malformed headers read as empty", "callraw sidecar 0100000003000000 - 5", nil, []string{"callraw=2 token=0"}, 0},
		{"tokens count by four", "call sidecar " + good + " - 5;call sidecar " + good + " - 0;call nowhere " + good + " - 5;call sidecar " + good + " - 5",
			nil, []string{"call=0 token=4", "call=0 token=8", "call=2 token=0", "call=0 token=12"}, 3},
		{"send failure", "call sidecar " + good + " - 5", errSendFailed, []string{"call=10 token=0"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newFakeDispatcher("sidecar")
			d.fail = c.fail
			vm := newProbeVM(t, PollSleep, Options{Dispatcher: d})
			if err := vm.Configure(script(map[string]string{"configure": c.cmds})); err != nil {
				t.Fatal(err)
			}
			checkLines(t, vm.logs, c.want)
			if n := len(d.all()); n != c.wantCalls {
				t.Errorf("%d calls dispatched, want %d", n, c.wantCalls)
			}
		})
	}
}

func TestHTTPCallRequestAsSent(t *testing.T) {
	d := newFakeDispatcher("sidecar")
	vm := newProbeVM(t, PollSleep, Options{Dispatcher: d})
	if err := vm.Configure(script(map[string]string{"configure": "call sidecar :method=POST,:path=/v1/check,:authority=rl,X-Api-Key=k1 payload 7"})); err != nil {
		t.Fatal(err)
	}
	c := d.last(t)
	want := []Header{{":method", "POST"}, {":path", "/v1/check"}, {":authority", "rl"}, {"x-api-key", "k1"}, {"content-length", "7"}}
	if !slices.Equal(c.Headers, want) || string(c.Body) != "payload" || c.Timeout != 7*time.Millisecond || c.Cluster != "sidecar" || c.Token != 4 {
		t.Errorf("dispatched %+v", c.Callout)
	}
}

func TestHTTPCallResponses(t *testing.T) {
	callback := "buf 4 0 100;get 6 :status;pairs 6;status;get 0 :path"
	cases := []struct {
		name    string
		respond func(c *fakeCall, vm *probeVM)
		want    []string
	}{
		{"answered", func(c *fakeCall, _ *probeVM) {
			c.respond(CalloutResponse{Headers: []Header{{":status", "200"}, {"x-a", "1"}}, Body: []byte("ok")})
		}, []string{"http_call_response token=4 headers=2 body=2 trailers=0", "buf=0 ptr0=false len=2 data=ok",
			"get=0 value=200", "pairs=0 ptr0=false pairs=:status=200,x-a=1", "status=0 code=0 msg=", "get=2 value="}},
		{"timeout is a 504 local reply", func(c *fakeCall, vm *probeVM) {
			vm.clock.Advance(50 * time.Millisecond)
			vm.Sync()
			// A response after the VM handled the timeout is dropped.
			c.respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
		}, []string{"http_call_response token=4 headers=3 body=24 trailers=0", "buf=0 ptr0=false len=24 data=upstream%20request%20timeout",
			"get=0 value=504", "pairs=0 ptr0=false pairs=:status=504,content-length=24,content-type=text%2Fplain"}},
		{"a response received before the VM handles the timeout wins", func(c *fakeCall, vm *probeVM) {
			// The VM is busy while the timer fires and the response
			// arrives, as an Envoy worker whose loop iteration finds
			// both the read event and the expired timer.
			hold := make(chan struct{})
			vm.post(func() { <-hold })
			vm.clock.Advance(50 * time.Millisecond)
			c.respond(CalloutResponse{Headers: []Header{{":status", "200"}}, Body: []byte("ok")})
			close(hold)
		}, []string{"http_call_response token=4 headers=1 body=2 trailers=0", "buf=0 ptr0=false len=2 data=ok",
			"get=0 value=200", "pairs=0 ptr0=false pairs=:status=200"}},
		{"reset is a callback with nothing", func(c *fakeCall, _ *probeVM) {
			c.respond(CalloutResponse{Reset: true})
		}, []string{"http_call_response token=4 headers=0 body=0 trailers=0", "buf=1 ptr0=true len=0 data=",
			"get=2 value=", "pairs=0 ptr0=true pairs=", "status=0 code=11 msg=reset"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newFakeDispatcher("sidecar")
			vm := newProbeVM(t, PollSleep, Options{Dispatcher: d, ManualTicks: true})
			err := vm.Configure(script(map[string]string{
				"configure":          "call sidecar :method=GET,:path=/,:authority=s - 50",
				"http_call_response": callback,
				"tick":               "buf 4 0 100;get 6 :status",
			}))
			if err != nil {
				t.Fatal(err)
			}
			c.respond(d.last(t), vm)
			vm.Sync()
			vm.Tick()
			checkLines(t, vm.logs, c.want)
			if n := len(vm.logs.results("http_call_response token")); n > 1 {
				t.Errorf("%d callbacks for one call", n)
			}
			// Outside the callback the response is gone.
			checkLines(t, vm.logs, []string{"buf=1 ptr0=true len=0 data=", "get=2 value="})
			if err := d.last(t).ctx.Err(); err == nil {
				t.Error("the call's context is still live after its response")
			}
		})
	}
}

func TestInitializeRestrictions(t *testing.T) {
	cases := []struct {
		name    string
		poll    PollMode
		env     string
		wantErr string
	}{
		{"proxy_log allowed", PollSleep, "log 2 from-init", ""},
		{"time call traps", PollSleep, "now", "restricted_callback: env.proxy_get_current_time_nanoseconds"},
		{"shared data traps", PollSleep, "sget k", "restricted_callback: env.proxy_get_shared_data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mod, err := Load(context.Background(), probe(t, ""), ModuleOptions{Poll: c.poll})
			if err != nil {
				t.Fatal(err)
			}
			defer mod.Close(context.Background())
			logs := &logSink{}
			vm, err := mod.NewVM(context.Background(), Options{Log: logs.log, Env: map[string]string{"PROBE_INIT": c.env}})
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer vm.Close()
				if !logs.contains("from-init") {
					t.Errorf("init log line missing: %q", logs.all())
				}
				return
			}
			if err == nil {
				vm.Close()
				t.Fatal("NewVM succeeded")
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q lacks %q", err, c.wantErr)
			}
		})
	}
}

func TestAllocatorRestrictions(t *testing.T) {
	cases := []struct {
		hook    string
		wantErr string
	}{
		{"log 2 in-alloc", ""},
		{"now", "restricted_callback: env.proxy_get_current_time_nanoseconds"},
	}
	for _, c := range cases {
		t.Run(c.hook, func(t *testing.T) {
			vm := newProbeVM(t, PollSleep, Options{Env: map[string]string{"PROBE_ALLOC": url.PathEscape(c.hook)}})
			err := vm.Configure(script(map[string]string{"configure": "buf 6 0 10"}))
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) || !vm.Failed() {
				t.Errorf("Configure = %v (failed %t), want a trap with %q", err, vm.Failed(), c.wantErr)
			}
		})
	}
}

func TestNoFilesystem(t *testing.T) {
	mod, err := Load(context.Background(), probe(t, "files"), ModuleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close(context.Background())
	logs := &logSink{}
	vm, err := mod.NewVM(context.Background(), Options{Log: logs.log})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.Configure(script(map[string]string{"configure": "readfile /etc/hostname"})); err != nil {
		t.Fatal(err)
	}
	checkLines(t, logs, []string{"readfile=open /etc/hostname: No such file or directory"})
}

// TestLegacyWASISet: a module using os file functions imports WASI calls
// that Envoy before its 2026 WASI update lacks; it fails to link there.
func TestLegacyWASISet(t *testing.T) {
	_, err := Load(context.Background(), probe(t, "files"), ModuleOptions{Poll: PollENOSYS})
	if err == nil || !strings.Contains(err.Error(), "does not provide") {
		t.Errorf("Load = %v, want a link failure", err)
	}
	mod, err := Load(context.Background(), probe(t, ""), ModuleOptions{Poll: PollENOSYS})
	if err != nil {
		t.Fatalf("the probe without files: %v", err)
	}
	mod.Close(context.Background())
}

// TestModuleChecks loads modules that lack what Envoy requires before it
// starts one. They are written here byte by byte (exportsOnly): a Go module
// without an export would be compiled for seconds, under the race
// detector for half a minute, to test a check of its export names.
func TestModuleChecks(t *testing.T) {
	cases := []struct {
		name    string
		exports []string
		want    error
	}{
		{"no ABI marker", []string{"proxy_on_memory_allocate", "proxy_on_context_create"}, ErrNoABIVersion},
		{"no allocator", []string{"proxy_abi_version_0_2_1", "proxy_on_context_create"}, ErrNoMalloc},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(context.Background(), exportsOnly(c.exports...), ModuleOptions{})
			if !errors.Is(err, c.want) {
				t.Errorf("Load = %v, want %v", err, c.want)
			}
		})
	}
	// The same modules with both exports load: what the cases above lack
	// is all that fails them.
	m, err := Load(context.Background(), exportsOnly("proxy_abi_version_0_2_1", "proxy_on_memory_allocate", "proxy_on_context_create"), ModuleOptions{})
	if err != nil {
		t.Fatalf("a module with the ABI marker and the allocator: %v", err)
	}
	m.Close(context.Background())
	if _, err := Load(context.Background(), []byte("not wasm"), ModuleOptions{}); err == nil {
		t.Error("Load accepted garbage")
	}
}

// exportsOnly is a wasm module that exports a memory named "memory" and one
// function for each name, with the signature exportSignatures gives it
// (none, one i32 in and one out, or two i32 in, which are all it needs
// here); each function returns its first parameter or nothing.
func exportsOnly(names ...string) []byte {
	types := map[string]byte{"->": 0, "i->i": 1, "ii->": 2}
	section := func(id byte, items [][]byte) []byte {
		body := uleb(nil, uint32(len(items)))
		for _, it := range items {
			body = append(body, it...)
		}
		return append(uleb([]byte{id}, uint32(len(body))), body...)
	}
	var funcs, exports, code [][]byte
	for i, name := range names {
		sig := exportSignatures[name]
		if sig == "" {
			sig = "->"
		}
		ty, ok := types[sig]
		if !ok {
			panic("exportsOnly: no type for " + name + " " + sig)
		}
		funcs = append(funcs, []byte{ty})
		exports = append(exports, append(append(uleb(nil, uint32(len(name))), name...), 0x00, byte(i)))
		body := []byte{0x00, 0x0b} // no locals; end
		if sig == "i->i" {
			body = []byte{0x00, 0x20, 0x00, 0x0b} // no locals; local.get 0; end
		}
		code = append(code, append(uleb(nil, uint32(len(body))), body...))
	}
	exports = append(exports, append([]byte{6}, "memory\x02\x00"...))
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = append(m, section(1, [][]byte{{0x60, 0, 0}, {0x60, 1, 0x7f, 1, 0x7f}, {0x60, 2, 0x7f, 0x7f, 0}})...)
	m = append(m, section(3, funcs)...)
	m = append(m, section(5, [][]byte{{0x00, 0x01}})...) // one memory, at least one page
	m = append(m, section(7, exports)...)
	return append(m, section(10, code)...)
}

// uleb appends v in unsigned LEB128, as wasm writes counts and sizes.
func uleb(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func TestConfigureRejected(t *testing.T) {
	cases := []struct {
		name   string
		phases map[string]string
		want   string
	}{
		{"on_vm_start false", map[string]string{"vm_start": "return 0"}, "proxy_on_vm_start returned false"},
		{"on_configure false", map[string]string{"configure": "return 0"}, "proxy_on_configure returned false"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vm := newProbeVM(t, PollSleep, Options{})
			err := vm.Configure(script(c.phases))
			if !errors.Is(err, ErrConfigRejected) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Configure = %v, want %q", err, c.want)
			}
		})
	}
}

func TestPropertiesOfAStream(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{PluginName: "p"})
	if err := vm.Configure(script(map[string]string{"request_headers": "prop request%00path;prop request%00url_path;prop request%00method;" +
		"prop source%00port;prop source%00address;prop request%00headers%00x-k;setprop my%2Eflag on;prop my%2Eflag;prop nope%00x",
		"response_headers": "prop request%00path;prop response%00code"})); err != nil {
		t.Fatal(err)
	}
	s, err := vm.NewStream(StreamInfo{SourceAddr: "127.0.0.1:4321", DestinationAddr: "127.0.0.1:80", Protocol: "HTTP/1.1"})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.RequestHeaders([]Header{{":method", "GET"}, {":path", "/a?b=1"}, {":authority", "h"}, {"X-K", "v"}}, true)
	if st != Continued {
		t.Fatalf("state %v", st)
	}
	s.ResponseHeaders([]Header{{":status", "200"}}, true)
	s.Done()
	port := make([]byte, 8)
	binary.LittleEndian.PutUint64(port, 4321)
	checkLines(t, vm.logs, []string{"prop=0 value=%2Fa%3Fb=1", "prop=0 value=%2Fa", "prop=0 value=GET",
		"prop=0 value=" + url.PathEscape(string(port)), "prop=0 value=127.0.0.1:4321", "prop=0 value=v", "setprop=0", "prop=0 value=on", "prop=1 value=",
		// Once the request went on, its headers are gone for the plugin.
		"prop=1 value=", "prop=0 value=" + url.PathEscape(string([]byte{200, 0, 0, 0, 0, 0, 0, 0}))})
}

// A timeout that finds its response in the socket, not yet read, lets it
// win, as Envoy reads a ready socket before an expired timer; bytes that
// are no longer waiting by the next look leave the timeout to fire.
func TestHTTPCallTimeoutAndArrivedResponse(t *testing.T) {
	for _, c := range []struct {
		name    string
		respond bool // the response is read after the first look
		want    []string
	}{
		{"arrived, then read: the response wins", true, []string{"http_call_response token=4 headers=1 body=0 trailers=0", "get=0 value=200"}},
		{"arrived, then nothing more: the timeout", false, []string{"http_call_response token=4 headers=3 body=24 trailers=0", "get=0 value=504"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &watchingDispatcher{fakeDispatcher: newFakeDispatcher("sidecar")}
			vm := newProbeVM(t, PollSleep, Options{Dispatcher: d, ManualTicks: true})
			err := vm.Configure(script(map[string]string{
				"configure":          "call sidecar :method=GET,:path=/,:authority=s - 50",
				"http_call_response": "get 6 :status",
			}))
			if err != nil {
				t.Fatal(err)
			}
			call := d.last(t)
			d.arrivedNow.Store(true)
			vm.clock.Advance(50 * time.Millisecond)
			vm.Sync()
			if n := len(vm.logs.results("http_call_response token")); n != 0 {
				t.Fatalf("%d callbacks while the response sat in the socket; want 0", n)
			}
			if c.respond {
				call.respond(CalloutResponse{Headers: []Header{{":status", "200"}}})
			} else {
				d.arrivedNow.Store(false)
			}
			vm.clock.Advance(arrivalRecheck)
			vm.Sync()
			checkLines(t, vm.logs, c.want)
			if n := len(vm.logs.results("http_call_response token")); n != 1 {
				t.Errorf("%d callbacks for one call; want 1", n)
			}
		})
	}
}
