package wasmhost

import (
	"context"
	"sync"
	"time"
)

// callContext is the context a Dispatcher gets with a call: it ends when
// the host stops waiting for the call. It is context.WithCancel less what a
// call does not use. It follows no parent, since every way a call ends
// (its answer, its timeout, its plugin or VM going away) ends it
// explicitly (pendingCall.finish); its channel is made only for a caller
// of Done; and it keeps the functions to run when it ends in itself, where
// context.AfterFunc on a cancelable context puts one more context in the
// parent's map of children for each and takes it out again. A dispatcher
// that asks the context's own AfterFunc (whenDone) also skips
// context.AfterFunc's wrapping (RATIONALE.md, "What a request costs the
// host").
type callContext struct {
	values context.Context // answers Value: the VM's context

	mu    sync.Mutex
	ended bool
	done  chan struct{}
	funcs []func()  // nil once stopped
	inl   [2]func() // funcs' first array: a call registers two
}

func (c *callContext) init(values context.Context) {
	c.values = values
	c.funcs = c.inl[:0]
}

func (c *callContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *callContext) Value(key any) any { return c.values.Value(key) }

func (c *callContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.ended {
			close(c.done)
		}
	}
	return c.done
}

func (c *callContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return context.Canceled
	}
	return nil
}

// AfterFunc runs f on its own goroutine once the context ends, unless stop
// is called first, as context.AfterFunc does; context.AfterFunc uses it
// too.
func (c *callContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		go f()
		return func() bool { return false }
	}
	i := len(c.funcs)
	c.funcs = append(c.funcs, f)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.ended || c.funcs[i] == nil {
			return false
		}
		c.funcs[i] = nil
		return true
	}
}

// end ends the context and starts the functions not stopped.
func (c *callContext) end() {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	if c.done != nil {
		close(c.done)
	}
	funcs := c.funcs
	c.mu.Unlock()
	for _, f := range funcs {
		if f != nil {
			go f()
		}
	}
}

// whenDone is context.AfterFunc, asking ctx's own AfterFunc method where it
// has one (a call's context does).
func whenDone(ctx context.Context, f func()) (stop func() bool) {
	if a, ok := ctx.(interface{ AfterFunc(func()) func() bool }); ok {
		return a.AfterFunc(f)
	}
	return context.AfterFunc(ctx, f)
}
