package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// filterTimeoutMs is the filter's callout timeout in the soak: the
// deployed default.
const filterTimeoutMs = 5

// scenarios is the mix of requests the filter soak cycles through, one
// per request: every path through the filter that allocates, keeps
// something for later, or hands a buffer to the host. Keys are distinct
// per request unless the scenario reuses one on purpose, so the deny cache
// keeps filling and evicting.
var scenarios = []string{
	"allow", "allow", "allow", "allow", "allow", "allow", // sidecar 200
	"deny",         // sidecar 429 with the exact state: a deny-cache entry
	"cached",       // the last denied key again: answered from the deny cache
	"unavailable",  // sidecar 503
	"malformed",    // 200 without the ratelimit headers
	"reset",        // the callout reset
	"status",       // sidecar 500
	"timeout",      // no answer: the host's timeout (504) fires
	"gone",         // the client leaves, then the sidecar answers
	"gone-timeout", // the client leaves, then the timeout fires
	"missing-key",  // no key: 401 from the filter
	"invalid-key",  // a key with a space: 401 from the filter
}

// Every outageEvery requests, the sidecar answers the next outageLength
// 503s in a row ("outage"): the failures that open the filter's circuit
// breaker by default, and as many again, whose requests then fail open
// without a callout until it probes again.
const outageEvery, outageLength = 5000, 2 * limiter.DefaultBreakerFailures

// filterSample is the module's linear memory after a number of requests.
type filterSample struct {
	Requests int
	Bytes    uint32
}

// filterResult is what a soak of the filter saw.
type filterResult struct {
	Samples  []filterSample
	Outcomes map[string]int   // by scenario and what the client got
	Pending  int              // callouts still waiting at the end (a leak if > 0)
	Counters map[string]int64 // the filter's edgelimit.requests.* metrics at the end
	Failed   error            // the VM's failure, if it failed
}

// scriptedSidecar answers each callout as its key's scenario says; the
// held ones wait for the soak to answer or time out. The filter's warm-up
// calls get the sidecar's answer to them.
type scriptedSidecar struct {
	mu   sync.Mutex
	held func(wasmhost.CalloutResponse)
}

func (*scriptedSidecar) Cluster(string) bool { return true }

var (
	allowHeaders = []wasmhost.Header{{":status", "200"}, {"ratelimit-limit", "10"}, {"ratelimit-remaining", "9"},
		{"ratelimit-reset", "1"}, {"x-ratelimit-plan", "free"}, {"x-ratelimit-tokens", "9.25"}}
	denyHeaders = []wasmhost.Header{{":status", "429"}, {"ratelimit-limit", "10"}, {"ratelimit-remaining", "0"},
		{"ratelimit-reset", "19"}, {"x-ratelimit-plan", "free"}, {"x-ratelimit-tokens", "0.5"},
		{"retry-after", "1"}, {"x-ratelimit-retry-after-ms", "500"}}
)

func (d *scriptedSidecar) Dispatch(_ context.Context, c wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	if filtertest.WarmUpCall(c.Headers) {
		respond(wasmhost.CalloutResponse{Headers: filtertest.WarmAnswer()})
		return nil
	}
	var key string
	for _, h := range c.Headers {
		if h[0] == "x-api-key" {
			key = h[1]
		}
	}
	scenario, _, _ := strings.Cut(key, ".")
	switch scenario {
	case "allow":
		respond(wasmhost.CalloutResponse{Headers: allowHeaders})
	case "deny":
		respond(wasmhost.CalloutResponse{Headers: denyHeaders})
	case "unavailable", "outage":
		respond(wasmhost.LocalReplyResponse(503, "redis unavailable"))
	case "malformed":
		respond(wasmhost.CalloutResponse{Headers: []wasmhost.Header{{":status", "200"}}})
	case "reset":
		respond(wasmhost.CalloutResponse{Reset: true})
	case "status":
		respond(wasmhost.LocalReplyResponse(500, "oops"))
	default: // timeout, gone, gone-timeout
		d.mu.Lock()
		d.held = respond
		d.mu.Unlock()
	}
	return nil
}

// take returns the held callout's respond function.
func (d *scriptedSidecar) take() func(wasmhost.CalloutResponse) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.held
	d.held = nil
	return r
}

