package filterwasm

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/filtertest"
)

// soakBursts and soakBurstSize shape the filter soak: bursts of requests all
// held at once (their sidecar checks unanswered, as when the sidecar slows
// down), then all answered. Each burst grows the module's heap and lets it
// shrink again, which gives the Go runtime's scavenger work, and the
// scavenger paces itself with a runtime timer: from then on every GC polls
// with poll_oneoff. -soak.bursts raises the count for a long run.
var (
	soakBursts    = flag.Int("soak.bursts", 6, "bursts per poll_oneoff mode in TestFilterSoakPollOneoff")
	soakBurstSize = flag.Int("soak.burst", 3000, "requests held at once per burst")
)

// heldSidecar keeps every check until release answers them all "allowed".
type heldSidecar struct {
	mu   sync.Mutex
	held []func(wasmhost.CalloutResponse)
}

func (*heldSidecar) Cluster(string) bool { return true }

func (d *heldSidecar) Dispatch(_ context.Context, _ wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.held = append(d.held, respond)
	return nil
}

func (d *heldSidecar) release() {
	d.mu.Lock()
	held := d.held
	d.held = nil
	d.mu.Unlock()
	answer := filtertest.SidecarAnswer("free", 100, 10, 99.5, 1) // the sidecar's own 200
	for _, respond := range held {
		respond(wasmhost.CalloutResponse{Headers: answer})
	}
}

type soakResult struct {
	requests int   // sent before the VM failed, or all of them
	bursts   int   // bursts run
	failed   error // nil: the VM survived
	peakKiB  uint32
	polls    int64 // WASI poll_oneoff calls the module made
}

// soakRun runs bursts through one VM of the module at path under the given
// poll_oneoff answer, as long as more(bursts run so far) says, calling
// afterBurst once each burst is over. log receives the module's log lines.
func soakRun(t *testing.T, path string, poll wasmhost.PollMode, size int, more func(int) bool,
	afterBurst func(*wasmhost.VM), log func(string)) soakResult {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := wasmhost.Load(context.Background(), b, wasmhost.ModuleOptions{Poll: poll})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	d := &heldSidecar{}
	vm, err := m.NewVM(context.Background(), wasmhost.Options{Dispatcher: d, VMID: "soak", SharedData: wasmhost.NewSharedData(),
		Log: func(_ wasmhost.LogLevel, line string) { log(line) }})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	// Not the shipped 5 ms: a burst's callouts are held unanswered for as
	// long as the burst takes to send (seconds), and must not time out
	// meanwhile, or the heap would never hold the burst.
	if err := vm.Configure(`{"timeout_ms": 60000}`); err != nil {
		t.Fatal(err)
	}
	var res soakResult
	failed := func() bool {
		if !vm.Failed() {
			return false
		}
		res.failed = vm.Err()
		res.polls = vm.PollOneoffCalls()
		return true
	}
	for ; more(res.bursts); res.bursts++ {
		streams := make([]*wasmhost.Stream, 0, size)
		for i := 0; i < size; i++ {
			s, err := vm.NewStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:1", DestinationAddr: "127.0.0.1:2"})
			if err != nil {
				t.Fatal(err)
			}
			res.requests++
			s.RequestHeaders([]wasmhost.Header{{":method", "GET"}, {":path", "/orders/" + strconv.Itoa(i)},
				{":authority", "shop"}, {"x-api-key", "key-" + strconv.Itoa(res.requests)}}, true)
			streams = append(streams, s)
			if failed() {
				return res
			}
		}
		if kib := vm.MemoryBytes() >> 10; kib > res.peakKiB {
			res.peakKiB = kib
		}
		d.release()
		// A failed VM leaves its paused streams waiting, as Envoy does:
		// only a live one is waited for.
		if err := vm.Sync(); err != nil || failed() {
			return res
		}
		for _, s := range streams {
			if st, err := s.Wait(context.Background()); err == nil && st == wasmhost.Continued {
				s.ResponseHeaders([]wasmhost.Header{{":status", "200"}}, false)
			}
			s.Done()
		}
		afterBurst(vm)
		if failed() {
			return res
		}
	}
	res.polls = vm.PollOneoffCalls()
	return res
}

// filterSoak runs the bursts through one VM of the shipped filter.wasm
// under the given poll_oneoff answer.
func filterSoak(t *testing.T, poll wasmhost.PollMode, bursts, size int) soakResult {
	filterModule(t) // builds filter.wasm
	return soakRun(t, modDir+"/filter.wasm", poll, size, func(n int) bool { return n < bursts },
		func(*wasmhost.VM) {}, func(string) {})
}

