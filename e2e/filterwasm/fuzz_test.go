package filterwasm

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// Fuzz targets for untrusted input where the filter meets its host:
// request headers as the compiled filter.wasm sees them inside the
// headless host, and the header maps that cross the ABI in both
// directions. Seeds are in testdata/fuzz/<target>/. They live here, not
// beside the system tests in e2e, so that a fuzzing build instruments only
// the filter, the host and what they use.

// recordingSidecar answers every check "allowed" at once and keeps the
// headers of the last one; the filter's warm-up calls (POST /v1/warm) it
// answers as the sidecar does, and does not count.
type recordingSidecar struct {
	mu   sync.Mutex
	last []wasmhost.Header
	n    int
}

func (*recordingSidecar) Cluster(string) bool { return true }

func (d *recordingSidecar) Dispatch(_ context.Context, c wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	if filtertest.WarmUpCall(c.Headers) {
		respond(wasmhost.CalloutResponse{Headers: filtertest.WarmAnswer()})
		return nil
	}
	d.mu.Lock()
	d.last, d.n = c.Headers, d.n+1
	d.mu.Unlock()
	respond(wasmhost.CalloutResponse{Headers: allowed})
	return nil
}

// allowed is the sidecar's own 200 for a check of cost 1 that leaves 9 of
// 10 tokens, made by its code (filtertest.SidecarAnswer).
var allowed = filtertest.SidecarAnswer("fuzz", 10, 1, 10, 1)

// calls returns how many checks were sent and the last one's headers.
func (d *recordingSidecar) calls() (int, []wasmhost.Header) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n, d.last
}

var fuzzVM struct {
	once sync.Once
	vm   *wasmhost.VM
	side *recordingSidecar
	err  error
}

// filterVM is one VM of the built filter.wasm, shared by every input of
// a fuzzing process (state carried from input to input is part of what is
// fuzzed).
func filterVM(t *testing.T) (*wasmhost.VM, *recordingSidecar) {
	mod := filterModule(t)
	fuzzVM.once.Do(func() {
		ctx := context.Background()
		fuzzVM.side = &recordingSidecar{}
		fuzzVM.vm, fuzzVM.err = mod.NewVM(ctx, wasmhost.Options{VMID: "fuzz", Dispatcher: fuzzVM.side,
			SharedData: wasmhost.NewSharedData(), Log: func(wasmhost.LogLevel, string) {}})
		if fuzzVM.err == nil {
			// The filter's defaults, the shipped 5 ms callout: the
			// sidecar answers inside the dispatch, and a response that
			// has arrived wins over the timer however late the VM runs.
			fuzzVM.err = fuzzVM.vm.Configure(`{}`)
		}
	})
	if fuzzVM.err != nil {
		t.Fatal(fuzzVM.err)
	}
	return fuzzVM.vm, fuzzVM.side
}