// soakFilter sends requests through one VM of the module at wasmPath, in
// the scenarios' order, on a manual clock, sampling the linear memory
// every sampleEvery requests (and after the last). gogc, if not empty, is
// the module's GOGC (through the VM's environment, as Envoy's
// vm_config.environment_variables would set it).
func soakFilter(ctx context.Context, wasmPath string, requests, sampleEvery int, gogc string) (*filterResult, error) {
	var env map[string]string
	if gogc != "" {
		env = map[string]string{"GOGC": gogc}
	}
	mod, err := wasmhost.LoadFile(ctx, wasmPath, wasmhost.ModuleOptions{})
	if err != nil {
		return nil, err
	}
	defer mod.Close(ctx)
	clock := wasmhost.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d := &scriptedSidecar{}
	vm, err := mod.NewVM(ctx, wasmhost.Options{
		PluginName: "edgelimit", RootID: "edgelimit", VMID: "memory",
		Dispatcher: d, Clock: clock, SharedData: wasmhost.NewSharedData(),
		Log: func(wasmhost.LogLevel, string) {}, LogLevel: wasmhost.LogInfo, ManualTicks: true,
		Env: env,
	})
	if err != nil {
		return nil, err
	}
	defer vm.Close()
	if err := vm.Configure(`{"timeout_ms": ` + strconv.Itoa(filterTimeoutMs) + `}`); err != nil {
		return nil, err
	}
	res := &filterResult{Outcomes: map[string]int{}}
	lastDenied := "deny.0"
	for i := 1; i <= requests; i++ {
		scenario := scenarios[i%len(scenarios)]
		if i%outageEvery < outageLength {
			scenario = "outage"
		}
		got, err := oneRequest(ctx, vm, clock, d, scenario, i, &lastDenied)
		if err != nil {
			return nil, fmt.Errorf("request %d (%s): %w", i, scenario, err)
		}
		res.Outcomes[scenario+" → "+got]++
		// A millisecond between requests, so deny-cache entries age and
		// go stale as they would in real time.
		clock.Advance(time.Millisecond)
		if i%10000 == 0 {
			// The plugin's 10 s tick flushes its throttled log lines.
			if err := vm.Tick(); err != nil {
				return nil, err
			}
		}
		if vm.Failed() {
			res.Failed = vm.Err()
			break
		}
		if i%sampleEvery == 0 || i == requests {
			res.Samples = append(res.Samples, filterSample{Requests: i, Bytes: vm.MemoryBytes()})
		}
	}
	res.Pending = vm.PendingCalls()
	res.Counters = map[string]int64{}
	for _, m := range vm.Stats().Snapshot() {
		if name, ok := strings.CutPrefix(m.Name, "wasmcustom.edgelimit.requests."); ok {
			res.Counters[name] = m.Value
		}
	}
	return res, nil
}

// oneRequest runs one request of a scenario through the VM and returns
// what the client got: "forwarded" or the local reply's status.
func oneRequest(ctx context.Context, vm *wasmhost.VM, clock *wasmhost.ManualClock, d *scriptedSidecar,
	scenario string, i int, lastDenied *string) (string, error) {
	s, err := vm.NewStream(wasmhost.StreamInfo{SourceAddr: "127.0.0.1:40000", DestinationAddr: "127.0.0.1:10000", Protocol: "HTTP/1.1"})
	if err != nil {
		return "", err
	}
	headers := []wasmhost.Header{{":method", "GET"}, {":path", "/orders/" + strconv.Itoa(i)}, {":authority", "shop"},
		{":scheme", "http"}, {"user-agent", "memory-soak"}, {"x-request-id", strconv.Itoa(i)}}
	key := scenario + "." + strconv.Itoa(i)
	switch scenario {
	case "missing-key":
	case "invalid-key":
		headers = append(headers, wasmhost.Header{"x-api-key", "has a space " + strconv.Itoa(i)})
	case "cached":
		headers = append(headers, wasmhost.Header{"x-api-key", *lastDenied})
	default:
		headers = append(headers, wasmhost.Header{"x-api-key", key})
	}
	if scenario == "deny" {
		*lastDenied = key
	}
	st, err := s.RequestHeaders(headers, true)
	if err != nil {
		return "", err
	}
	if st == wasmhost.Paused {
		switch scenario {
		case "timeout":
			clock.Advance(filterTimeoutMs*time.Millisecond + time.Millisecond)
		case "gone", "gone-timeout":
			respond := d.take()
			s.Done() // the client left while its check was out
			if scenario == "gone" {
				respond(wasmhost.CalloutResponse{Headers: allowHeaders})
			} else {
				clock.Advance(filterTimeoutMs*time.Millisecond + time.Millisecond)
			}
			if err := vm.Sync(); err != nil {
				return "", err
			}
			return "gone", nil
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err = s.Wait(wctx)
		cancel()
		if err != nil {
			return "", fmt.Errorf("stream still paused: %w", err)
		}
	}
	got := "forwarded"
	switch st {
	case wasmhost.Continued:
		rs, _, err := s.ResponseHeaders([]wasmhost.Header{{":status", "200"}, {"content-type", "application/json"}}, false)
		if err != nil {
			return "", err
		}
		if rs == wasmhost.Paused {
			if _, err := s.Wait(ctx); err != nil {
				return "", err
			}
		}
	case wasmhost.Replied:
		r, _ := s.LocalReply()
		got = strconv.Itoa(r.Status)
	default:
		got = st.String()
	}
	s.Done()
	return got, nil
}