// TestFilterSoakPollOneoff is the GC-heavy soak of filter.wasm under each
// poll_oneoff answer; its result decides the minimum Envoy version. The
// filter must survive every answer, and it does under Envoy's older ENOSYS
// only because its Go runtime never starts the network poller (no os, no
// fmt, no timers): it never calls poll_oneoff. Should a change make it call
// poll_oneoff, this test fails, and the minimum Envoy version must rise to
// the release with proxy-wasm-cpp-host's 2026 WASI update.
func TestFilterSoakPollOneoff(t *testing.T) {
	for _, poll := range []wasmhost.PollMode{wasmhost.PollSleep, wasmhost.PollNoEvents, wasmhost.PollENOSYS} {
		t.Run(poll.String(), func(t *testing.T) {
			r := filterSoak(t, poll, *soakBursts, *soakBurstSize)
			t.Logf("filter.wasm, poll_oneoff %s: %d requests in bursts of %d, peak linear memory %d KiB, poll_oneoff calls %d, VM failure: %v",
				poll, r.requests, *soakBurstSize, r.peakKiB, r.polls, r.failed)
			if r.failed != nil {
				t.Fatalf("the VM failed after %d requests: %v", r.requests, r.failed)
			}
			if r.polls != 0 {
				t.Errorf("filter.wasm called poll_oneoff %d times: its runtime started the network poller, so older Envoy (ENOSYS) would crash it at a GC", r.polls)
			}
		})
	}
}

// soakDuration turns TestFilterSoakGC into a long run: bursts for this long
// under each poll_oneoff answer instead of -soak.bursts of them.
var soakDuration = flag.Duration("soak.duration", 0, "run TestFilterSoakGC's bursts for this long per poll_oneoff mode (0: -soak.bursts bursts)")

// soakLine is what the soak build logs on every tick (filter/soakgc.go).
var soakLine = regexp.MustCompile(`^soakgc: gc_cycles=(\d+) netpoll_started=(\d+) heap_released_kib=(\d+)$`)

// TestFilterSoakGC is the soak that forces what hours of production do to
// the Go runtime inside the filter: the filter built with -tags soakgc
// (BuildSoakGC) runs under a 4 MiB memory limit and GOGC 10, and after every
// burst a tick makes it return its free heap to the system
// (debug.FreeOSMemory: a collection the module waits for, so the runtime's
// background goroutines get to run, then the scavenger's work). Under
// Envoy's ENOSYS answer (1.33 to 1.38) the first poll_oneoff would kill the
// VM; under zero events (1.39) it would not, but it would show the poller
// at work. The test fails the day the runtime starts its network poller at
// all (the soak build reads the runtime's own flag), before any poll, and
// it checks that the collector did run on every tick, so that the soak
// cannot pass by not collecting. README.md, "Which Envoy", rests on it;
// -soak.duration makes it a run of hours.
func TestFilterSoakGC(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	path, err := BuildSoakGC(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, poll := range []wasmhost.PollMode{wasmhost.PollENOSYS, wasmhost.PollNoEvents} {
		t.Run(poll.String(), func(t *testing.T) {
			var mu sync.Mutex
			var ticks, cycles, started, released int64
			log := func(line string) {
				m := soakLine.FindStringSubmatch(line)
				if m == nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				ticks++
				cycles, _ = strconv.ParseInt(m[1], 10, 64)
				if n, _ := strconv.ParseInt(m[2], 10, 64); n != 0 && started == 0 {
					started = ticks
				}
				released, _ = strconv.ParseInt(m[3], 10, 64)
			}
			begin := time.Now()
			more := func(n int) bool { return n < *soakBursts }
			if *soakDuration > 0 {
				more = func(int) bool { return time.Since(begin) < *soakDuration }
			}
			r := soakRun(t, path, poll, *soakBurstSize, more, func(vm *wasmhost.VM) {
				if err := vm.Tick(); err != nil {
					t.Fatal(err)
				}
			}, log)
			mu.Lock()
			defer mu.Unlock()
			t.Logf("soak build, poll_oneoff %s, %v: %d requests in %d bursts of %d, %d ticks, %d collections, "+
				"peak linear memory %d KiB, %d KiB returned at the last tick, poll_oneoff calls %d, VM failure: %v",
				poll, time.Since(begin).Round(time.Second), r.requests, r.bursts, *soakBurstSize, ticks, cycles,
				r.peakKiB, released, r.polls, r.failed)
			if r.failed != nil {
				t.Fatalf("the VM failed after %d requests: %v", r.requests, r.failed)
			}
			if started != 0 {
				t.Fatalf("the runtime started its network poller by tick %d: from then on a GC can call poll_oneoff, which ENOSYS (Envoy 1.33 to 1.38) answers fatally", started)
			}
			if r.polls != 0 {
				t.Fatalf("poll_oneoff called %d times", r.polls)
			}
			// A tick after every burst, and the VM's own every tick period
			// (the filter asks for 10 s) on a long run; each collects.
			if ticks < int64(r.bursts) || cycles < ticks {
				t.Fatalf("%d ticks logged for %d bursts, %d collections: the soak did not drive the collector on every tick", ticks, r.bursts, cycles)
			}
		})
	}
}
