package filterwasm

import (
	"context"
	"flag"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
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
	for _, respond := range held {
		respond(wasmhost.CalloutResponse{Headers: []wasmhost.Header{{":status", "200"}, {"ratelimit-limit", "100"},
			{"ratelimit-remaining", "99"}, {"ratelimit-reset", "1"}, {"x-ratelimit-plan", "free"}, {"x-ratelimit-tokens", "99.5"}}})
	}
}

type soakResult struct {
	requests int   // sent before the VM failed, or all of them
	failed   error // nil: the VM survived
	peakKiB  uint32
	polls    int64 // WASI poll_oneoff calls the module made
}

// filterSoak runs the bursts through one VM of filter.wasm under the given
// poll_oneoff answer.
func filterSoak(t *testing.T, poll wasmhost.PollMode, bursts, size int) soakResult {
	filterModule(t) // builds filter.wasm
	b, err := os.ReadFile(modDir + "/filter.wasm")
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
		Log: func(wasmhost.LogLevel, string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.Configure(`{"timeout_ms": 60000}`); err != nil {
		t.Fatal(err)
	}
	var res soakResult
	for burst := 0; burst < bursts; burst++ {
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
			if vm.Failed() {
				res.failed = vm.Err()
				res.polls = vm.PollOneoffCalls()
				return res
			}
		}
		if kib := vm.MemoryBytes() >> 10; kib > res.peakKiB {
			res.peakKiB = kib
		}
		d.release()
		for _, s := range streams {
			if st, err := s.Wait(context.Background()); err == nil && st == wasmhost.Continued {
				s.ResponseHeaders([]wasmhost.Header{{":status", "200"}}, false)
			}
			s.Done()
		}
		if vm.Failed() {
			res.failed = vm.Err()
			res.polls = vm.PollOneoffCalls()
			return res
		}
	}
	res.polls = vm.PollOneoffCalls()
	return res
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
