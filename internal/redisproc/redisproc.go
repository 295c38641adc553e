// Package redisproc runs real redis-server processes for tests, benchmarks
// and demos: a standalone server (or a Sentinel) on a free loopback port,
// or a Redis Cluster built with redis-cli. Every process it starts is owned
// by the caller and stopped by Stop (or at test cleanup with the ...T
// helpers), so tests never share a Redis with each other or with anything
// already on the machine.
package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// Bounds on waiting for a process. They are generous because the machines
// running tests may be small and busy; a healthy redis-server answers PING
// within milliseconds of starting.
const (
	// readyTimeout bounds how long Start waits for PING when the caller's
	// context has no earlier deadline.
	readyTimeout = 20 * time.Second
	// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 10 * time.Second
	// bindAttempts is how many free ports Start tries before giving up; a
	// port found free can be taken by another process before redis binds it.
	bindAttempts = 10
	// pollInterval is the pause between readiness probes.
	pollInterval = 10 * time.Millisecond
)

// ErrNotInstalled is returned (wrapped) when redis-server or redis-cli is not
// on PATH.
var ErrNotInstalled = errors.New("run `make test`, which installs it")

// Options configures Start. The zero value is a plain in-memory server.
type Options struct {
	// Args are extra redis-server arguments appended after the defaults,
	// e.g. "--maxmemory", "1mb". Later arguments win in redis-server. With
	// "--cluster-enabled", "yes" the cluster bus gets a free port of its
	// own (--cluster-port).
	Args []string
	// Dir is the server's working directory (its log file lives there).
	// Defaults to a new temporary directory, removed by Stop.
	Dir string
	// Sentinel, if set, runs the server as a Redis Sentinel
	// (redis-server FILE --sentinel) whose configuration file holds these
	// lines, e.g. "sentinel monitor mymaster 127.0.0.1 6379 1". Sentinel
	// rewrites the file as it runs; each start writes it afresh, in Dir.
	Sentinel []string
}

// Server is one redis-server process listening on 127.0.0.1.
type Server struct {
	// Addr is "127.0.0.1:port".
	Addr string

	port     int
	busPort  int      // cluster bus port; 0 unless cluster mode is on
	args     []string // extra arguments from Options
	sentinel []string // sentinel configuration lines from Options
	dir      string
	ownDir   bool // dir was created by Start and is removed by Stop
	logPath  string

	mu      sync.Mutex
	proc    *process // nil while stopped
	stopped bool     // Stop was called; the server cannot be restarted
	lastLog string   // log captured by Stop, before the directory goes
}

// process is one run of redis-server; a Server has one per Start/Restart.
type process struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited
}

// Start launches redis-server on a free loopback port with persistence off
// (--save "" --appendonly no) and returns once it answers PING. ctx bounds
// the start-up only; the server runs until Stop.
func Start(ctx context.Context, o Options) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found: %w", ErrNotInstalled)
	}
	s := &Server{args: append([]string(nil), o.Args...), sentinel: append([]string(nil), o.Sentinel...), dir: o.Dir}
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "redisproc-")
		if err != nil {
			return nil, fmt.Errorf("redis-server: make working dir: %w", err)
		}
		s.dir, s.ownDir = dir, true
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("redis-server: make working dir %s: %w", s.dir, err)
	}

	ctx, cancel := withDefaultTimeout(ctx, readyTimeout)
	defer cancel()
	var lastErr error
	for range bindAttempts {
		port, err := freePort()
		if err != nil {
			s.removeDir()
			return nil, err
		}
		s.setPort(port)
		if clusterEnabled(s.args) {
			// The bus port defaults to port+10000, which may be taken or
			// (for ports above 55535) invalid: pick a free one too. It
			// stays the same across restarts, as the other nodes know it.
			for s.busPort == 0 || s.busPort == port {
				if s.busPort, err = freePort(); err != nil {
					s.removeDir()
					return nil, err
				}
			}
		}
		p, err := s.launch(ctx)
		if err == nil {
			s.proc = p
			return s, nil
		}
		lastErr = err
		if !errors.Is(err, errBind) {
			break
		}
	}
	s.removeDir()
	return nil, lastErr
}

