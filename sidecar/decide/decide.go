// Package decide runs token-bucket decisions on Redis, batching the decisions
// that are in flight at the same moment into one pipeline.
//
// A fixed set of loops (Options.Pipelines) each take one waiting decision,
// then whatever else is already queued (up to Options.MaxBatch), and send
// them as one pipeline of EVALSHA calls: one round trip for the batch. When
// the sidecar is idle a decision goes out alone at once; nothing ever waits
// for a batch to fill. Under load the batches grow by themselves, so
// throughput is bounded by Redis's work rather than by round trips.
package decide

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/lua"
)

// Defaults for Options.
const (
	DefaultPipelines   = 4
	DefaultMaxBatch    = 128
	DefaultQueue       = 4096
	DefaultExecTimeout = time.Second
)

// ErrClosed is returned by Decide after Close.
var ErrClosed = errors.New("decider closed")

// Options tune a Decider. The zero value uses the defaults.
type Options struct {
	// Pipelines is how many batches may be in flight to Redis at once, each
	// on its own connection. Defaults to 4: enough to keep one Redis busy
	// while replies of the other batches travel and are parsed.
	Pipelines int
	// MaxBatch caps the decisions sent in one pipeline. Defaults to 128.
	MaxBatch int
	// Queue is how many decisions may wait for a free loop. Defaults to
	// 4096; a caller finding it full waits until its own deadline.
	Queue int
	// ExecTimeout bounds one pipeline's round trip, so a loop stuck on a dead
	// connection is freed. Callers give up earlier, at their own deadline.
	// Defaults to 1 s.
	ExecTimeout time.Duration
	// OnBatch, if set, is called with the size of every pipeline sent (for
	// the batch-size histogram).
	OnBatch func(size int)
	// OnNoScript, if set, is called each time Redis had lost the script (a
	// restart, failover or SCRIPT FLUSH) and it was sent again.
	OnNoScript func()
}

// Decider takes tokens from buckets in Redis. It is safe for concurrent use.
type Decider struct {
	client redis.UniversalClient
	opt    Options
	queue  chan *call
	quit   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	calls  sync.Pool
	ready  readyCache
}

type call struct {
	ctx  context.Context
	key  string
	args []any
	res  lua.Result
	err  error
	done chan struct{} // buffered(1): the loop never blocks on delivery
}

// New starts the batching loops on client. Call Close to stop them.
func New(client redis.UniversalClient, opt Options) *Decider {
	if opt.Pipelines <= 0 {
		opt.Pipelines = DefaultPipelines
	}
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = DefaultMaxBatch
	}
	if opt.Queue <= 0 {
		opt.Queue = DefaultQueue
	}
	if opt.ExecTimeout <= 0 {
		opt.ExecTimeout = DefaultExecTimeout
	}
	d := &Decider{
		client: client,
		opt:    opt,
		queue:  make(chan *call, opt.Queue),
		quit:   make(chan struct{}),
	}
	d.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	for range opt.Pipelines {
		d.wg.Add(1)
		go d.loop()
	}
	return d
}

// Decide takes cost tokens from the bucket key with limit l. It returns when
// Redis has answered or when ctx ends, whichever is first: at ctx's deadline
// it returns ctx.Err() at once, without waiting for Redis.
func (d *Decider) Decide(ctx context.Context, key string, l lua.Limit, cost int64) (lua.Result, error) {
	if d.closed.Load() {
		return lua.Result{}, ErrClosed
	}
	c := d.calls.Get().(*call)
	c.ctx, c.key, c.args = ctx, key, lua.Args(l, cost)
	select {
	case d.queue <- c:
	case <-ctx.Done():
		c.reset()
		d.calls.Put(c)
		return lua.Result{}, ctx.Err()
	}
	select {
	case <-c.done:
		res, err := c.res, c.err
		c.reset()
		d.calls.Put(c)
		return res, err
	case <-ctx.Done():
		// The loop still holds c and will deliver into its buffered channel
		// later; c is left to the garbage collector rather than reused.
		return lua.Result{}, ctx.Err()
	}
}

func (c *call) reset() {
	c.ctx, c.key, c.args, c.res, c.err = nil, "", nil, lua.Result{}, nil
}

// Close stops the loops after the decisions already queued are answered.
// Decide returns ErrClosed afterwards.
func (d *Decider) Close() {
	if d.closed.Swap(true) {
		return
	}
	close(d.quit)
	d.wg.Wait()
	// Anything that slipped into the queue after the loops saw quit.
	for {
		select {
		case c := <-d.queue:
			c.err = ErrClosed
			c.done <- struct{}{}
		default:
			return
		}
	}
}

func (d *Decider) loop() {
	defer d.wg.Done()
	batch := make([]*call, 0, d.opt.MaxBatch)
	for {
		var first *call
		select {
		case first = <-d.queue:
		case <-d.quit:
			// Drain what is queued, then stop.
			select {
			case first = <-d.queue:
			default:
				return
			}
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < d.opt.MaxBatch {
			select {
			case c := <-d.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		d.run(batch)
		clear(batch) // drop references for the GC
	}
}

// run sends one batch as a pipeline and delivers every result.
func (d *Decider) run(batch []*call) {
	// A caller already past its deadline has answered 503; spending its
	// tokens now would charge the client for a request it was not refused.
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			c.done <- struct{}{}
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if d.opt.OnBatch != nil {
		d.opt.OnBatch(len(live))
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.opt.ExecTimeout)
	defer cancel()

	cmds := d.exec(ctx, live, false)
	// NOSCRIPT: Redis lost the script (restart, failover to a node that never
	// saw it, SCRIPT FLUSH). Send those calls again as EVAL with the source,
	// which also puts the script back in Redis's cache for the next EVALSHA.
	var retry []*call
	var retryIdx []int
	for i, cmd := range cmds {
		if lua.IsNoScript(cmd.Err()) {
			retry = append(retry, live[i])
			retryIdx = append(retryIdx, i)
		}
	}
	if len(retry) > 0 {
		if d.opt.OnNoScript != nil {
			d.opt.OnNoScript()
		}
		again := d.exec(ctx, retry, true)
		for j, i := range retryIdx {
			cmds[i] = again[j]
		}
	}
	for i, c := range live {
		v, err := cmds[i].Result()
		if err == nil {
			c.res, c.err = lua.ParseReply(v)
		} else {
			c.err = err
		}
		c.done <- struct{}{}
	}
}

func (d *Decider) exec(ctx context.Context, calls []*call, withSource bool) []*redis.Cmd {
	pipe := d.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	sha := lua.Script.Hash()
	for i, c := range calls {
		keys := []string{c.key}
		if withSource {
			cmds[i] = pipe.Eval(ctx, lua.Source, keys, c.args...)
		} else {
			cmds[i] = pipe.EvalSha(ctx, sha, keys, c.args...)
		}
	}
	// Per-command errors are read from each Cmd; a transport failure is set
	// on every Cmd of the pipeline, so the returned error adds nothing.
	_, _ = pipe.Exec(ctx)
	return cmds
}
