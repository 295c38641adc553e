// Package decide runs token-bucket decisions on Redis, batching the decisions
// that are in flight at the same moment into one pipeline.
//
// A fixed set of loops (Options.Pipelines) each take one waiting decision,
// then whatever else is already queued (up to Options.MaxBatch), and send
// them as one pipeline of EVALSHA calls: one round trip for the batch. When
// the sidecar is idle a decision goes out alone at once; nothing ever waits
// for a batch to fill. Under load the batches grow by themselves, so
// throughput is bounded by Redis's work rather than by round trips.
//
// On a single server (Options.Direct) one writer sends the batches on one
// connection of the Decider's own, each as one write, without waiting for
// the replies to the ones before (up to Options.Pipelines in flight), and a
// reader answers the calls from the replies in order.
//
// On a Redis Cluster a loop splits its batch by master and waits for none
// of them: each master has up to Options.Pipelines pipelines in flight of
// its own, the checks that come while all of them are out going together
// in the next, so that a master stopped or slow holds its own checks only.
package decide

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// ErrTimeout is returned by Decide when Redis has not answered by the
// deadline. It wraps context.DeadlineExceeded.
var ErrTimeout = fmt.Errorf("no answer from redis in time: %w", context.DeadlineExceeded)

// Options tune a Decider. The zero value uses the defaults.
type Options struct {
	// Pipelines is how many batches may be in flight to Redis at once, each
	// on its own connection (with Direct, all on the one; on a cluster, to
	// each master). Defaults to 4:
	// Redis has the next batch waiting while the replies of those before
	// are read and parsed, however late a busy host runs the reader. Fewer
	// leave Redis idle until the reader frees a slot; more make batches
	// smaller, and an idle sidecar's first answers in a burst later
	// (sidecar/RATIONALE.md has the measurements).
	Pipelines int
	// MaxBatch caps the decisions sent in one pipeline. Defaults to 128.
	MaxBatch int
	// Queue is how many decisions may wait for a free loop, and on a
	// cluster for a master's pipeline. Defaults to 4096; a caller finding
	// the loops' queue full waits until its own deadline, one past a
	// master's is answered ErrTimeout at once.
	Queue int
	// ExecTimeout bounds one pipeline's round trip, so a loop stuck on a dead
	// connection is freed. A pipeline also stops at the latest deadline of
	// the calls in it, usually much sooner; not on a cluster, where it
	// reads its replies until they come or ExecTimeout has passed, so as
	// to keep its connection (runMaster). Defaults to 1 s.
	ExecTimeout time.Duration
	// WarmConns is how many Redis connections Ready opens, authenticates
	// and keeps idle before it first says yes, one per pipeline in the
	// sidecar. Defaults to 0.
	WarmConns int
	// OnBatch, if set, is called with the size of every pipeline sent (for
	// the batch-size histogram).
	OnBatch func(size int)
	// OnNoScript, if set, is called each time Redis had lost the script (a
	// restart, failover or SCRIPT FLUSH) and it was sent again.
	OnNoScript func()
	// Direct sends the decisions to a single server over one connection
	// of the Decider's own, written and read in RESP2 without go-redis's
	// command objects, instead of as go-redis pipelines (see direct.go);
	// Pipelines then bounds the batches in flight on that connection. It
	// needs a *redis.Client for one server and is ignored for a cluster
	// client. Leave it off for a Sentinel failover client: its connections
	// must follow the master when Sentinel moves it, which go-redis's pool
	// does.
	Direct bool
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

	argsCache sync.Map // argsKey → *argsEntry
	argsCount atomic.Int64

	direct *direct // nil: go-redis pipelines

	healing atomic.Bool // a cluster's script is being loaded (healScript)

	// masters holds, per cluster master (*redis.Client) with a pipeline in
	// flight, its pipelines and the checks waiting for one (toMaster); mu
	// guards it and the masterQueues in it.
	mu      sync.Mutex
	masters map[*redis.Client]*masterQueue

	// refused is the latest error reply Redis gave a check that took
	// tokens, until a check is admitted (noteCharge); Ready reports it.
	refused atomic.Pointer[refusal]
}

