package main

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// The envoyproxy/ratelimit module's main package and the directory of the
// bench's own module that pins it as a tool (the main module does not pull
// its dependencies); `make bench` builds both binaries into build/.
const (
	rlsModuleDir = "e2e/bench/rls"
	rlsMainPkg   = "github.com/envoyproxy/ratelimit/src/service_cmd"
	rlsLoadPkg   = "./rlsload"
)

// rlsDomain and rlsKey are the descriptor every benchmark request carries:
// domain "bench", one entry client=<one of the API keys>. The limit is far
// above what any run sends, so every check is allowed, as for the sidecar.
const (
	rlsDomain = "bench"
	rlsKey    = "client"
	// rlsUnit is the fixed window. An hour keeps the key set at the 10,000
	// descriptors for the whole run, as the sidecar's buckets are; a
	// per-second window would also create up to 10,000 keys a second.
	rlsUnit = "hour"
)

// rlsService is envoyproxy/ratelimit running on the benchmark's Redis.
type rlsService struct {
	cmd      *exec.Cmd
	grpcAddr string
	name     string
	done     chan error
	log      *os.File
}

// locateRLS returns the ratelimit and rlsload binaries: given, found in
// $EDGELIMIT_BIN_DIR, or built from the bench's rls module into dir.
func locateRLS(rlsBin, loadBin, dir string) (string, string, error) {
	binDir := os.Getenv("EDGELIMIT_BIN_DIR")
	for _, b := range []struct {
		path *string
		name string
		pkg  string
	}{{&rlsBin, "ratelimit", rlsMainPkg}, {&loadBin, "rlsload", rlsLoadPkg}} {
		if *b.path != "" {
			continue
		}
		if binDir != "" {
			if _, err := os.Stat(filepath.Join(binDir, b.name)); err == nil {
				*b.path = filepath.Join(binDir, b.name)
				continue
			}
		}
		*b.path = filepath.Join(dir, b.name)
		if err := goBuild(*b.path, rlsModuleDir, b.pkg); err != nil {
			return "", "", err
		}
	}
	return rlsBin, loadBin, nil
}

