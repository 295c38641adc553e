package wasmhost

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeDispatcher records the calls a plugin makes and lets the test answer
// them by hand.
type fakeDispatcher struct {
	mu       sync.Mutex
	clusters map[string]bool
	fail     error
	calls    []*fakeCall
}

type fakeCall struct {
	Callout
	ctx     context.Context
	respond func(CalloutResponse)
}

func newFakeDispatcher(clusters ...string) *fakeDispatcher {
	d := &fakeDispatcher{clusters: map[string]bool{}}
	for _, c := range clusters {
		d.clusters[c] = true
	}
	return d
}

func (d *fakeDispatcher) Cluster(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clusters[name]
}

func (d *fakeDispatcher) Dispatch(ctx context.Context, c Callout, respond func(CalloutResponse)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return d.fail
	}
	d.calls = append(d.calls, &fakeCall{Callout: c, ctx: ctx, respond: respond})
	return nil
}

func (d *fakeDispatcher) all() []*fakeCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*fakeCall(nil), d.calls...)
}

// last returns the latest call, failing the test if there is none.
func (d *fakeDispatcher) last(t testing.TB) *fakeCall {
	t.Helper()
	calls := d.all()
	if len(calls) == 0 {
		t.Fatal("no call was dispatched")
	}
	return calls[len(calls)-1]
}

var errSendFailed = errors.New("send failed")

// watchingDispatcher is a fakeDispatcher that reports, as the HTTP
// dispatcher does from the socket, whether a call's response has arrived.
type watchingDispatcher struct {
	*fakeDispatcher
	arrivedNow atomic.Bool
}

func (d *watchingDispatcher) DispatchWatched(ctx context.Context, c Callout, respond func(CalloutResponse)) (func() bool, error) {
	return d.arrivedNow.Load, d.Dispatch(ctx, c, respond)
}
