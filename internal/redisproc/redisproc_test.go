package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestStartServesAndStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartT(t, Options{})
	c := s.Client(t)

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
	// The defaults Start promises, as the server itself reports them.
	for _, want := range []struct{ param, value string }{
		{"save", ""},
		{"appendonly", "no"},
		{"bind", "127.0.0.1"},
		{"port", strings.TrimPrefix(s.Addr, "127.0.0.1:")},
	} {
		got, err := c.ConfigGet(ctx, want.param).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", want.param, err)
		}
		if got[want.param] != want.value {
			t.Errorf("CONFIG GET %s = %q, want %q", want.param, got[want.param], want.value)
		}
	}
	opt, err := redis.ParseURL(s.URL())
	if err != nil || opt.Addr != s.Addr || opt.DB != 0 {
		t.Errorf("URL() = %q parses to %+v, %v; want addr %s db 0", s.URL(), opt, err, s.Addr)
	}
	if log := s.Log(); !strings.Contains(log, "Ready to accept connections") {
		t.Errorf("Log() lacks the ready line:\n%s", log)
	}

	dir := s.Dir()
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v, want nil (idempotent)", err)
	}
	// Stop waits for the process to exit, so the port refuses at once.
	if conn, err := net.Dial("tcp", s.Addr); err == nil {
		conn.Close()
		t.Errorf("%s still accepts connections after Stop", s.Addr)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temp dir %s still there after Stop (stat: %v)", dir, err)
	}
	if log := s.Log(); !strings.Contains(log, "Ready to accept connections") {
		t.Errorf("Log() after Stop lost the log:\n%s", log)
	}
	if err := s.Restart(ctx); err == nil {
		t.Errorf("Restart after Stop succeeded, want an error")
	}
}

func TestOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "work")
	s := StartT(t, Options{Args: []string{"--maxmemory", "1mb"}, Dir: dir})
	got, err := s.Client(t).ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got["maxmemory"] != "1048576" {
		t.Errorf("maxmemory = %q, want 1048576", got["maxmemory"])
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "redis-*.log"))
	if len(logs) != 1 {
		t.Errorf("log files in %s: %v, want one", dir, logs)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	// A directory the caller chose is the caller's: Stop leaves it.
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("caller's dir removed by Stop: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string // in the error
	}{
		{"unknown option", []string{"--no-such-option", "1"}, "no-such-option"},
		{"bad value", []string{"--maxmemory", "lots"}, "maxmemory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := Start(context.Background(), Options{Args: tc.args})
			if err == nil {
				s.Stop()
				t.Fatalf("Start with %q succeeded, want an error", tc.args)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// A server that loses the race for its port must notice, even though
// another Redis answers PING there.
func TestLaunchOnTakenPort(t *testing.T) {
	t.Parallel()
	first := StartT(t, Options{})
	second := &Server{dir: t.TempDir()}
	second.setPort(first.port)
	p, err := second.launch(context.Background())
	if err == nil {
		p.cmd.Process.Kill()
		t.Fatalf("launch on taken port %d succeeded", first.port)
	}
	if !errors.Is(err, errBind) {
		t.Errorf("launch on taken port: %v, want errBind", err)
	}
}

func TestParallelStartsGetOwnPorts(t *testing.T) {
	t.Parallel()
	const n = 4
	addrs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { addrs[i] = StartT(t, Options{}).Addr })
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, a := range addrs {
		if a == "" || seen[a] {
			t.Errorf("addresses %v: want %d distinct", addrs, n)
		}
		seen[a] = true
	}
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartT(t, Options{})
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// SAVE writes an RDB; Restart must still come back empty.
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	// Kill waits for the process to exit, so the port refuses at once.
	if conn, err := net.Dial("tcp", addr); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Kill", addr)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Addr != addr {
		t.Errorf("Restart moved the server from %s to %s", addr, s.Addr)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS k after Restart = %d, %v; want 0 (empty data)", n, err)
	}
	// Restart of a running server: SIGTERM, then the same again.
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart of a running server: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS k after second Restart = %d, %v; want 0", n, err)
	}
	if got := strings.Count(s.Log(), "Ready to accept connections"); got != 3 {
		t.Errorf("log shows %d starts, want 3", got)
	}
}

// fatalRecorder records the message of a Fatal call and ends the goroutine,
// as testing.T's Fatal does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func TestMissingRedisServer(t *testing.T) {
	// Not parallel: it empties PATH for the whole process.
	t.Setenv("PATH", t.TempDir())
	const want = "redis-server not found: run `make test`, which installs it"

	_, err := Start(context.Background(), Options{})
	if !errors.Is(err, ErrNotInstalled) || err.Error() != want {
		t.Errorf("Start: %v, want %q", err, want)
	}
	for _, tc := range []struct {
		name  string
		start func(testing.TB)
	}{
		{"StartT", func(tb testing.TB) { StartT(tb, Options{}) }},
		{"StartClusterT", func(tb testing.TB) { StartClusterT(tb, 3, 0) }},
	} {
		rec := &fatalRecorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			tc.start(rec)
		}()
		<-done
		if rec.msg != want {
			t.Errorf("%s fatal message %q, want %q", tc.name, rec.msg, want)
		}
	}
}

func TestClusterArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		masters, replicas int
		want              string
	}{
		{2, 0, "masters must be >= 3, got 2"},
		{3, -1, "replicasPerMaster must be >= 0, got -1"},
	} {
		_, err := StartCluster(context.Background(), tc.masters, tc.replicas)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartCluster(%d, %d) = %v, want %q", tc.masters, tc.replicas, err, tc.want)
		}
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ masters, replicas int }{
		{3, 0},
		{3, 1},
	} {
		t.Run(fmt.Sprintf("%dx%d", tc.masters, tc.replicas), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := StartClusterT(t, tc.masters, tc.replicas)
			if got, want := len(c.Addrs), tc.masters*(1+tc.replicas); got != want {
				t.Fatalf("%d nodes, want %d", got, want)
			}
			masters, err := c.Masters(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(masters) != tc.masters {
				t.Fatalf("masters %v, want %d", masters, tc.masters)
			}
			for _, a := range c.Addrs {
				n := c.Node(a)
				if n == nil || n.Addr != a {
					t.Fatalf("Node(%s) = %v", a, n)
				}
				// The bus runs on a port of its own, not port+10000
				// (which exceeds 65535 for ports above 55535).
				got, err := n.Client(t).ConfigGet(ctx, "cluster-port").Result()
				if err != nil || got["cluster-port"] != strconv.Itoa(n.busPort) || n.busPort == 0 {
					t.Errorf("node %s: cluster-port %v, %v; want %d", a, got, err, n.busPort)
				}
			}
			if c.Node("127.0.0.1:1") != nil {
				t.Errorf("Node of an unknown address is not nil")
			}

			// Keys spread over the slots land on every master, and each
			// master serves them directly.
			cc := c.Client(t)
			perMaster := map[string]int{}
			for i := range 64 {
				key := fmt.Sprintf("key:%d", i)
				if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
					t.Fatalf("SET %s: %v", key, err)
				}
				m, err := cc.MasterForKey(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				perMaster[m.Options().Addr]++
				if got, err := c.Node(m.Options().Addr).Client(t).Get(ctx, key).Int(); err != nil || got != i {
					t.Errorf("GET %s on its master %s = %d, %v; want %d", key, m.Options().Addr, got, err, i)
				}
			}
			for _, m := range masters {
				if perMaster[m] == 0 {
					t.Errorf("no key landed on master %s: %v", m, perMaster)
				}
			}
		})
	}
}

func TestClusterNodeRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartClusterT(t, 3, 0)
	cc := c.Client(t)
	if err := cc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := cc.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	node := c.Node(m.Options().Addr)
	if err := node.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := node.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("cluster after node restart: %v", err)
	}
	// The node came back with its slots (nodes.conf) but without data.
	if n, err := cc.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS k after its master restarted = %d, %v; want 0", n, err)
	}
	if err := cc.Set(ctx, "k", "w", 0).Err(); err != nil {
		t.Errorf("SET after restart: %v", err)
	}
}
