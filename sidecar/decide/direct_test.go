package decide

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
)

// TestDirectLateReplyKeepsConnection: a call whose deadline passes while
// Redis holds its script gets ErrTimeout at the deadline; the reply that
// comes later is read and dropped, and the connection carries on.
func TestDirectLateReplyKeepsConnection(t *testing.T) {
	srv, c := standalone(t)
	ctl := srv.Client(t)
	batches := make(chan int, 10)
	d := newDecider(t, c, Options{Direct: true, OnBatch: func(n int) { batches <- n }})
	bg := context.Background()
	if _, err := d.Decide(far(), "rl:{warm}", slow, 1); err != nil {
		t.Fatal(err)
	}
	<-batches
	conns := redisproc.InfoStat(t, ctl, "total_connections_received")

	if err := ctl.Do(bg, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := d.Decide(time.Now().Add(50*time.Millisecond), "rl:{late}", slow, 1)
	if !errors.Is(err, ErrTimeout) {
		ctl.Do(bg, "CLIENT", "UNPAUSE")
		t.Fatalf("Decide with Redis paused = %v, want ErrTimeout", err)
	}
	<-batches // it was sent
	if err := ctl.Do(bg, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	r, err := d.Decide(far(), "rl:{late}", slow, 1)
	if err != nil || !r.Allowed {
		t.Fatalf("after the pause: %+v, %v; want allowed", r, err)
	}
	// The late call ran in Redis when it was unpaused: this one is second.
	if !spentOnce(r.Tokens, 3, start) {
		t.Errorf("tokens after the late call and this one = %v, want 3", r.Tokens)
	}
	// ctl's own INFO connection is one; nothing else connected.
	if got := redisproc.InfoStat(t, ctl, "total_connections_received"); got != conns {
		t.Errorf("connections received went from %d to %d: the late reply cost the connection", conns, got)
	}
}

// TestDirectReconnects: a connection Redis closes while it is idle is seen
// closed at once, and the next decision goes out on a new one without
// failing.
func TestDirectReconnects(t *testing.T) {
	srv, c := standalone(t)
	d := newDecider(t, c, Options{Direct: true})
	start := time.Now()
	if _, err := d.Decide(far(), "rl:{a}", slow, 1); err != nil {
		t.Fatal(err)
	}
	first := d.direct.cur
	if err := srv.Client(t).Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(t, 10*time.Second, "the killed connection to be seen dead", first.dead.Load)
	r, err := d.Decide(far(), "rl:{a}", slow, 1)
	if err != nil || !r.Allowed || !spentOnce(r.Tokens, 3, start) {
		t.Fatalf("after CLIENT KILL: %+v, %v; want allowed with 3 left", r, err)
	}
	if d.direct.cur == first {
		t.Error("the decision went out on the killed connection")
	}
}

// TestDirectGivesUpOnSilentServer: with batches in flight and no reply
// for Options.ExecTimeout, the connection is given up, its calls fail, and
// the next decision dials a new one.
func TestDirectGivesUpOnSilentServer(t *testing.T) {
	srv, c := standalone(t)
	ctl := srv.Client(t)
	d := newDecider(t, c, Options{Direct: true, ExecTimeout: 200 * time.Millisecond})
	bg := context.Background()
	if err := ctl.Do(bg, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := d.Decide(far(), "rl:{silent}", slow, 1)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		ctl.Do(bg, "CLIENT", "UNPAUSE")
		t.Fatalf("Decide on a silent server = %v, want the connection's timeout", err)
	}
	if err := ctl.Do(bg, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	r, err := d.Decide(far(), "rl:{after}", slow, 1)
	if err != nil || !r.Allowed {
		t.Fatalf("after the pause: %+v, %v; want allowed", r, err)
	}
}

// TestDirectAuthAndDatabase: the connection authenticates (here as an ACL
// user) and selects the client's database as go-redis does; a wrong
// password fails the decision with Redis's reason and never shows the
// password.
func TestDirectAuthAndDatabase(t *testing.T) {
	const password = "pw-3d81c0"
	srv := redisproc.StartT(t, redisproc.Options{})
	bg := context.Background()
	if err := srv.Client(t).Do(bg, "ACL", "SETUSER", "limiter", "on", ">"+password, "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: password, DB: 3})
	t.Cleanup(func() { c.Close() })
	d := newDecider(t, c, Options{Direct: true})
	if r, err := d.Decide(far(), "rl:{db3}", slow, 1); err != nil || !r.Allowed {
		t.Fatalf("Decide = %+v, %v; want allowed", r, err)
	}
	if n, err := c.Exists(bg, "rl:{db3}").Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS rl:{db3} in database 3 = %d, %v; want 1", n, err)
	}
	clients, err := srv.Client(t).ClientList(bg).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(clients, "db=3") || !strings.Contains(clients, "user=limiter") {
		t.Errorf("no connection of user limiter on database 3:\n%s", clients)
	}

	wrong := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "not-" + password})
	t.Cleanup(func() { wrong.Close() })
	dw := newDecider(t, wrong, Options{Direct: true})
	_, err = dw.Decide(far(), "rl:{x}", slow, 1)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), password) {
		t.Fatalf("Decide with a wrong password = %v, want WRONGPASS without the password", err)
	}
}

