package decide

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/lua"
)

// direct sends the decisions to one Redis server over one connection of its
// own, speaking RESP2 itself. A writer (Decider.directLoop) sends each batch
// as one write of EVALSHA commands without waiting for the replies of the
// batches before it, up to Options.Pipelines batches in flight; a reader
// decodes the replies in order straight into each call's lua.Result. There
// are no command objects, argument slices or reply trees per decision, and a
// reply that comes after its caller's deadline is read and dropped instead of
// costing the connection. go-redis still dials the connection (its Dialer,
// so TLS and unix sockets are its business) and serves everything else:
// readiness, script loads, hot clients. RATIONALE.md says why.
type direct struct {
	opt *redis.Options
	// liveness is how long the connection may go without a reply while
	// batches are in flight before it is given up (Options.ExecTimeout).
	liveness   time.Duration
	onNoScript func()
	// slots holds a token for every batch in flight: the writer puts one in
	// before it sends a batch, the reader takes it out once the batch's
	// replies are read.
	slots chan struct{}

	mu  sync.Mutex // guards cur and renewAt
	cur *conn
	// renewAt is when cur is to be replaced (the URL's conn_max_lifetime
	// after it was dialed, or after a replacement failed to dial); zero:
	// never.
	renewAt time.Time
	readers sync.WaitGroup
	batches sync.Pool // of *batch
}

// batch is one write's calls, read back in the same order.
type batch struct {
	calls []*call
	eval  bool // sent as EVAL with the source: a NOSCRIPT retry
}

// conn is one connection and its reader. A conn that failed is dead for
// good; the writer dials a new one for the next batch.
type conn struct {
	x  *direct
	nc net.Conn
	rd *bufio.Reader

	mu       sync.Mutex // guards writes, pushes to inflight, deadline, err
	buf      []byte     // the commands being written
	inflight chan *batch
	deadline time.Time // set on nc; zero: none
	dialed   time.Time // when the connection was made ready
	reading  bool      // the reader has taken a batch and not answered it yet
	retired  bool      // no new batch goes out on it; closed once answered
	dead     atomic.Bool
	err      error
}

// deadlineSlack is how far a connection's deadline may lag behind the
// latest write's liveness bound before it is moved: moving it costs a timer
// update, so it moves a few times a second rather than at every batch.
const deadlineSlack = 100 * time.Millisecond

// readOnlyRedial is how long a connection serves before a READONLY reply
// gives it up. A server that answers READONLY was demoted to a replica: a
// managed failover that moved the server's name to the new master leaves
// the connections to the old one open, and only a new connection reaches
// the new master (go-redis closes its connections on READONLY for the same
// reason). While the address still leads to a replica, each new connection
// is refused again; waiting a second first keeps that to one connection a
// second rather than one per batch.
const readOnlyRedial = time.Second

// errRetired closes a connection that served its ConnMaxLifetime once
// its replies are in; no call sees it.
var errRetired = errors.New("connection retired: past conn_max_lifetime")

// errReadOnly fails the batches in flight on a connection given up for a
// READONLY reply.
var errReadOnly = errors.New("READONLY: the server is a replica now; connecting again")

func newDirect(opt *redis.Options, o Options) *direct {
	return &direct{
		opt:        opt,
		liveness:   o.ExecTimeout,
		onNoScript: o.OnNoScript,
		slots:      make(chan struct{}, o.Pipelines),
		batches:    sync.Pool{New: func() any { return &batch{calls: make([]*call, 0, o.MaxBatch)} }},
	}
}

// replyError is an error reply from Redis. It satisfies redis.Error, so
// that lua.IsNoScript sees it as one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// The heads of the script's EVALSHA and EVAL commands: the command, the
// script (by hash or in full) and the number of keys, 1. The key and the
// three arguments follow.
var (
	evalShaHead = respHead("EVALSHA", lua.Script.Hash())
	evalHead    = respHead("EVAL", lua.Source)
)

func respHead(cmd, script string) []byte {
	b := append([]byte("*7\r\n"), bulk(cmd)...)
	b = append(b, bulk(script)...)
	return append(b, bulk("1")...)
}

func bulk(s string) []byte { return appendBulk(nil, s) }

func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// respArgs returns args (lua.Args's strings) as the bulk strings that end a
// command.
func respArgs(args []any) []byte {
	var b []byte
	for _, a := range args {
		b = appendBulk(b, a.(string))
	}
	return b
}