// FuzzFilterKeyHeaders sends arbitrary x-api-key and authorization values
// through filter.wasm. The module never fails, and it decides exactly as
// the limiter's native logic (limiter.ExtractKey) says: a request with a
// usable key is checked with that key, alone, 1-256 visible ASCII, at
// cost 1, and goes on carrying only that key; any other is answered 401
// without a check.
func FuzzFilterKeyHeaders(f *testing.F) {
	f.Add(true, "client-1", false, "")
	f.Add(false, "", true, "Bearer client-2")
	f.Add(true, "", true, "bEaReR    client-3")
	f.Add(true, "inj\r\nx-evil: 1", false, "")
	f.Add(true, "nul\x00key", true, "Bearer fallback")
	f.Add(false, "", true, "Basic dXNlcjpwYXNz")
	f.Add(true, strings.Repeat("k", 257), false, "")
	f.Add(true, "ключ", false, "")
	f.Fuzz(func(t *testing.T, hasKey bool, key string, hasAuth bool, auth string) {
		vm, side := filterVM(t)
		headers := []wasmhost.Header{{":method", "GET"}, {":path", "/orders/1"}, {":authority", "shop"}}
		keyHeader, authHeader := "", ""
		if hasKey {
			headers = append(headers, wasmhost.Header{"x-api-key", key})
			keyHeader = key
		}
		if hasAuth {
			headers = append(headers, wasmhost.Header{"authorization", auth})
			authHeader = auth
		}
		want, status := limiter.ExtractKey(keyHeader, authHeader)

		before, _ := side.calls()
		s, err := vm.NewStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:40000", DestinationAddr: "127.0.0.1:10000", Protocol: "HTTP/1.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Done()
		st, err := s.RequestHeaders(headers, true)
		if err != nil {
			t.Fatal(err)
		}
		if st == wasmhost.Paused {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			st, err = s.Wait(ctx)
			cancel()
			if err != nil {
				t.Fatalf("request still paused: %v", err)
			}
		}
		if vm.Failed() {
			t.Fatalf("the VM failed: %v", vm.Err())
		}
		after, check := side.calls()

		if status != limiter.KeyFound {
			if after != before {
				t.Fatalf("a request without a usable key (%v) was checked: %q", status, check)
			}
			r, ok := s.LocalReply()
			if st != wasmhost.Replied || !ok || r.Status != 401 {
				t.Fatalf("a request without a usable key (%v): state %v, reply %+v, want 401", status, st, r)
			}
			return
		}
		if after != before+1 {
			t.Fatalf("a request with key %q made %d checks, want 1", want, after-before)
		}
		if st != wasmhost.Continued {
			t.Fatalf("an allowed request with key %q: state %v, want it forwarded", want, st)
		}
		var keys, costs []string
		for _, h := range check {
			switch h[0] {
			case limiter.KeyHeader:
				keys = append(keys, h[1])
			case "x-ratelimit-cost":
				costs = append(costs, h[1])
			}
		}
		if len(keys) != 1 || keys[0] != want || !limiter.ValidKey(keys[0]) {
			t.Fatalf("check carried x-api-key %q, want exactly %q", keys, want)
		}
		if len(costs) != 1 || costs[0] != "1" {
			t.Fatalf("check carried x-ratelimit-cost %q, want 1", costs)
		}
		if hasKey && keyHeader != "" {
			var up []string
			for _, h := range s.UpstreamHeaders() {
				if h[0] == limiter.KeyHeader {
					up = append(up, h[1])
				}
			}
			if len(up) != 1 || up[0] != want {
				t.Fatalf("the service would receive x-api-key %q, want only the checked %q", up, want)
			}
		}
	})
}

// FuzzHeaderMapsAgree: the filter's decoder (filter/abi, for maps the
// host writes) and the headless host's (wasmhost, for maps the plugin
// writes) read every buffer alike. What the filter accepts, the host
// decodes to the same pairs (within Envoy's limits of 1024 pairs and
// 1 MiB); what the filter refuses, the host reads as an empty map, as
// Envoy does. Neither panics.
func FuzzHeaderMapsAgree(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Add(abi.EncodePairs([][2]string{{":status", "200"}, {"ratelimit-limit", "10"}}))
	f.Add(abi.EncodePairs([][2]string{{"x-api-key", "a\x00b"}}))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 'b'})
	f.Fuzz(func(t *testing.T, data []byte) {
		want, err := abi.DecodePairs(data)
		got := wasmhost.DecodePairs(data)
		if err != nil {
			if len(got) != 0 {
				t.Fatalf("the filter refuses %v (%v), the host reads %q", data, err, got)
			}
			return
		}
		if len(want) > 1024 || len(data) > 1<<20 {
			return // over Envoy's limits: the host reads it as empty on purpose
		}
		if len(got) != len(want) {
			t.Fatalf("%v: the filter reads %q, the host %q", data, want, got)
		}
		for i := range want {
			if got[i][0] != want[i][0] || got[i][1] != want[i][1] {
				t.Fatalf("%v: pair %d: the filter reads %q, the host %q", data, i, want[i], got[i])
			}
		}
		if len(want) > 0 {
			if re := wasmhost.EncodePairs(got); string(re) != string(data) {
				t.Fatalf("%v: the host re-encodes %q as %v", data, got, re)
			}
		}
	})
}