// fakeRedis answers every command it reads with reply, on each
// connection; it returns its address.
func fakeRedis(t *testing.T, reply string) string {
	t.Helper()
	return testkit.RawServer(t, func(nc net.Conn, rd *bufio.Reader) {
		for {
			// One command: "*7" and 7 bulk strings of two lines each.
			for range 15 {
				if _, err := rd.ReadString('\n'); err != nil {
					return
				}
			}
			if _, err := nc.Write([]byte(reply)); err != nil {
				return
			}
		}
	})
}

// TestDirectOutOfStep: a reply the script cannot give fails the call and
// the connection (its stream can no longer be trusted); a reply of the
// right shape with impossible values fails only the call.
func TestDirectOutOfStep(t *testing.T) {
	for _, tc := range []struct {
		name, reply, want string
		keeps             bool
	}{
		{"status", "+OK\r\n", "unexpected reply", false},
		{"array of 3", "*3\r\n:1\r\n$1\r\n1\r\n$1\r\n0\r\n", "unexpected reply", false},
		{"bulk too long", "*4\r\n:1\r\n$900\r\n", "unexpected reply", false},
		{"decision 2", "*4\r\n:2\r\n$1\r\n1\r\n$1\r\n0\r\n$1\r\n0\r\n", "unexpected reply", false},
		{"error reply", "-ERR tokenbucket: capacity: must be > 0\r\n", "ERR tokenbucket", true},
		{"negative tokens", "*4\r\n:1\r\n$2\r\n-1\r\n$1\r\n0\r\n$1\r\n0\r\n", "tokens: want a finite number", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: fakeRedis(t, tc.reply)})
			t.Cleanup(func() { c.Close() })
			d := newDecider(t, c, Options{Direct: true})
			_, err := d.Decide(far(), "rl:{x}", slow, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decide = %v, want an error with %q", err, tc.want)
			}
			first := d.direct.cur
			_, err = d.Decide(far(), "rl:{x}", slow, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("second Decide = %v, want an error with %q", err, tc.want)
			}
			if kept := d.direct.cur == first; kept != tc.keeps {
				t.Errorf("connection kept: %v, want %v", kept, tc.keeps)
			}
		})
	}
}

// TestReadResult decodes the script's replies as Redis writes them.
func TestReadResult(t *testing.T) {
	rd := bufio.NewReader(strings.NewReader(
		"*4\r\n:1\r\n$3\r\n2.5\r\n$1\r\n0\r\n$4\r\n1500\r\n" +
			"*4\r\n:0\r\n$1\r\n3\r\n$5\r\nnever\r\n$1\r\n0\r\n" +
			"-NOSCRIPT No matching script.\r\n"))
	for i, want := range []lua.Result{
		{Allowed: true, Tokens: 2.5, ResetAfter: 1500 * time.Millisecond, ResetMs: 1500},
		{Tokens: 3, Never: true},
	} {
		got, callErr, connErr := readResult(rd)
		if callErr != nil || connErr != nil || got != want {
			t.Errorf("reply %d: %+v, %v, %v; want %+v", i, got, callErr, connErr, want)
		}
	}
	_, callErr, connErr := readResult(rd)
	if connErr != nil || !lua.IsNoScript(callErr) {
		t.Errorf("NOSCRIPT reply: %v, %v; want a NOSCRIPT error of the call", callErr, connErr)
	}
}

// movingAddr listens on a loopback port and joins each connection it
// accepts to the address target names at that moment: a name that moves
// to another server, as a managed Redis's DNS name does on a failover,
// while the connections made before the move stay on the old server.
type movingAddr struct {
	ln     net.Listener
	target atomic.Pointer[string]
}