// directLoop is the writer: it waits for room for one more batch in flight,
// takes a waiting call and whatever else is queued, and sends them.
func (d *Decider) directLoop() {
	defer d.wg.Done()
	x := d.direct
	for {
		x.slots <- struct{}{}
		first, ok := d.next()
		if !ok {
			<-x.slots
			return
		}
		b := x.batches.Get().(*batch)
		b.calls = d.fill(append(b.calls[:0], first))
		now := time.Now()
		b.calls = dropExpired(now, b.calls)
		if len(b.calls) == 0 {
			x.release(b)
			continue
		}
		if d.opt.OnBatch != nil {
			d.opt.OnBatch(len(b.calls))
		}
		x.send(now, b)
	}
}

// dropExpired answers ErrTimeout to the calls already past their deadline
// and returns the others, in calls' own array.
func dropExpired(now time.Time, calls []*call) []*call {
	live := calls[:0]
	for _, c := range calls {
		if !now.Before(c.deadline) {
			c.answer(lua.Result{}, ErrTimeout)
			continue
		}
		live = append(live, c)
	}
	clear(calls[len(live):])
	return live
}

// send writes b on the current connection, dialing one if there is none.
// On failure every call in b is answered with the error.
func (x *direct) send(now time.Time, b *batch) {
	c, dialed, err := x.conn(latestDeadline(b.calls))
	if err == nil && dialed {
		// The dial took some of the calls' time, perhaps all of it: those
		// past their deadline are answered already and must not be charged.
		now = time.Now()
		if b.calls = dropExpired(now, b.calls); len(b.calls) == 0 {
			x.release(b)
			return
		}
	}
	if err == nil {
		err = c.write(now, b, false)
	}
	if err != nil {
		x.fail(b.calls, err)
		x.release(b)
	}
}

// fail answers calls with err.
func (x *direct) fail(calls []*call, err error) {
	for _, c := range calls {
		c.answer(lua.Result{}, err)
	}
}

// release gives back b's slot and b.
func (x *direct) release(b *batch) {
	clear(b.calls)
	b.calls, b.eval = b.calls[:0], false
	x.batches.Put(b)
	<-x.slots
}

// conn returns the live connection, dialing one (until deadline) if the
// last one failed or there was none yet. A live connection older than the
// URL's conn_max_lifetime is replaced by a new one and retired: it closes
// once its replies are in, so that the address is resolved and dialed
// again as go-redis does for its pool, and no call fails for it. If the
// new one cannot be dialed, the old one serves on for another lifetime.
// dialed says a dial was tried, and took some of the time to deadline.
func (x *direct) conn(deadline time.Time) (c *conn, dialed bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.cur
	if old != nil && !old.dead.Load() {
		if x.renewAt.IsZero() || time.Now().Before(x.renewAt) {
			return old, false, nil
		}
	} else {
		old = nil
	}
	c, err = x.dial(deadline)
	if err != nil {
		if old != nil {
			x.renewAt = time.Now().Add(x.opt.ConnMaxLifetime)
			return old, true, nil
		}
		return nil, true, err
	}
	if old != nil {
		old.retire()
	}
	if x.opt.ConnMaxLifetime > 0 {
		x.renewAt = c.dialed.Add(x.opt.ConnMaxLifetime)
	}
	x.cur = c
	x.readers.Add(1)
	go c.read()
	return c, true, nil
}

// warm dials the connection ahead of the first decision.
func (x *direct) warm(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultReadyTimeout)
	}
	_, _, err := x.conn(deadline)
	return err
}

// close waits for the batches in flight to be answered (each within the
// liveness bound), then closes the connection and waits for its reader.
func (x *direct) close() {
	for range cap(x.slots) {
		x.slots <- struct{}{}
	}
	x.mu.Lock()
	if x.cur != nil {
		x.cur.kill(ErrClosed)
	}
	x.mu.Unlock()
	x.readers.Wait()
}

// dial connects with go-redis's dialer and prepares the connection as
// go-redis would (AUTH, SELECT, CLIENT SETNAME), in RESP2.
func (x *direct) dial(deadline time.Time) (*conn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	nc, err := x.opt.Dialer(ctx, x.opt.Network, x.opt.Addr)
	if err != nil {
		return nil, fmt.Errorf("redis: dial: %w", err)
	}
	c := &conn{x: x, nc: nc, rd: bufio.NewReaderSize(nc, 16<<10), inflight: make(chan *batch, cap(x.slots))}
	if err := c.hello(ctx, deadline); err != nil {
		nc.Close()
		return nil, err
	}
	c.dialed = time.Now()
	return c, nil
}

