package wasmhost

import (
	"flag"
	"fmt"
	"strings"
	"testing"
)

// soakRounds is how many GC-heavy callbacks the soak runs per poll mode;
// -soak.rounds raises it for a long run.
var soakRounds = flag.Int("soak.rounds", 40, "GC-heavy callbacks per poll_oneoff mode in TestSoakPollOneoff")

// soak runs rounds callbacks that each allocate and collect (the probe's
// "gc" command: 256 KiB of garbage and runtime.GC, 4 times) and returns after
// how many the VM failed (0: it did not) and why.
func soak(t *testing.T, poll PollMode, rounds int) (int, int64, error) {
	vm := newProbeVM(t, poll, Options{ManualTicks: true})
	if err := vm.Configure(script(map[string]string{"tick": "gc 4"})); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= rounds; i++ {
		vm.Tick()
		if vm.Failed() {
			return i, vm.PollOneoffCalls(), vm.Err()
		}
	}
	if n := len(vm.logs.results("gc")); n != rounds {
		t.Fatalf("%d of %d rounds reported", n, rounds)
	}
	return 0, vm.PollOneoffCalls(), nil
}

// TestSoakPollOneoff is the GC-heavy soak under each poll_oneoff answer. A
// standard-Go module polls as soon as the runtime has a timer (the GC's
// scavenger makes one), at every GC: Envoy's ENOSYS stub kills it, the
// answers of current Envoy and a real poll keep it alive.
func TestSoakPollOneoff(t *testing.T) {
	for _, c := range []struct {
		poll     PollMode
		survives bool
	}{{PollSleep, true}, {PollNoEvents, true}, {PollENOSYS, false}} {
		t.Run(c.poll.String(), func(t *testing.T) {
			failedAt, polls, err := soak(t, c.poll, *soakRounds)
			t.Logf("poll_oneoff %s: %d rounds, %d poll_oneoff calls, failed at round %d: %v", c.poll, *soakRounds, polls, failedAt, err)
			if polls == 0 {
				t.Error("the probe never polled: the soak did not exercise poll_oneoff")
			}
			if c.survives && failedAt != 0 {
				t.Fatalf("the VM failed at round %d: %v", failedAt, err)
			}
			if !c.survives {
				if failedAt == 0 {
					t.Fatalf("the VM survived %d GC-heavy rounds under ENOSYS; the minimum Envoy version in the README may be too high", *soakRounds)
				}
				if msg := err.Error(); !strings.Contains(msg, "unreachable") && !strings.Contains(msg, "restricted_callback") {
					t.Errorf("unexpected failure: %v", err)
				}
			}
		})
	}
}

func ExamplePollMode() {
	for _, s := range []string{"sleep", "noevents", "enosys"} {
		p, _ := ParsePollMode(s)
		fmt.Println(p)
	}
	// Output:
	// sleep
	// noevents
	// enosys
}