// StartT is Start for tests: it fails the test when the server cannot start,
// stops it at cleanup, and prints the server's log when the test failed.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found: run `make test`, which installs it")
	}
	s, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop redis-server %s: %v", s.Addr, err)
		}
		if t.Failed() {
			t.Logf("redis-server %s log:\n%s", s.Addr, s.Log())
		}
	})
	return s
}

// URL is the server's address as a redis:// URL for database 0.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// Dir is the server's working directory.
func (s *Server) Dir() string { return s.dir }

// Client returns a go-redis client for the server, closed at test cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CPUTime returns the CPU time (user and system) the server has used since
// it last started, as INFO cpu reports it.
func (s *Server) CPUTime(ctx context.Context) (time.Duration, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var d time.Duration
	for line := range strings.SplitSeq(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				sec, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO cpu: %s%s: %w", k, v, err)
				}
				d += time.Duration(sec * float64(time.Second))
			}
		}
	}
	return d, nil
}

// CommandCalls returns how many times the Redis at addr has run the
// commands named (lower case, as INFO commandstats names them), together,
// since it started.
func CommandCalls(ctx context.Context, addr string, commands ...string) (int64, error) {
	calls, _, err := CommandCounts(ctx, addr, commands...)
	return calls, err
}

// CommandCounts returns, from one INFO commandstats of the Redis at addr,
// how many times it has run the commands named (calls) and how many of them
// it refused without running them (rejected_calls: a MOVED or ASK
// redirection, a NOPERM, ...), together, since it started.
func CommandCounts(ctx context.Context, addr string, commands ...string) (calls, rejected int64, err error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, fields, ok := strings.Cut(line, ":")
		cmd, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat || !slices.Contains(commands, cmd) {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			var sum *int64
			switch k {
			case "calls":
				sum = &calls
			case "rejected_calls":
				sum = &rejected
			default:
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("INFO commandstats: %s: %w", line, err)
			}
			*sum += n
		}
	}
	return calls, rejected, nil
}

// Log returns what the server has logged so far (across restarts).
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return s.lastLog
	}
	return s.readLog()
}

// Stop ends the server: SIGTERM, then SIGKILL if it has not exited within
// 10 s. It removes the working directory when Start created it. Stop is
// idempotent; a stopped server cannot be restarted.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	err := s.terminate()
	s.lastLog = s.readLog()
	s.removeDir()
	return err
}

// Kill ends the server abruptly with SIGKILL, as a crash would, and waits for
// it to exit. Restart brings it back.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !p.exited() {
		return fmt.Errorf("kill redis-server %s: %w", s.Addr, err)
	}
	<-p.done
	p.log.Close()
	return nil
}

// Pause stops the server with SIGSTOP, as a hung host or a long stall
// would: its connections stay open and nothing is answered. Resume, Stop
// or Kill ends the pause.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("redis-server %s is not running", s.Addr)
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to redis-server %s: %w", sig, s.Addr, err)
	}
	return nil
}

// Restart stops the server if it runs and starts it again on the same port
// with empty data (any RDB or AOF files it wrote are removed first). A
// cluster node keeps its nodes.conf and so rejoins its cluster, empty.
func (s *Server) Restart(ctx context.Context) error { return s.restart(ctx, false) }

// RestartKeepingData is Restart as an operator's restart of the same server
// is (docker restart, a container recreated on the same volume): SIGTERM,
// then the server started again on the same port and directory, loading
// whatever RDB or AOF files its own settings wrote (none with the default
// --save "" --appendonly no).
func (s *Server) RestartKeepingData(ctx context.Context) error { return s.restart(ctx, true) }

func (s *Server) restart(ctx context.Context, keepData bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("restart redis-server %s: already stopped", s.Addr)
	}
	if err := s.terminate(); err != nil {
		return err
	}
	if !keepData {
		for _, name := range []string{s.rdbName(), s.aofDirName()} {
			if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
				return fmt.Errorf("restart redis-server %s: remove old data: %w", s.Addr, err)
			}
		}
	}
	ctx, cancel := withDefaultTimeout(ctx, readyTimeout)
	defer cancel()
	p, err := s.launch(ctx)
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// errBind marks a start that failed because the port was taken.
var errBind = errors.New("port already in use")

func (s *Server) setPort(port int) {
	s.port = port
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.logPath = filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", port))
}