// refusal is an error reply to a check that took tokens, and when it came.
type refusal struct {
	at  time.Time
	err error
}

type call struct {
	deadline time.Time
	key      string
	args     *argsEntry
	res      lua.Result
	err      error
	// answered is set by whoever answers the call first: a loop with
	// Redis's reply or an error, or the timer with ErrTimeout.
	answered atomic.Bool
	done     chan struct{} // buffered(1): answering never blocks
	timer    *time.Timer   // answers ErrTimeout at the deadline; reused with the call
}

// answer delivers res and err to the caller unless the call was answered
// already (its deadline passed first).
func (c *call) answer(res lua.Result, err error) {
	if !c.answered.CompareAndSwap(false, true) {
		return
	}
	c.res, c.err = res, err
	c.done <- struct{}{}
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
		client:  client,
		opt:     opt,
		queue:   make(chan *call, opt.Queue),
		quit:    make(chan struct{}),
		masters: make(map[*redis.Client]*masterQueue),
	}
	d.calls.New = func() any {
		c := &call{done: make(chan struct{}, 1)}
		c.timer = time.AfterFunc(time.Hour, func() { c.answer(lua.Result{}, ErrTimeout) })
		c.timer.Stop()
		return c
	}
	if c, ok := client.(*redis.Client); ok && opt.Direct {
		d.direct = newDirect(c.Options(), opt)
		d.wg.Add(1)
		go d.directLoop()
		return d
	}
	for range opt.Pipelines {
		d.wg.Add(1)
		go d.loop()
	}
	return d
}

// Decide takes cost tokens from the bucket key with limit l. It returns when
// Redis has answered or at deadline, whichever is first: at the deadline it
// returns ErrTimeout at once, without waiting for Redis.
//
// A deadline rather than a context keeps the hot path free of allocations:
// the timer lives in a pooled call. It answers the call itself at the
// deadline, so that waiting is one channel receive rather than a select.
func (d *Decider) Decide(deadline time.Time, key string, l lua.Limit, cost int64) (lua.Result, error) {
	if d.closed.Load() {
		return lua.Result{}, ErrClosed
	}
	c := d.calls.Get().(*call)
	c.deadline, c.key, c.args = deadline, key, d.args(l, cost)
	c.answered.Store(false)
	c.timer.Reset(time.Until(deadline))
	select {
	case d.queue <- c:
	default:
		// The queue is full: wait for room until the deadline.
		select {
		case d.queue <- c:
		case <-c.done:
			return lua.Result{}, ErrTimeout
		}
	}
	<-c.done
	res, err := c.res, c.err
	if cost > 0 {
		d.noteCharge(res, err)
	}
	// A timer that fired, or is firing, may still touch c; and after a
	// timeout a loop may still hold c. Such a c is left to the garbage
	// collector rather than reused.
	if c.timer.Stop() {
		c.key, c.args, c.res, c.err = "", nil, lua.Result{}, nil
		d.calls.Put(c)
	}
	return res, err
}

// noteCharge keeps for Ready the outcome of a check that takes tokens: an
// error reply from Redis is kept (at most one every refusalEvery), an
// admission clears it. Only such a check writes, so only it shows that
// Redis refuses writes (READONLY from a replica, OOM under maxmemory with
// noeviction, an ACL user without +hset) where Ready's peek, which writes
// nothing, is answered. A denial writes nothing either and changes
// nothing here; so does the script's own error about one bucket's state.
func (d *Decider) noteCharge(res lua.Result, err error) {
	if err == nil {
		if res.Allowed && d.refused.Load() != nil {
			d.refused.Store(nil)
		}
		return
	}
	var reply redis.Error
	if !errors.As(err, &reply) || strings.HasPrefix(err.Error(), lua.ErrorPrefix) {
		return
	}
	now := time.Now()
	if r := d.refused.Load(); r != nil && now.Sub(r.at) < refusalEvery {
		return
	}
	d.refused.Store(&refusal{at: now, err: err})
}