// freePort asks the kernel for a port nothing listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startRLS starts envoyproxy/ratelimit on the standalone Redis at redisAddr
// with a runtime directory holding the benchmark's one descriptor, extra
// environment on top (e.g. a pipeline window), and waits until its
// health check says the configuration is loaded.
func startRLS(bin, dir, name, redisAddr string, extra []string) (*rlsService, error) {
	root := filepath.Join(dir, "rls-"+name)
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return nil, err
	}
	yaml := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: %s\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n",
		rlsDomain, rlsKey, rlsUnit, int64(benchLimit.Capacity))
	if err := os.WriteFile(filepath.Join(conf, "bench.yaml"), []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	grpcPort, httpPort, debugPort := ports[0], ports[1], ports[2]
	env := append(os.Environ(),
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL="+redisAddr,
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true",
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(httpPort),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(debugPort),
	)
	env = append(env, extra...)
	logf, err := os.Create(filepath.Join(dir, "rls-"+name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	testkit.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	s := &rlsService{cmd: cmd, name: name, grpcAddr: "127.0.0.1:" + strconv.Itoa(grpcPort), done: make(chan error, 1), log: logf}
	go func() { s.done <- cmd.Wait() }()
	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort)
	var exited error
	healthy := testkit.Until(30*time.Second, func() bool {
		select {
		case exited = <-s.done:
			if exited == nil {
				exited = errors.New("exit status 0")
			}
			return true
		default:
		}
		resp, err := http.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	switch {
	case exited != nil:
		logf.Close()
		return nil, fmt.Errorf("ratelimit (%s) exited at start: %v\n%s", name, exited, tail(logf.Name()))
	case !healthy:
		s.stop()
		return nil, fmt.Errorf("ratelimit (%s) not healthy in 30s\n%s", name, tail(logf.Name()))
	}
	return s, nil
}

func (s *rlsService) pid() int { return s.cmd.Process.Pid }

func (s *rlsService) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
}

// tail returns the end of a log file, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// rlsLoad runs rlsload against addr for d: concurrency requests in flight
// over conns HTTP/2 connections, nkeys descriptor values.
func rlsLoad(bin, addr string, concurrency, conns, nkeys int, d time.Duration) (figures, error) {
	cmd := exec.Command(bin, "-addr", addr, "-c", strconv.Itoa(concurrency), "-conns", strconv.Itoa(conns),
		"-keys", strconv.Itoa(nkeys), "-d", d.String(), "-domain", rlsDomain, "-key", rlsKey)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return figures{}, fmt.Errorf("rlsload: %v\n%s%s", err, out, stderr.String())
	}
	m := regexp.MustCompile(`RLSLOAD (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		return figures{}, fmt.Errorf("rlsload output not understood:\n%s%s", out, stderr.String())
	}
	v := make([]int64, 7)
	for i := 1; i <= 6; i++ {
		v[i], _ = strconv.ParseInt(m[i], 10, 64)
	}
	us := func(x int64) time.Duration { return time.Duration(x) * time.Microsecond }
	f := figures{rps: float64(v[1]) / (float64(v[3]) / 1e6), p50: us(v[4]), p99: us(v[5]), p999: us(v[6]), decisions: v[1], errors: v[2]}
	if f.errors > 0 {
		_, f.firstErr, _ = strings.Cut(stderr.String(), "RLSLOAD first error: ")
		f.firstErr = strings.TrimSpace(f.firstErr)
		if f.firstErr == "" {
			f.firstErr = "rlsload counted answers other than OK/OVER_LIMIT"
		}
	}
	if f.decisions == 0 {
		return f, errors.New("rlsload: no check decided: " + f.firstErr)
	}
	return f, nil
}

// rlsVersion is the envoyproxy/ratelimit module version bin was built
// from (its build information), "unknown" if it cannot be read.
func rlsVersion(bin string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "unknown"
	}
	const mod = "github.com/envoyproxy/ratelimit"
	if info.Main.Path == mod {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == mod {
			return d.Version
		}
	}
	return "unknown"
}

// rlsRatios collects, round by round, the sidecar's figures over RLS's.
type rlsRatios struct {
	rps, service, redis, both, loadgen []float64
	p50, p99, rlsP50, rlsP99           []float64 // ms
}

func (v *rlsRatios) add(sc, rls figures, scCPU, rlsCPU perCheck) {
	v.rps = append(v.rps, sc.rps/rls.rps)
	v.service = append(v.service, scCPU.service/rlsCPU.service)
	v.redis = append(v.redis, scCPU.redis/rlsCPU.redis)
	v.both = append(v.both, (scCPU.service+scCPU.redis)/(rlsCPU.service+rlsCPU.redis))
	v.loadgen = append(v.loadgen, scCPU.loadgen/rlsCPU.loadgen)
	msf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	v.p50, v.p99 = append(v.p50, msf(sc.p50)), append(v.p99, msf(sc.p99))
	v.rlsP50, v.rlsP99 = append(v.rlsP50, msf(rls.p50)), append(v.rlsP99, msf(rls.p99))
}

func (v *rlsRatios) print(w io.Writer) {
	fmt.Fprintf(w, "ratio sidecar / envoyproxy/ratelimit, checks/s: median %.2f over %d rounds (%s)\n",
		stat.Median(v.rps), len(v.rps), stat.Join(v.rps, 2, ", "))
	fmt.Fprintf(w, "ratio sidecar / envoyproxy/ratelimit, CPU per check (medians of the rounds' ratios; below 1: the sidecar spends less):\n")
	fmt.Fprintf(w, "  service %.2f (%s), Redis %.2f (%s), service + Redis %.2f (%s), load generator %.2f (%s)\n",
		stat.Median(v.service), stat.Join(v.service, 2, ", "), stat.Median(v.redis), stat.Join(v.redis, 2, ", "),
		stat.Median(v.both), stat.Join(v.both, 2, ", "), stat.Median(v.loadgen), stat.Join(v.loadgen, 2, ", "))
	fmt.Fprintf(w, "latency at full load, median of the rounds: sidecar p50 %.3fms p99 %.3fms; envoyproxy/ratelimit p50 %.3fms p99 %.3fms\n",
		stat.Median(v.p50), stat.Median(v.p99), stat.Median(v.rlsP50), stat.Median(v.rlsP99))
}

// loaderLanguage says what each full-load generator (-load) is made of.
var loaderLanguage = map[string]string{
	"wrk": "wrk is C and LuaJIT",
	"go":  "the Go one is Go and fasthttp's client",
}

// rlsNote says what differs between the two sides beyond the code, so the
// ratios are read for what they are.
func rlsNote(cfg config) string {
	lines := []string{
		"What differs between the sidecar and envoyproxy/ratelimit (RLS) here, beyond the code:",
		fmt.Sprintf("- protocol: the sidecar answers HTTP/1.1 (%s: %d keep-alive connections, one request in flight on each, headers in and out);", cfg.loader, cfg.concurrency),
		fmt.Sprintf("  RLS answers gRPC over HTTP/2 (rlsload, Go: %d requests in flight multiplexed over %d connections, protobuf bodies), as Envoy calls it.", cfg.concurrency, cfg.rlsConns),
		fmt.Sprintf("  The load generators differ too (%s, rlsload Go and grpc-go): their CPU is in its own column, in neither service's.", loaderLanguage[cfg.loader]),
		"  They share the machine's cores with the services, so a costlier generator leaves its service less CPU: on a small machine read",
		"  the CPU per check beside checks/s, and the checks/s ratio as an upper bound on what the machine, not the service, allowed.",
		"- algorithm: the sidecar runs the token-bucket script, one EVALSHA per check (TIME, HMGET, HSET, PEXPIRE inside Redis; Redis counts",
		"  each as a command), batched across concurrent checks into pipelines (\"mean batch\"). RLS keeps a fixed-window counter: INCRBY and",
		"  EXPIRE per descriptor, sent together as a two-command pipeline, no script. The window admits up to twice the limit across a window",
		fmt.Sprintf("  edge and has no exact retry-after; the bucket refills smoothly. RLS's window here is one %s, so its key set stays at the %d", rlsUnit, cfg.keys),
		"  descriptors like the sidecar's buckets (a per-second window would also create keys every second).",
		"- RLS's settings: its defaults except the addresses, USE_STATSD=false (no stats sink; its in-process counters still count every",
		"  request) and the runtime directory. Local cache off (LOCAL_CACHE_SIZE_IN_BYTES=0): it only remembers keys already over their limit,",
		"  and no key is here, so turning it on would change nothing. NEAR_LIMIT_RATIO 0.8 only splits its statistics; no check is near the",
		"  limit. REDIS_POOL_SIZE 10: radix v4 shares those connections between concurrent calls (implicit pipelining, one flush per call).",
		"  LIMIT_RESPONSE_HEADERS_ENABLED is off (RLS sends no rate limit headers); the sidecar always sends its five.",
		"- deadlines: the sidecar gives Redis 4 ms (-redis-timeout) and answers 503 past it (\"not decided\": the filter fails open);",
		"  RLS waits up to REDIS_TIMEOUT, 10 s by default. On a saturated machine the sidecar sheds checks where RLS queues them.",
		"- pipelined mode: not run, because this RLS has none on standalone Redis. REDIS_PIPELINE_WINDOW sets radix v4's write-flush interval",
		"  only when REDIS_TYPE=cluster (src/redis/driver_impl.go), and REDIS_PIPELINE_LIMIT is deprecated and ignored since the move to radix v4.",
		"- both sides run on the same redis-server, one after the other within each round (the first alternating), with the same key count,",
		"  concurrency and phase length, and every check is allowed (both sides' writing path).",
	}
	return strings.Join(lines, "\n")
}