func newMovingAddr(t *testing.T, target string) *movingAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &movingAddr{ln: ln}
	m.target.Store(&target)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", *m.target.Load())
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
		}
	}()
	return m
}

func (m *movingAddr) Addr() string         { return m.ln.Addr().String() }
func (m *movingAddr) moveTo(target string) { m.target.Store(&target) }

// TestDirectFollowsMovedMaster: the server at the sidecar's address is
// demoted to a replica of another, and the address moved to that one (a
// managed failover). The connection kept to the old server is answered
// READONLY; once it has served readOnlyRedial it is given up, and the
// decisions go to the new master on a new connection, with the bucket
// replicated before the move.
func TestDirectFollowsMovedMaster(t *testing.T) {
	ctx := context.Background()
	// A master sends its first sync at once, not after Redis's default 5 s
	// wait for more replicas.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	old := redisproc.StartT(t, redisproc.Options{Args: noDelay})
	host, port, _ := net.SplitHostPort(old.Addr)
	next := redisproc.StartT(t, redisproc.Options{Args: append(noDelay, "--replicaof", host, port)})
	testkit.Poll(t, 30*time.Second, "the replica to sync", func() bool {
		info, err := next.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	addr := newMovingAddr(t, old.Addr)
	c := redis.NewClient(&redis.Options{Addr: addr.Addr(), MaxRetries: 2})
	t.Cleanup(func() { c.Close() })
	d := newDecider(t, c, Options{Direct: true})
	start := time.Now()
	if r, err := d.Decide(far(), "rl:{moved}", slow, 1); err != nil || !r.Allowed {
		t.Fatalf("before the failover: %+v, %v", r, err)
	}
	testkit.Poll(t, 30*time.Second, "the bucket to reach the replica", func() bool {
		n, err := next.Client(t).Exists(ctx, "rl:{moved}").Result()
		return err == nil && n == 1
	})

	// The failover: the replica becomes the master, the old master its
	// replica, and the address leads to the new master from now on.
	nhost, nport, _ := net.SplitHostPort(next.Addr)
	if err := next.Client(t).ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := old.Client(t).ReplicaOf(ctx, nhost, nport).Err(); err != nil {
		t.Fatal(err)
	}
	addr.moveTo(next.Addr)
	// Within readOnlyRedial (1 s) of the first READONLY, plus a check's
	// round trip; 10 s leaves a busy machine room.
	var r lua.Result
	testkit.PollErr(t, 10*time.Second, "a decision on the new master", func() error {
		var err error
		r, err = d.Decide(time.Now().Add(time.Second), "rl:{moved}", slow, 1)
		return err
	})
	if !r.Allowed || !spentOnce(r.Tokens, 3, start) {
		t.Errorf("on the new master: %+v; want allowed with 3 left (the bucket replicated)", r)
	}
}

// TestDirectConnMaxLifetime: with the URL's conn_max_lifetime, the
// decisions' connection is replaced once it is that old, as go-redis
// replaces its pool's, so that a name whose address moved is dialed again;
// the old connection closes once its replies are in, and no decision
// fails for it, with decisions in flight all along.
func TestDirectConnMaxLifetime(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	const lifetime = 100 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 2, ConnMaxLifetime: lifetime})
	t.Cleanup(func() { c.Close() })
	d := newDecider(t, c, Options{Direct: true})
	if _, err := d.Decide(far(), "rl:{warm}", slow, 0); err != nil {
		t.Fatal(err)
	}
	d.direct.mu.Lock()
	first := d.direct.cur
	d.direct.mu.Unlock()

	// Eight callers deciding without pause until the first connection
	// has been replaced and closed: every decision must succeed.
	var failed atomic.Int64
	var lastErr atomic.Value
	load := testkit.StartLoad(t, 8, func(w, i int) {
		if _, err := d.Decide(far(), "rl:{lifetime}", lua.Limit{Capacity: 1e9, Rate: 1e9}, 1); err != nil {
			failed.Add(1)
			lastErr.Store(err)
		}
	})
	testkit.Poll(t, 10*time.Second, "the first connection to be replaced and closed", func() bool {
		d.direct.mu.Lock()
		defer d.direct.mu.Unlock()
		return d.direct.cur != first && first.dead.Load()
	})
	load.Stop()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d decisions failed across the replacement, the last with %v", n, lastErr.Load())
	}
	if !errors.Is(first.err, errRetired) {
		t.Errorf("the first connection closed with %v, want errRetired", first.err)
	}
}