// refusalEvery is how often noteCharge records a new refusal while they
// keep coming: often enough for Ready's refusalMemory, rarely enough to
// cost nothing when every check is refused.
const refusalEvery = 100 * time.Millisecond

// maxCachedArgs bounds the argument cache: plans are few, and almost every
// request costs 1, so a handful of entries serve nearly all calls.
const maxCachedArgs = 4096

// argsEntry is one call's script arguments: lua.Args, and the same as the
// RESP bulk strings that end an EVALSHA.
type argsEntry struct {
	vals []any
	resp []byte
}

// args returns lua.Args(l, cost), cached: formatting two floats for every
// decision is measurable work at tens of thousands of checks per second. The
// entries are shared read-only; go-redis copies arguments into each command.
func (d *Decider) args(l lua.Limit, cost int64) *argsEntry {
	k := argsKey{l, cost}
	if v, ok := d.argsCache.Load(k); ok {
		return v.(*argsEntry)
	}
	vals := lua.Args(l, cost)
	a := &argsEntry{vals: vals, resp: respArgs(vals)}
	// Past the bound (plans edited many times, unusual costs) start over
	// rather than stop caching: the entries in use come back at once.
	if d.argsCount.Add(1) > maxCachedArgs {
		d.argsCache.Clear()
		d.argsCount.Store(1)
	}
	d.argsCache.Store(k, a)
	return a
}

type argsKey struct {
	l    lua.Limit
	cost int64
}

// Close stops the loops after the decisions already queued are answered.
// Decide returns ErrClosed afterwards.
func (d *Decider) Close() {
	if d.closed.Swap(true) {
		return
	}
	close(d.quit)
	d.wg.Wait()
	if d.direct != nil {
		d.direct.close()
	}
	// Anything that slipped into the queue after the loops saw quit.
	for {
		select {
		case c := <-d.queue:
			c.answer(lua.Result{}, ErrClosed)
		default:
			return
		}
	}
}

// next waits for the first call of a batch; after Close it takes what is
// still queued, then reports false.
func (d *Decider) next() (*call, bool) {
	select {
	case c := <-d.queue:
		return c, true
	case <-d.quit:
		select {
		case c := <-d.queue:
			return c, true
		default:
			return nil, false
		}
	}
}

