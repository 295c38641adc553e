package wasmhost

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestQueuedTasksKeepTheirOrder queues more tasks than a caller runs after
// its own (maxDrain) while it holds the VM: the caller runs the first of
// them before its call returns, the VM's goroutine the rest, and all run
// once each, in the order they were queued. A do whose task queued behind
// them gets its answer from whichever goroutine ran it.
func TestQueuedTasksKeepTheirOrder(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{})
	const n = 3 * maxDrain
	var mu sync.Mutex
	var order []int
	waiter := make(chan error, 1)
	if !vm.exec(task{f: func() {
		for i := range n {
			vm.post(func() {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
			})
		}
		// A do from another goroutine queues behind them while this
		// task still holds the VM.
		go func() { waiter <- vm.do(func() {}) }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			vm.qmu.Lock()
			queued := len(vm.queue)
			vm.qmu.Unlock()
			if queued == n+1 || time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Millisecond) // polling for the other goroutine's enqueue
		}
	}}, always) {
		t.Fatal("exec on an open VM reported it closed")
	}
	mu.Lock()
	ranByCaller := len(order)
	mu.Unlock()
	if ranByCaller < maxDrain {
		t.Errorf("%d queued tasks had run when exec returned, want at least the %d its caller runs", ranByCaller, maxDrain)
	}
	select {
	case err := <-waiter:
		if err != nil {
			t.Fatalf("do: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("do queued behind the tasks never returned")
	}
	if err := vm.Sync(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != n {
		t.Fatalf("%d tasks ran, want %d", len(order), n)
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("task %d ran in place %d: order %v", v, i, order)
		}
	}
}

// inlineDispatcher answers every call inside Dispatch, before the call
// into the VM that made it has returned.
type inlineDispatcher struct{ answer CalloutResponse }

func (inlineDispatcher) Cluster(name string) bool { return name == "sidecar" }

func (d inlineDispatcher) Dispatch(_ context.Context, _ Callout, respond func(CalloutResponse)) error {
	respond(d.answer)
	return nil
}

// TestCalloutAnsweredInsideItsCall: an answer given while the call that
// dispatched it still runs is queued (callbacks never nest) and delivered
// once that call has returned, by the same goroutine, so the waiting
// caller gets the request continued.
func TestCalloutAnsweredInsideItsCall(t *testing.T) {
	vm := newProbeVM(t, PollSleep, Options{Dispatcher: inlineDispatcher{CalloutResponse{Headers: []Header{{":status", "200"}}}}})
	if err := vm.Configure(script(map[string]string{
		"request_headers":    callout,
		"http_call_response": "effective caller;add 0 x-token ok;continue 0",
	})); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		s := vm.OpenStream(StreamInfo{})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		st, err := s.RequestHeadersWait(ctx, getReq, true)
		cancel()
		if err != nil || st != Continued || firstValue(s.UpstreamHeaders(), "x-token") != "ok" {
			t.Fatalf("request %d: %v, %v, upstream headers %v; want continued with x-token ok", i, st, err, s.UpstreamHeaders())
		}
		s.DoneAsync()
	}
	if p := vm.PendingCalls(); p != 0 {
		t.Errorf("%d calls still pending", p)
	}
}