func (c *conn) hello(ctx context.Context, deadline time.Time) error {
	o := c.x.opt
	user, pass := o.Username, o.Password
	switch {
	case o.CredentialsProviderContext != nil:
		var err error
		if user, pass, err = o.CredentialsProviderContext(ctx); err != nil {
			return fmt.Errorf("redis: credentials: %w", err)
		}
	case o.CredentialsProvider != nil:
		user, pass = o.CredentialsProvider()
	}
	var cmds [][]string
	switch {
	case pass != "" && user != "":
		cmds = append(cmds, []string{"AUTH", user, pass})
	case pass != "":
		cmds = append(cmds, []string{"AUTH", pass})
	}
	if o.DB != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(o.DB)})
	}
	if o.ClientName != "" {
		cmds = append(cmds, []string{"CLIENT", "SETNAME", o.ClientName})
	}
	if len(cmds) == 0 {
		return nil
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	var b []byte
	for _, cmd := range cmds {
		b = append(b, '*')
		b = strconv.AppendInt(b, int64(len(cmd)), 10)
		b = append(b, '\r', '\n')
		for _, a := range cmd {
			b = appendBulk(b, a)
		}
	}
	if _, err := c.nc.Write(b); err != nil {
		return fmt.Errorf("redis: write: %w", err)
	}
	for _, cmd := range cmds {
		if err := readOK(c.rd); err != nil {
			// Never the password: only the command's name.
			return fmt.Errorf("redis: %s: %w", cmd[0], err)
		}
	}
	c.deadline = deadline
	return nil
}

// write sends b's calls as one write, as EVALSHA or (eval) as EVAL with
// the source, and queues b for the reader.
func (c *conn) write(now time.Time, b *batch, eval bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead.Load() {
		return c.err
	}
	head := evalShaHead
	if eval {
		head = evalHead
	}
	buf := c.buf[:0]
	for _, cl := range b.calls {
		buf = append(buf, head...)
		buf = appendBulk(buf, cl.key)
		buf = append(buf, cl.args.resp...)
	}
	c.buf = buf
	if bound := now.Add(c.x.liveness); bound.Sub(c.deadline) > deadlineSlack {
		if err := c.nc.SetDeadline(bound); err != nil {
			c.killLocked(fmt.Errorf("redis: %w", err))
			return c.err
		}
		c.deadline = bound
	}
	if _, err := c.nc.Write(buf); err != nil {
		c.killLocked(fmt.Errorf("redis: write: %w", err))
		return c.err
	}
	b.eval = eval
	c.inflight <- b // never blocks: every batch in it holds a slot
	return nil
}

// retire takes c out of service: it is closed now if nothing is in flight
// on it, else by its reader once the last reply is read (doneReading).
func (c *conn) retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
	if !c.reading && len(c.inflight) == 0 {
		c.killLocked(errRetired)
	}
}

// doneReading is the reader's, after each batch: it reports whether c was
// retired and has nothing left in flight, and then closes it.
func (c *conn) doneReading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reading = false
	if !c.retired || len(c.inflight) > 0 {
		return false
	}
	c.killLocked(errRetired)
	return true
}

func (c *conn) kill(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killLocked(err)
}

// killLocked marks c dead and closes it; its reader answers what is in
// flight with c.err.
func (c *conn) killLocked(err error) {
	if c.dead.Load() {
		return
	}
	c.err = err
	c.dead.Store(true)
	c.nc.Close()
}

// read is the reader: it takes each batch in flight in turn and answers
// its calls from the replies, until the connection fails.
func (c *conn) read() {
	defer c.x.readers.Done()
	for {
		// Wait for the next reply (or the server closing the connection
		// while it is idle, which is seen here at once).
		if _, err := c.rd.Peek(1); err != nil {
			if c.idleTimeout(err) {
				continue
			}
			c.die(fmt.Errorf("read: %w", err), nil)
			return
		}
		b := c.next()
		if b == nil {
			c.die(errors.New("a reply to nothing sent"), nil)
			return
		}
		if rest, err := c.readBatch(b); err != nil {
			c.die(err, rest)
			c.x.release(b)
			return
		}
		if c.doneReading() {
			return
		}
	}
}

// idleTimeout reports whether err is the connection's deadline passing
// while nothing was in flight, or after the writer had moved it on: not a
// failure. An idle connection then waits with no deadline.
func (c *conn) idleTimeout(err error) bool {
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead.Load() {
		return false
	}
	if len(c.inflight) == 0 {
		c.deadline = time.Time{}
		return c.nc.SetDeadline(c.deadline) == nil
	}
	return time.Now().Before(c.deadline)
}

// next returns the oldest batch in flight, nil if there is none.
func (c *conn) next() *batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case b := <-c.inflight:
		c.reading = true
		return b
	default:
		return nil
	}
}