// fill adds to batch the calls already queued, up to Options.MaxBatch,
// without waiting for more.
func (d *Decider) fill(batch []*call) []*call {
	for len(batch) < d.opt.MaxBatch {
		select {
		case c := <-d.queue:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

func (d *Decider) loop() {
	defer d.wg.Done()
	batch := make([]*call, 0, d.opt.MaxBatch)
	for {
		first, ok := d.next()
		if !ok {
			return
		}
		batch = d.fill(append(batch[:0], first))
		d.run(batch)
		clear(batch) // drop references for the GC
	}
}

// latestDeadline is the latest of calls' deadlines (calls not empty).
func latestDeadline(calls []*call) time.Time {
	latest := calls[0].deadline
	for _, c := range calls[1:] {
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	return latest
}

// run sends one batch and delivers every result: on a single server as one
// pipeline, on a cluster as one pipeline per master (toMaster), which it
// does not wait for.
func (d *Decider) run(batch []*call) {
	// A caller already past its deadline has answered 503; spending its
	// tokens now would charge the client for a request it was not refused.
	now := time.Now()
	live := dropExpired(now, batch)
	if len(live) == 0 {
		return
	}
	// Nobody reads an answer after the last caller's deadline: stop there, so
	// a batch stuck on a dead server frees its loop for the batches that can
	// still be answered.
	last := now.Add(d.opt.ExecTimeout)
	if latest := latestDeadline(live); latest.Before(last) {
		last = latest
	}
	ctx, cancel := context.WithDeadline(context.Background(), last)
	defer cancel()
	if masters, groups := d.byMaster(ctx, live); masters != nil {
		for i, g := range groups {
			d.toMaster(masters[i], g)
		}
		return
	}
	if d.opt.OnBatch != nil {
		d.opt.OnBatch(len(live))
	}
	d.runGroup(ctx, live)
}

// masterQueue is one cluster master's part of the decisions: how many
// pipelines are in flight to it, and the checks waiting for one of them
// to end. Decider.mu guards it.
type masterQueue struct {
	inFlight int
	waiting  []*call
}

// toMaster sends calls, all on master, as a pipeline of their own if fewer
// than Options.Pipelines are in flight to it, else leaves them waiting for
// the next of those to end; it never waits itself. So a master that is
// stopped, slow or down holds its own checks only, which wait (answered
// 503 by their timers at their deadline, and then dropped unsent) while
// the other masters' checks go on; a loop that waited for it would hold
// every check queued behind it. Up to Options.Queue checks wait per
// master; past that the expired ones are dropped, and what still does not
// fit is answered ErrTimeout at once.
func (d *Decider) toMaster(master *redis.Client, calls []*call) {
	d.mu.Lock()
	q := d.masters[master]
	if q == nil {
		q = &masterQueue{}
		d.masters[master] = q
	}
	if q.inFlight >= d.opt.Pipelines {
		q.waiting = append(q.waiting, calls...)
		var over []*call
		if len(q.waiting) > d.opt.Queue {
			q.waiting = dropExpired(time.Now(), q.waiting)
			if n := len(q.waiting); n > d.opt.Queue {
				over = append(over, q.waiting[d.opt.Queue:]...)
				clear(q.waiting[d.opt.Queue:])
				q.waiting = q.waiting[:d.opt.Queue]
			}
		}
		d.mu.Unlock()
		for _, c := range over {
			c.answer(lua.Result{}, ErrTimeout)
		}
		return
	}
	q.inFlight++
	d.mu.Unlock()
	d.wg.Add(1) // from a loop, which Close waits for: the count is not 0
	go d.runMaster(master, q, calls)
}

// runMaster sends calls to master as one pipeline, then the checks left
// waiting for it meanwhile (toMaster), up to Options.MaxBatch a pipeline,
// until none is left. A pipeline reads its replies until they are in or
// ExecTimeout has passed, not only until its checks' deadline: one ended
// at the deadline costs go-redis its connection (the replies still to come
// would leave it out of step), and the next pipeline to the master could
// find no idle connection and dial on its checks' way (a new one's
// handshake, HELLO and CLIENT SETINFO, takes round trips within the
// checks' deadline). The checks past their deadline are answered 503 by
// their timers meanwhile, and those that waited past it are dropped
// unsent.
func (d *Decider) runMaster(master *redis.Client, q *masterQueue, calls []*call) {
	defer d.wg.Done()
	for {
		if calls = dropExpired(time.Now(), calls); len(calls) > 0 {
			if d.opt.OnBatch != nil {
				d.opt.OnBatch(len(calls))
			}
			ctx, cancel := context.WithTimeout(context.Background(), d.opt.ExecTimeout)
			d.runGroup(ctx, calls)
			cancel()
		}
		clear(calls)
		d.mu.Lock()
		if len(q.waiting) == 0 {
			q.waiting = nil
			if q.inFlight--; q.inFlight == 0 {
				delete(d.masters, master)
			}
			d.mu.Unlock()
			return
		}
		n := min(len(q.waiting), d.opt.MaxBatch)
		calls, q.waiting = q.waiting[:n:n], q.waiting[n:]
		d.mu.Unlock()
	}
}

// byMaster splits a batch by the master that serves each call's key as the
// cluster client's slot map has it, and returns the masters with their
// calls; on a single server, or where the map is not known yet, the batch
// is one group and masters is nil.
func (d *Decider) byMaster(ctx context.Context, calls []*call) ([]*redis.Client, [][]*call) {
	cc, ok := d.client.(*redis.ClusterClient)
	if !ok {
		return nil, [][]*call{calls}
	}
	var masters []*redis.Client
	var groups [][]*call
	for _, c := range calls {
		m, err := cc.MasterForKey(ctx, c.key)
		if err != nil {
			return nil, [][]*call{calls}
		}
		i := 0
		for i < len(masters) && masters[i] != m {
			i++
		}
		if i == len(masters) {
			masters = append(masters, m)
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return masters, groups
}

// runGroup sends calls as one pipeline and delivers every result.
func (d *Decider) runGroup(ctx context.Context, live []*call) {
	cmds := d.exec(ctx, live, false)
	// NOSCRIPT: Redis lost the script (restart, failover to a node that never
	// saw it, SCRIPT FLUSH). Send those calls again as EVAL with the source,
	// which also puts the script back in Redis's cache for the next EVALSHA.
	// Only calls still within their deadline: one past it has answered 503,
	// and its tokens must not be taken now (runMaster reads replies late).
	var retry []*call
	var retryIdx []int
	noScript := ""
	now := time.Now()
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && lua.IsNoScript(err) {
			if noScript == "" {
				noScript = live[i].key
			}
			if now.Before(live[i].deadline) {
				retry = append(retry, live[i])
				retryIdx = append(retryIdx, i)
			}
		}
	}
	if noScript != "" {
		if d.opt.OnNoScript != nil {
			d.opt.OnNoScript()
		}
		d.healScript(noScript)
	}
	if len(retry) > 0 {
		again := d.exec(ctx, retry, true)
		for j, i := range retryIdx {
			cmds[i] = again[j]
		}
	}
	d.reloadOnTransportError(cmds)
	for i, c := range live {
		v, err := cmds[i].Result()
		if err == nil {
			c.answer(lua.ParseReply(v))
		} else {
			c.answer(lua.Result{}, err)
		}
	}
}

// healScript puts the script back, on a Redis Cluster, on the master that
// answered NOSCRIPT for key, whatever the checks' deadlines: a peek at key
// (cost 0, which writes nothing) sent as EVAL with the source, in the
// background, one at a time, within DefaultReadyTimeout. The EVAL that run
// resends for the checks themselves also loads it, but only within their
// deadline, and while a slot moves to a master without the script that is
// four round trips (EVALSHA, ASK, ASKING and EVALSHA, NOSCRIPT, then the
// EVAL with ASK again): on a network of a millisecond a round trip, past
// the 4 ms, so that no EVAL would ever reach the new master, and every
// check on the slot fail, until the move ended. This one follows the
// redirection as a single command does, at once.
func (d *Decider) healScript(key string) {
	if _, ok := d.client.(*redis.ClusterClient); !ok || !d.healing.CompareAndSwap(false, true) {
		return
	}
	args := d.args(peekLimit, 0).vals
	d.wg.Add(1) // from a loop, which Close waits for: the count is not 0
	go func() {
		defer d.wg.Done()
		defer d.healing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), DefaultReadyTimeout)
		defer cancel()
		_ = d.client.Eval(ctx, lua.Source, []string{key}, args...).Err()
	}()
}

// reloadOnTransportError asks a cluster client to re-read the slot map when
// a call failed for any reason but a Redis error reply, or with CLUSTERDOWN:
// a master that is down or was replaced by its replica shows up that way, and the new owner of its
// slots is only known after a reload. go-redis rate-limits the reloads.
func (d *Decider) reloadOnTransportError(cmds []*redis.Cmd) {
	cc, ok := d.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	for _, cmd := range cmds {
		err := cmd.Err()
		if err == nil || err == redis.Nil {
			continue
		}
		var reply redis.Error
		if errors.As(err, &reply) && !strings.HasPrefix(err.Error(), "CLUSTERDOWN") {
			continue
		}
		cc.ReloadState(context.Background())
		return
	}
}

func (d *Decider) exec(ctx context.Context, calls []*call, withSource bool) []*redis.Cmd {
	pipe := d.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	sha := lua.Script.Hash()
	for i, c := range calls {
		keys := []string{c.key}
		if withSource {
			cmds[i] = pipe.Eval(ctx, lua.Source, keys, c.args.vals...)
		} else {
			cmds[i] = pipe.EvalSha(ctx, sha, keys, c.args.vals...)
		}
	}
	// Per-command errors are read from each Cmd; a transport failure is set
	// on every Cmd of the pipeline, so the returned error adds nothing.
	_, _ = pipe.Exec(ctx)
	return cmds
}