// File names carry the port so that servers sharing a directory (Options.Dir)
// never share files.
func (s *Server) rdbName() string    { return fmt.Sprintf("dump-%d.rdb", s.port) }
func (s *Server) aofDirName() string { return fmt.Sprintf("appendonly-%d", s.port) }

// launch starts one process on s.port and waits until it is ready. On
// failure the process is gone and the error says why.
func (s *Server) launch(ctx context.Context) (*process, error) {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--dbfilename", s.rdbName(),
		"--appenddirname", s.aofDirName(),
		// An empty logfile sends the log to stdout, which goes to the log
		// file below together with anything printed before logging starts
		// (bad arguments, for instance).
		"--logfile", "",
		"--daemonize", "no",
	}
	if s.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	args = append(args, s.args...)
	if len(s.sentinel) > 0 {
		// The file comes first; the options after it override it.
		conf := filepath.Join(s.dir, fmt.Sprintf("sentinel-%d.conf", s.port))
		if err := os.WriteFile(conf, []byte(strings.Join(s.sentinel, "\n")+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("redis-server: write sentinel config: %w", err)
		}
		args = append([]string{conf, "--sentinel"}, args...)
	}
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("redis-server: open log: %w", err)
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	testkit.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("redis-server: start: %w", err)
	}
	p := &process{cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	if err := s.waitReady(ctx, p); err != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		logFile.Close()
		return nil, err
	}
	return p, nil
}

// waitReady polls PING until the server answers, and checks that the answer
// comes from this process: if our process lost the race for the port,
// another Redis may be listening there.
func (s *Server) waitReady(ctx context.Context, p *process) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			log := s.readLog()
			if strings.Contains(log, "Address already in use") {
				return fmt.Errorf("redis-server %s: %w", s.Addr, errBind)
			}
			return fmt.Errorf("redis-server %s exited during start-up (%v); log:\n%s",
				s.Addr, p.cmd.ProcessState, lastLines(log, 20))
		default:
		}
		if pid, err := probe(ctx, s.Addr); err == nil && pid == p.cmd.Process.Pid {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis-server %s not ready: %w; log:\n%s",
				s.Addr, ctx.Err(), lastLines(s.readLog(), 20))
		case <-p.done:
		case <-tick.C:
		}
	}
}

// probe sends PING and INFO server to addr over one connection and returns
// the server's process id. It speaks RESP directly (rather than through a
// client library) so that the refused connections expected while a server
// starts cost one dial each and log nothing.
func probe(ctx context.Context, addr string) (int, error) {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "+PONG\r\n" {
		return 0, fmt.Errorf("PING answered %q", line)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if !strings.HasPrefix(line, "$") || err != nil || size < 0 {
		return 0, fmt.Errorf("INFO answered %q", line)
	}
	info := make([]byte, size)
	if _, err := io.ReadFull(r, info); err != nil {
		return 0, err
	}
	return strconv.Atoi(infoField(string(info), "process_id"))
}

// terminate sends SIGTERM, waits, and falls back to SIGKILL. s.mu is held.
func (s *Server) terminate() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	defer p.log.Close()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !p.exited() {
		return fmt.Errorf("stop redis-server %s: %w", s.Addr, err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused server acts on the SIGTERM
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("stop redis-server %s: no exit %v after SIGTERM, killed", s.Addr, stopTimeout)
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (s *Server) readLog() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

func (s *Server) removeDir() {
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}

// freePort asks the kernel for a free loopback port. The port is released
// before redis-server binds it, so a start can still lose a race; Start
// retries with another port when that happens.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// clusterEnabled reports whether args turn on cluster mode.
func clusterEnabled(args []string) bool {
	for i, a := range args {
		if a == "--cluster-enabled" && i+1 < len(args) && strings.EqualFold(args[i+1], "yes") {
			return true
		}
	}
	return false
}

// InfoStat returns the integer field of c's INFO stats (expired_keys,
// total_connections_received, ...), and fails t if there is none.
func InfoStat(t testing.TB, c *redis.Client, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatalf("INFO stats of %s: %v", c.Options().Addr, err)
	}
	v := infoField(info, field)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("INFO stats of %s: %s = %q: %v", c.Options().Addr, field, v, err)
	}
	return n
}

// infoField returns the value of "name:value" in an INFO or CLUSTER INFO reply.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