// readBatch reads b's replies and answers its calls. The calls that got
// NOSCRIPT are sent again, as EVAL, in b itself, which stays in flight with
// its slot; otherwise b is released. On a failure of the connection it
// returns the calls not answered yet, and b is left to the caller. A
// READONLY reply on a connection older than readOnlyRedial is such a
// failure (errReadOnly).
func (c *conn) readBatch(b *batch) (rest []*call, err error) {
	n := 0 // the calls that got NOSCRIPT, moved to b.calls[:n]
	readOnly := false
	for i, cl := range b.calls {
		res, callErr, connErr := readResult(c.rd)
		if connErr != nil {
			return append(b.calls[:n], b.calls[i:]...), fmt.Errorf("read: %w", connErr)
		}
		if callErr != nil && !b.eval && lua.IsNoScript(callErr) {
			b.calls[n] = cl
			n++
			continue
		}
		if callErr != nil && isReadOnly(callErr) {
			readOnly = true
		}
		cl.answer(res, callErr)
	}
	if readOnly && time.Since(c.dialed) >= readOnlyRedial {
		return b.calls[:n], errReadOnly
	}
	if n == 0 {
		c.x.release(b)
		return nil, nil
	}
	// NOSCRIPT: Redis lost the script (SCRIPT FLUSH, or a restart this
	// connection survived). EVAL with the source also puts it back in
	// Redis's cache for the next EVALSHA.
	if c.x.onNoScript != nil {
		c.x.onNoScript()
	}
	clear(b.calls[n:])
	b.calls = b.calls[:n]
	if err := c.write(time.Now(), b, true); err != nil {
		return b.calls, err
	}
	return nil, nil
}

// die answers the calls in rest and every batch still in flight with the
// connection's error, and gives back their slots.
func (c *conn) die(err error, rest []*call) {
	c.mu.Lock()
	c.killLocked(fmt.Errorf("redis: %w", err))
	err = c.err
	c.mu.Unlock()
	c.x.fail(rest, err)
	// No batch is queued on a dead connection, so this drains them all.
	for {
		select {
		case b := <-c.inflight:
			c.x.fail(b.calls, err)
			c.x.release(b)
		default:
			return
		}
	}
}

// isReadOnly reports whether err is Redis's READONLY reply: the server is
// a replica.
func isReadOnly(err error) bool {
	var reply replyError
	return errors.As(err, &reply) && strings.HasPrefix(string(reply), "READONLY ")
}

// errProtocol is a reply the script and the handshake cannot produce: the
// connection's stream can no longer be trusted.
var errProtocol = errors.New("unexpected reply")

// readLine returns the next line of the reply without its "\r\n"; the
// slice is valid until the next read.
func readLine(rd *bufio.Reader) ([]byte, error) {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errProtocol
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, errProtocol
	}
	return line[:len(line)-2], nil
}

// readOK reads a status reply ("+OK").
func readOK(rd *bufio.Reader) error {
	line, err := readLine(rd)
	if err != nil {
		return err
	}
	switch line[0] {
	case '+':
		return nil
	case '-':
		return replyError(line[1:])
	}
	return errProtocol
}

// readResult reads one reply of the script: an array of an integer and
// three bulk strings. An error reply, or a reply of the right shape with
// values the script cannot produce, is the call's error (callErr); connErr
// says the stream itself failed or went out of step.
func readResult(rd *bufio.Reader) (res lua.Result, callErr, connErr error) {
	line, err := readLine(rd)
	if err != nil {
		return res, nil, err
	}
	switch {
	case line[0] == '-':
		return res, replyError(line[1:]), nil
	case string(line) != "*4":
		return res, nil, errProtocol
	}
	if line, err = readLine(rd); err != nil {
		return res, nil, err
	}
	var decision int64
	switch string(line) {
	case ":1":
		decision = 1
	case ":0":
	default:
		return res, nil, errProtocol
	}
	var fields [3]string
	for i := range fields {
		if fields[i], err = readBulk(rd); err != nil {
			return res, nil, err
		}
	}
	res, callErr = lua.ParseFields(decision, fields[0], fields[1], fields[2])
	return res, callErr, nil
}

// maxBulk bounds a bulk string in the script's reply: its numbers are at
// most 24 characters.
const maxBulk = 64

func readBulk(rd *bufio.Reader) (string, error) {
	line, err := readLine(rd)
	if err != nil {
		return "", err
	}
	if line[0] != '$' || len(line) < 2 {
		return "", errProtocol
	}
	n := 0
	for _, ch := range line[1:] {
		if ch < '0' || ch > '9' || n > maxBulk {
			return "", errProtocol
		}
		n = n*10 + int(ch-'0')
	}
	if n > maxBulk {
		return "", errProtocol
	}
	var b [maxBulk + 2]byte
	if _, err := io.ReadFull(rd, b[:n+2]); err != nil {
		return "", err
	}
	if b[n] != '\r' || b[n+1] != '\n' {
		return "", errProtocol
	}
	return string(b[:n]), nil
}
