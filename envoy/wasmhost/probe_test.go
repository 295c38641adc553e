package wasmhost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/gotool"
)

// The probe module (testdata/probe) is built once per test binary and per
// variant (build tags), into a directory removed when the tests end.
var (
	probeDir  string
	probeMu   sync.Mutex
	probeWasm = map[string][]byte{}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wasmhost-probe-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	probeDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// probe returns the probe module built with the given build tags.
func probe(t testing.TB, tags string) []byte {
	t.Helper()
	probeMu.Lock()
	defer probeMu.Unlock()
	if b, ok := probeWasm[tags]; ok {
		return b
	}
	out := filepath.Join(probeDir, "probe"+strings.ReplaceAll(tags, ",", "_")+".wasm")
	var flags []string
	if tags != "" {
		flags = []string{"-tags", tags}
	}
	if err := gotool.GoBuildWasm(context.Background(), filepath.Join("testdata", "probe"), ".", out, flags...); err != nil {
		t.Fatalf("build probe (tags %q): %v", tags, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	probeWasm[tags] = b
	return b
}

// logSink collects what a VM logs.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) log(level LogLevel, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level.String()+" "+msg)
}

func (l *logSink) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// result returns the first probe line for a command ("cmd=..."), without
// the "info probe: " prefix, or "" if there is none.
func (l *logSink) result(cmd string) string {
	for _, line := range l.all() {
		if r, ok := strings.CutPrefix(line, "info probe: "+cmd+"="); ok {
			return cmd + "=" + strings.TrimSpace(r)
		}
	}
	return ""
}

// results returns every probe line for a command.
func (l *logSink) results(cmd string) []string {
	var out []string
	for _, line := range l.all() {
		if r, ok := strings.CutPrefix(line, "info probe: "+cmd+"="); ok {
			out = append(out, cmd+"="+strings.TrimSpace(r))
		}
	}
	return out
}

func (l *logSink) contains(sub string) bool {
	for _, line := range l.all() {
		if strings.Contains(line, sub) {
			return true
		}
	}
	return false
}

type probeVM struct {
	*VM
	logs  *logSink
	clock *ManualClock
}

// newProbeVM loads the probe (mode poll) and starts a VM; o.Log is set to
// a sink, o.Clock to a manual clock unless given.
func newProbeVM(t testing.TB, poll PollMode, o Options) *probeVM {
	t.Helper()
	ctx := context.Background()
	mod, err := Load(ctx, probe(t, ""), ModuleOptions{Poll: poll})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mod.Close(ctx) })
	logs := &logSink{}
	o.Log = logs.log
	var clock *ManualClock
	if o.Clock == nil {
		clock = NewManualClock(time.Unix(1700000000, 0))
		o.Clock = clock
	}
	if o.VMID == "" {
		o.VMID = t.Name()
	}
	vm, err := mod.NewVM(ctx, o)
	if err != nil {
		t.Fatalf("NewVM: %v\nlogs:\n%s", err, strings.Join(logs.all(), "\n"))
	}
	t.Cleanup(vm.Close)
	return &probeVM{VM: vm, logs: logs, clock: clock}
}

// script builds a probe configuration from phase → commands.
func script(phases map[string]string) string {
	names := make([]string, 0, len(phases))
	for phase := range phases {
		names = append(names, phase)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, phase := range names {
		fmt.Fprintf(&b, "[%s]\n%s\n", phase, strings.ReplaceAll(phases[phase], ";", "\n"))
	}
	return b.String()
}

func TestProbeSmoke(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	if err := vm.Configure(script(map[string]string{"configure": "log 2 hello;now;buf 7 0 5"})); err != nil {
		t.Fatal(err)
	}
	for _, l := range vm.logs.all() {
		t.Log(l)
	}
}
