package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/gotool"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/syncbuf"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, o *options)
	}{
		{"defaults", []string{"-plans", "p.yaml"}, nil, func(t *testing.T, o *options) {
			if o.cfg.Listen != "127.0.0.1:8081" || o.cfg.RedisTimeout != 4*time.Millisecond ||
				o.cfg.Redis.Redacted != "redis://127.0.0.1:6379/0" || o.cfg.PlansPath != "p.yaml" ||
				o.cfg.Pipelines != 4 || o.cfg.MaxBatch != 128 || o.cfg.PlansPoll != time.Second || o.cfg.NoDenyCache || o.check {
				t.Errorf("defaults: %+v", o.cfg)
			}
		}},
		{"environment", nil, map[string]string{
			"SIDECAR_LISTEN": "0.0.0.0:9000", "SIDECAR_REDIS": "redis+cluster://h1:1,h2:2", "SIDECAR_PLANS": "/etc/plans.yaml",
			"SIDECAR_REDIS_TIMEOUT": "5ms", "SIDECAR_KEY_SALT": "pepper", "SIDECAR_CHECK": "true", "SIDECAR_LOG_LEVEL": "debug",
			"SIDECAR_DENY_CACHE": "false",
		}, func(t *testing.T, o *options) {
			if o.cfg.Listen != "0.0.0.0:9000" || o.cfg.Redis.Kind.String() != "cluster" || o.cfg.PlansPath != "/etc/plans.yaml" || !o.cfg.NoDenyCache ||
				o.cfg.RedisTimeout != 5*time.Millisecond || string(o.cfg.KeySalt) != "pepper" || !o.check || o.logLevel.String() != "DEBUG" {
				t.Errorf("from env: %+v check=%v level=%v", o.cfg, o.check, o.logLevel)
			}
		}},
		{"admin listener and password", []string{"-plans", "p", "-admin-listen", ":8082"},
			map[string]string{"SIDECAR_REDIS_PASSWORD": "s3cret", "SIDECAR_REDIS": "redis+sentinel://s1:26379/mymaster"}, func(t *testing.T, o *options) {
				if o.cfg.AdminListen != ":8082" || !o.cfg.Redis.HasPassword() || strings.Contains(o.cfg.Redis.Redacted, "s3cret") {
					t.Errorf("admin %q, password set %v, redacted %q", o.cfg.AdminListen, o.cfg.Redis.HasPassword(), o.cfg.Redis.Redacted)
				}
			}},
		// Ports of the system's choice, and one port on two loopback
		// addresses, can all be bound.
		{"listeners that can both be bound", []string{"-plans", "p", "-listen", "127.0.0.1:0", "-admin-listen", ":0"}, nil, func(t *testing.T, o *options) {
			if o.cfg.Listen != "127.0.0.1:0" || o.cfg.AdminListen != ":0" {
				t.Errorf("listen %q, admin %q", o.cfg.Listen, o.cfg.AdminListen)
			}
		}},
		{"one address, ports of the system's choice", []string{"-plans", "p", "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0"}, nil, func(t *testing.T, o *options) {
			if o.cfg.Listen != "127.0.0.1:0" || o.cfg.AdminListen != "127.0.0.1:0" {
				t.Errorf("listen %q, admin %q", o.cfg.Listen, o.cfg.AdminListen)
			}
		}},
		{"one port on two addresses", []string{"-plans", "p", "-listen", "127.0.0.1:8081", "-admin-listen", "127.0.0.2:8081"}, nil, func(t *testing.T, o *options) {
			if o.cfg.AdminListen != "127.0.0.2:8081" {
				t.Errorf("admin %q", o.cfg.AdminListen)
			}
		}},
		// IPv4 and IPv6 loopbacks are two sockets, both bindable on one port.
		{"one port on the IPv4 and IPv6 loopbacks", []string{"-plans", "p", "-listen", "[::1]:8081", "-admin-listen", "127.0.0.1:8081"}, nil, func(t *testing.T, o *options) {
			if o.cfg.Listen != "[::1]:8081" || o.cfg.AdminListen != "127.0.0.1:8081" {
				t.Errorf("listen %q, admin %q", o.cfg.Listen, o.cfg.AdminListen)
			}
		}},
		{"no admin listener by default", []string{"-plans", "p"}, nil, func(t *testing.T, o *options) {
			if o.cfg.AdminListen != "" || o.cfg.Redis.HasPassword() {
				t.Errorf("admin %q, password set %v", o.cfg.AdminListen, o.cfg.Redis.HasPassword())
			}
		}},
		{"a flag given leaves its variable unread", []string{"-redis-timeout", "3ms", "-plans", "p"},
			map[string]string{"SIDECAR_REDIS_TIMEOUT": "abc"}, func(t *testing.T, o *options) {
				if o.cfg.RedisTimeout != 3*time.Millisecond {
					t.Errorf("redis timeout %v, want the command line's 3ms", o.cfg.RedisTimeout)
				}
			}},
		{"flag wins over environment", []string{"-redis-timeout", "7ms", "-plans", "flag.yaml"},
			map[string]string{"SIDECAR_REDIS_TIMEOUT": "5ms", "SIDECAR_PLANS": "env.yaml"}, func(t *testing.T, o *options) {
				if o.cfg.RedisTimeout != 7*time.Millisecond || o.cfg.PlansPath != "flag.yaml" {
					t.Errorf("precedence: %+v", o.cfg)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, envOf(tt.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestParseOptionsErrors(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "-plans (SIDECAR_PLANS): required: the path of the plans file"},
		{[]string{"-plans", "p", "-listen", "localhost"}, nil, `-listen (SIDECAR_LISTEN): must be host:port, got "localhost"`},
		{[]string{"-plans", "p", "-listen", "127.0.0.1:70000"}, nil, `-listen (SIDECAR_LISTEN): must be host:port, got "127.0.0.1:70000"`},
		{[]string{"-plans", "p", "-admin-listen", "8082"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must be host:port, got "8082"`},
		{[]string{"-plans", "p", "-admin-listen", "127.0.0.1:8081"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must differ from -listen, got "127.0.0.1:8081" for both`},
		// A wildcard address holds the port on every address: neither
		// of these pairs can both be bound, and the sidecar would stop at
		// start on the second.
		{[]string{"-plans", "p", "-admin-listen", ":8081"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must not take -listen's port, got ":8081" beside -listen "127.0.0.1:8081": both cannot be bound`},
		{[]string{"-plans", "p", "-listen", "0.0.0.0:9000", "-admin-listen", "[::1]:9000"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must not take -listen's port, got "[::1]:9000" beside -listen "0.0.0.0:9000": both cannot be bound`},
		// One IP address written two ways is one socket; so is an
		// IPv4-mapped IPv6 address and its IPv4 address, which Go binds as
		// the IPv4 one; [0::] is the IPv6 wildcard.
		{[]string{"-plans", "p", "-listen", "[::1]:9000", "-admin-listen", "[0:0:0:0:0:0:0:1]:9000"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must not take -listen's port, got "[0:0:0:0:0:0:0:1]:9000" beside -listen "[::1]:9000": both cannot be bound`},
		{[]string{"-plans", "p", "-listen", "127.0.0.1:9000", "-admin-listen", "[::ffff:127.0.0.1]:9000"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must not take -listen's port, got "[::ffff:127.0.0.1]:9000" beside -listen "127.0.0.1:9000": both cannot be bound`},
		{nil, map[string]string{"SIDECAR_PLANS": "p", "SIDECAR_LISTEN": "[::1]:9000", "SIDECAR_ADMIN_LISTEN": "[0::]:9000"}, `-admin-listen (SIDECAR_ADMIN_LISTEN): must not take -listen's port, got "[0::]:9000" beside -listen "[::1]:9000": both cannot be bound`},
		{[]string{"-plans", "p", "-listen", "[::]:9000", "-admin-listen", "0.0.0.0:9000"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must not take -listen's port, got "0.0.0.0:9000" beside -listen "[::]:9000": both cannot be bound`},
		{nil, map[string]string{"SIDECAR_PLANS": "p", "SIDECAR_ADMIN_LISTEN": ":99999"}, `-admin-listen (SIDECAR_ADMIN_LISTEN): must be host:port, got ":99999"`},
		{[]string{"-plans", "p", "-redis", "redis://:hunter2@h:1", "-redis-password", "other"}, nil, `-redis-password (SIDECAR_REDIS_PASSWORD): the -redis URL has a password already; give it in one place`},
		{[]string{"-plans", "p", "-redis", "http://h:1"}, nil, `-redis (SIDECAR_REDIS): http://h:1: scheme "http" is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel`},
		{[]string{"-plans", "p", "-redis", "redis://u:hunter2@h:0"}, nil, `-redis (SIDECAR_REDIS): redis://u:xxxxx@h:0: address "h:0": port must be 1 to 65535`},
		{[]string{"-plans", "p", "-redis-timeout", "0s"}, nil, "-redis-timeout (SIDECAR_REDIS_TIMEOUT): must be > 0 and <= 1m, got 0s"},
		{[]string{"-plans", "p", "-redis-pipelines", "0"}, nil, "-redis-pipelines (SIDECAR_REDIS_PIPELINES): must be 1 to 256, got 0"},
		{[]string{"-plans", "p", "-redis-max-batch", "0"}, nil, "-redis-max-batch (SIDECAR_REDIS_MAX_BATCH): must be 1 to 10000, got 0"},
		{[]string{"-plans", "p", "-plans-poll", "1ms"}, nil, "-plans-poll (SIDECAR_PLANS_POLL): must be >= 10ms, got 1ms"},
		{[]string{"-plans", "p", "-log-level", "loud"}, nil, `-log-level (SIDECAR_LOG_LEVEL): must be debug, info, warn or error, got "loud"`},
		{[]string{"-plans", "p", "-log-format", "xml"}, nil, `-log-format (SIDECAR_LOG_FORMAT): must be text or json, got "xml"`},
		{nil, map[string]string{"SIDECAR_REDIS_TIMEOUT": "soon"}, `SIDECAR_REDIS_TIMEOUT (-redis-timeout): want a duration such as 3ms or 1s, got "soon"`},
		{nil, map[string]string{"SIDECAR_REDIS_PIPELINES": "many"}, `SIDECAR_REDIS_PIPELINES (-redis-pipelines): want a whole number, got "many"`},
		{nil, map[string]string{"SIDECAR_CHECK": "maybe"}, `SIDECAR_CHECK (-check): want true or false, got "maybe"`},
		{nil, map[string]string{"SIDECAR_REDIS_TIMEOUT": "soon", "SIDECAR_REDIS_PIPELINES": "many"},
			"SIDECAR_REDIS_PIPELINES (-redis-pipelines): want a whole number, got \"many\"\n" +
				`SIDECAR_REDIS_TIMEOUT (-redis-timeout): want a duration such as 3ms or 1s, got "soon"`},
		{[]string{"-plans", "p", "-admin-listen", "127.0.0.1:+80"}, nil, `-admin-listen (SIDECAR_ADMIN_LISTEN): must be host:port, got "127.0.0.1:+80"`},
		{[]string{"-plans", "p", "extra"}, nil, `unexpected argument "extra": every setting is a flag`},
		{[]string{"-nope"}, nil, "flag provided but not defined: -nope"},
	}
	for _, tt := range tests {
		_, err := parseOptions(tt.args, envOf(tt.env), io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("parseOptions(%q, %v) = %v\nwant %s", tt.args, tt.env, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error leaks the Redis password: %v", err)
		}
	}
}

func TestUsageListsEveryEnvVar(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-h"}, envOf(nil), io.Discard, &out); code != 0 {
		t.Fatalf("-h exit %d", code)
	}
	for _, want := range []string{
		"SIDECAR_LISTEN", "SIDECAR_ADMIN_LISTEN", "SIDECAR_REDIS_PASSWORD", "SIDECAR_REDIS (", "SIDECAR_PLANS\n", "SIDECAR_REDIS_TIMEOUT", "SIDECAR_CHECK", "SIDECAR_KEY_SALT",
		"SIDECAR_PLANS_POLL", "SIDECAR_REDIS_PIPELINES", "SIDECAR_REDIS_MAX_BATCH", "SIDECAR_DENY_CACHE", "SIDECAR_LOG_LEVEL", "SIDECAR_LOG_FORMAT",
		"redis+cluster://", "redis+sentinel://", "rediss://", `(default "4ms")`, `(default "127.0.0.1:8081")`,
		"POST /v1/warm",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h does not mention %q", want)
		}
	}
}

func TestCheckFlag(t *testing.T) {
	tests := []struct {
		name   string
		plans  string
		code   int
		stdout string
		stderr string
	}{
		{"valid", "plans/testdata/valid.yaml", 0, "ok: plans/testdata/valid.yaml: 3 plans, 3 clients, default plan free; redis redis://127.0.0.1:6379/0 (standalone)\n", ""},
		{"invalid", "plans/testdata/invalid/default-unknown.yaml", 1, "", "sidecar: plans/testdata/invalid/default-unknown.yaml:1: default_plan: no plan named \"gold\" (plans: free)\n"},
		{"missing", "nope.yaml", 1, "", "sidecar: read plans: open nope.yaml: no such file or directory\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run([]string{"-check", "-plans", tt.plans}, envOf(nil), &stdout, &stderr)
			if code != tt.code || stdout.String() != tt.stdout || stderr.String() != tt.stderr {
				t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant %d %q %q", code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

// buildSidecar builds the sidecar's binary into a directory of the test's
// own, and returns that directory and the binary's path.
func buildSidecar(t *testing.T) (dir, bin string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "sidecar")
	if err := gotool.Run(context.Background(), ".", nil, "build", "-o", bin, "."); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// stopOnCleanup kills the started sidecar cmd at the end of the test if it
// is still running, waiting for exited (where its Wait reports), and logs
// what it wrote if the test failed.
func stopOnCleanup(t *testing.T, cmd *exec.Cmd, exited <-chan error, logs fmt.Stringer) {
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("sidecar log:\n%s", logs.String())
		}
	})
}

// TestBinary builds the real binary and drives it as a user would: start it
// with environment settings, wait for /healthz, check, reload on SIGHUP,
// stop with SIGTERM.
func TestBinary(t *testing.T) {
	dir, bin := buildSidecar(t)

	// -check on a bad config: exit 1, the error names file, field and value.
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("plans:\n  free: {capacity: 10, rate: -2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-check", "-plans", bad).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), bad+":2: plans.free.rate: must be a number of tokens per second > 0 and <= 1000000000, got -2") {
		t.Fatalf("-check bad: exit %d\n%s", code, out)
	}

	srv := redisproc.StartT(t, redisproc.Options{})
	plansPath := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(plansPath, []byte("default_plan: free\nplans:\n  free: {capacity: 2, rate: 0.001}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-log-format", "json")
	cmd.Env = append(os.Environ(), "SIDECAR_REDIS="+srv.URL(), "SIDECAR_PLANS="+plansPath, "SIDECAR_REDIS_TIMEOUT=1s", "SIDECAR_KEY_SALT=s3cret")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	testkit.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var logs bytes.Buffer
	logLines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			select {
			case logLines <- sc.Text():
			default:
			}
		}
		exited <- cmd.Wait()
	}()
	stopOnCleanup(t, cmd, exited, &logs)

	// The listening address is in the start-up log line.
	addrRE := regexp.MustCompile(`"msg":"sidecar listening","addr":"([0-9.:]+)"`)
	var addr string
	timeout := time.After(30 * time.Second)
	for addr == "" {
		select {
		case line := <-logLines:
			if m := addrRE.FindStringSubmatch(line); m != nil {
				addr = m[1]
			}
		case <-timeout:
			t.Fatal("no start-up log line")
		}
	}
	get := func(method, path string, headers ...string) (int, string) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + path)
		req.Header.SetMethod(method)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		if err := fasthttp.DoTimeout(req, resp, 10*time.Second); err != nil {
			return 0, err.Error()
		}
		return resp.StatusCode(), string(resp.Header.Peek("x-ratelimit-plan")) + string(resp.Header.Peek("ratelimit-limit"))
	}
	testkit.Poll(t, 30*time.Second, "/healthz to answer 200", func() bool {
		code, _ := get("GET", "/healthz")
		return code == 200
	})
	// The container health check: the binary's own HTTP probe.
	for path, want := range map[string]int{"/readyz": 0, "/nowhere": 1} {
		out, err := exec.Command(bin, "healthcheck", "http://"+addr+path).CombinedOutput()
		if code := exitCode(err); code != want {
			t.Errorf("sidecar healthcheck %s: exit %d, want %d\n%s", path, code, want, out)
		}
	}
	for i, want := range []int{200, 200, 429} {
		if code, _ := get("POST", "/v1/check", "x-api-key", "binary-client"); code != want {
			t.Fatalf("check %d: %d, want %d", i+1, code, want)
		}
	}
	// With SIDECAR_KEY_SALT set the bucket is an HMAC, not a plain SHA-256.
	names, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil || len(names) != 1 || strings.Contains(names[0], "binary-client") ||
		names[0] == "rl:{"+fmt.Sprintf("%x", sha256Of("binary-client"))+"}" {
		t.Fatalf("Redis keys %v, %v: want one salted digest key", names, err)
	}

	// SIGHUP reloads a changed file at once (the poll would too, later).
	if err := os.WriteFile(plansPath, []byte("default_plan: big\nplans:\n  big: {capacity: 500, rate: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.PollErr(t, 30*time.Second, "the new plan in force after SIGHUP", func() error {
		if _, plan := get("POST", "/v1/check", "x-api-key", "other"); plan != "big500" {
			return fmt.Errorf("got %q", plan)
		}
		return nil
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	for _, secret := range []string{"binary-client", "s3cret"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("log contains %q", secret)
		}
	}
	if !strings.Contains(logs.String(), `"msg":"plans reloaded"`) || !strings.Contains(logs.String(), `"msg":"sidecar stopped"`) {
		t.Errorf("log lacks the reload or the stop")
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

func sha256Of(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// An address the sidecar cannot bind stops it at once, naming the flag and
// its variable as a bad value does, for either listener.
func TestRunNamesTheListenerItCannotBind(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	plansPath := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(plansPath, []byte("default_plan: free\nplans:\n  free: {capacity: 2, rate: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := taken.Addr().String()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-listen", addr}, "-listen (SIDECAR_LISTEN): listen tcp " + addr + ": bind: address already in use"},
		{[]string{"-listen", "127.0.0.1:0", "-admin-listen", addr}, "-admin-listen (SIDECAR_ADMIN_LISTEN): listen tcp " + addr + ": bind: address already in use"},
	} {
		var stderr bytes.Buffer
		// Redis is never asked: the listeners are bound before it is.
		args := append([]string{"-plans", plansPath, "-redis", "redis://127.0.0.1:1/0"}, tt.args...)
		if code := run(args, envOf(nil), io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("run(%q): exit %d, want 1 and %q in\n%s", tt.args, code, tt.want, stderr.String())
		}
	}
}

// TestREADMEListsEveryFlag holds sidecar/README.md's Configuration table to
// what -h prints: one row per flag, with the flag's variable and default,
// and no row for a flag the sidecar does not have.
func TestREADMEListsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-h"}, envOf(nil), io.Discard, &out); code != 0 {
		t.Fatalf("-h exit %d", code)
	}
	type flagDoc struct{ env, def string }
	// "  -name [type]" then "    \t... " lines, the last "env VAR [(default "x")]".
	help := map[string]flagDoc{}
	flagLine := regexp.MustCompile(`^  -([a-z-]+)`)
	envLine := regexp.MustCompile(`^\s+env (SIDECAR_[A-Z_]+)(?: \(default "(.*)"\))?$`)
	name := ""
	for _, line := range strings.Split(out.String(), "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			name = m[1]
			continue
		}
		if m := envLine.FindStringSubmatch(line); m != nil && name != "" {
			help[name] = flagDoc{m[1], m[2]}
			name = ""
		}
	}
	if len(help) < 10 {
		t.Fatalf("read %d flags from -h, want every one:\n%s", len(help), out.String())
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `-([a-z-]+)` \\| `(SIDECAR_[A-Z_]+)` \\| ([^|]+) \\|")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		name, env, def := m[1], m[2], strings.TrimSpace(m[3])
		documented[name] = true
		h, ok := help[name]
		if !ok {
			t.Errorf("README.md documents -%s, which -h does not list", name)
			continue
		}
		if env != h.env {
			t.Errorf("README.md: -%s's variable is %s, -h says %s", name, env, h.env)
		}
		want := "`" + h.def + "`"
		if h.def == "" {
			want = "(none), (required) or `false`"
		}
		if (h.def != "" && def != want) || (h.def == "" && def != "(none)" && def != "(required)" && def != "`false`") {
			t.Errorf("README.md: -%s's default is %s, -h says %s", name, def, want)
		}
	}
	for name := range help {
		if !documented[name] {
			t.Errorf("-h lists -%s, which README.md's Configuration table does not", name)
		}
	}
}

// TestSignalDuringStart: a SIGHUP or SIGTERM that reaches the sidecar while
// it starts, its listener already serving and Redis not yet answering, is
// acted on once the start is done, as one that comes later: SIGHUP
// reloads the plans and the sidecar runs on, SIGTERM stops it with exit
// status 0. The signal is sent when the sidecar's first connection to
// Redis comes in, which the start makes to see whether Redis is ready and
// waits up to a second on; this Redis never answers.
func TestSignalDuringStart(t *testing.T) {
	dir, bin := buildSidecar(t)
	plansPath := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(plansPath, []byte("default_plan: free\nplans:\n  free: {capacity: 2, rate: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			connected := make(chan struct{}, 1)
			redisAddr := testkit.RawServer(t, func(c net.Conn, br *bufio.Reader) {
				select {
				case connected <- struct{}{}:
				default:
				}
				io.Copy(io.Discard, br) // read every command, answer none
			})
			cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-log-format", "json", "-plans", plansPath, "-redis", "redis://"+redisAddr+"/0")
			var logs syncbuf.Buffer
			cmd.Stderr = &logs
			testkit.DieWithParent(cmd)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			stopOnCleanup(t, cmd, exited, &logs)
			select {
			case <-connected:
			case err := <-exited:
				t.Fatalf("exited before it reached Redis: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("no connection to Redis")
			}
			if strings.Contains(logs.String(), `"msg":"sidecar listening"`) {
				t.Fatal("the start was over before the signal; this test sends it during the start")
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if sig == syscall.SIGTERM {
				select {
				case err := <-exited:
					if err != nil {
						t.Fatalf("exit after SIGTERM during the start: %v, want status 0", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("no exit after SIGTERM")
				}
				if !strings.Contains(logs.String(), `"msg":"sidecar stopped"`) {
					t.Error("log lacks the stop")
				}
				return
			}
			testkit.PollErr(t, 30*time.Second, "the plans reloaded after the start", func() error {
				select {
				case err := <-exited:
					t.Fatalf("exited after SIGHUP during the start: %v", err)
				default:
				}
				if !strings.Contains(logs.String(), `"msg":"plans reloaded"`) {
					return fmt.Errorf("no reload logged yet")
				}
				return nil
			})
		})
	}
}
