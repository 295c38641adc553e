package e2e_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/redis/go-redis/v9"
)

// Security properties of the deployed binaries, each named in SECURITY.md.

// secret returns a distinctive API key: a fixed label and 16 random hex
// digits. The random part is searched for on its own, so that a key that
// leaks cut short or re-cased is still found.
func secret(t *testing.T, label string) (key, core string) {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	core = hex.EncodeToString(b[:])
	return "Sk-" + label + "-" + core, core
}

// monitor records every command Redis runs (MONITOR) until the test ends.
type monitor struct {
	mu   sync.Mutex
	buf  strings.Builder
	conn net.Conn
	done chan struct{}
}

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	m := &monitor{conn: conn, done: make(chan struct{})}
	if _, err := io.WriteString(conn, "MONITOR\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	go func() {
		defer close(m.done)
		for {
			line, err := r.ReadString('\n')
			m.mu.Lock()
			m.buf.WriteString(line)
			m.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(m.stop)
	return m
}

func (m *monitor) stop() {
	m.conn.Close()
	<-m.done
}

func (m *monitor) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.buf.String()
}

// caughtUp waits until the recording holds every command Redis ran before
// the call: it has Redis echo a marker and waits for the marker in the
// recording, as Redis feeds MONITOR in the order it runs commands.
func (m *monitor) caughtUp(t *testing.T, rc *redis.Client) {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	marker := "monitor-marker-" + hex.EncodeToString(b[:])
	if err := rc.Echo(context.Background(), marker).Err(); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(t, 10*time.Second, "the Redis command stream to show the marker", func() bool {
		return strings.Contains(m.String(), marker)
	})
}

// dumpRedis returns every key and value in Redis as text (SCAN, then the
// value by type).
func (s *stack) dumpRedis() (keys []string, dump string) {
	s.t.Helper()
	ctx := context.Background()
	rc := s.redis.Client(s.t)
	var b strings.Builder
	iter := rc.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		keys = append(keys, k)
		typ, err := rc.Type(ctx, k).Result()
		if err != nil {
			s.t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s (%s):", k, typ)
		switch typ {
		case "hash":
			m, err := rc.HGetAll(ctx, k).Result()
			if err != nil {
				s.t.Fatal(err)
			}
			for f, v := range m {
				fmt.Fprintf(&b, " %s=%s", f, v)
			}
		case "string":
			v, err := rc.Get(ctx, k).Result()
			if err != nil {
				s.t.Fatal(err)
			}
			b.WriteString(" " + v)
		default:
			v, err := rc.Dump(ctx, k).Result()
			if err != nil {
				s.t.Fatal(err)
			}
			b.WriteString(" " + hex.EncodeToString([]byte(v)) + " " + v)
		}
		b.WriteString("\n")
	}
	if err := iter.Err(); err != nil {
		s.t.Fatal(err)
	}
	return keys, b.String()
}

// Raw API keys never reach Redis (keys, values, the command stream), the
// logs of the sidecar, the gateway (plugin lines and access log) and Redis,
// or the metrics of either: only digests do, and metrics carry no digest
// either. The traffic covers every path that handles a key: admitted,
// denied, denied from the cache, Bearer credentials, malformed keys, a
// Redis outage (the sidecar logs failed decisions), canary lists in the
// filter's configuration, and a rejected plans file that lists the key.
func TestRawKeysNeverStored(t *testing.T) {
	allowedKey, allowedCore := secret(t, "allowed")
	deniedKey, deniedCore := secret(t, "denied")
	bearerKey, bearerCore := secret(t, "bearer")
	listedKey, listedCore := secret(t, "listed")
	outageKey, outageCore := secret(t, "outage")
	badKey, badCore := secret(t, "malformed")
	plans := tinyPlans + "  gold: {capacity: 5, rate: 0.001}\nclients:\n  \"" + listedKey + "\": gold\n"
	s := startStack(t, stackConfig{
		plans: plans,
		filter: filterConfig{
			CanaryClients: []string{allowedKey, deniedKey, bearerKey, listedKey, outageKey}},
		// The most talkative settings: every decision is logged at debug,
		// every request in the access log.
		sidecarArgs: []string{"-log-level", "debug"},
		accessLog:   true,
	})
	// Redis's command stream, recorded until the outage; after it comes
	// a second recording.
	before := startMonitor(t, s.redis.Addr)

	want := func(what string, r reply, status int) {
		t.Helper()
		if r.status != status {
			t.Fatalf("%s: status %d, want %d", what, r.status, status)
		}
	}
	// Each path must be taken, so a request that failed open (no decision)
	// is sent again: doDecided.
	want("allowed", s.doDecided(0, "GET", "/orders/1", "x-api-key", allowedKey), 200)
	// The denied client's plan admits two. A request that failed open may
	// still have been charged, so the sidecar's 429 can come one request
	// early; the one after it comes from the deny cache.
	var prev time.Time
	for i := 0; ; i++ {
		prev = time.Now()
		r := s.doDecided(0, "GET", "/orders/1", "x-api-key", deniedKey)
		if r.status == http.StatusTooManyRequests {
			break
		}
		want(fmt.Sprint("denied ", i), r, 200)
		if i == 2 {
			t.Fatal("the denied client was admitted past its plan's two")
		}
	}
	if !s.cachedDenial(0, prev, "GET", "/orders/1", "x-api-key", deniedKey) {
		t.Error("the denied client's second 429 did not come from the deny cache")
	}
	want("bearer", s.doDecided(0, "GET", "/billing/1", "authorization", "Bearer "+bearerKey), 200)
	want("listed", s.doDecided(0, "GET", "/billing/1", "x-api-key", listedKey), 200)
	// Beside a canary list a malformed key is no listed client: shadow
	// passes the request on, without the key header, as deny.
	want("malformed", s.do(0, "GET", "/orders/1", "x-api-key", badKey+" with spaces"), 200)
	want("over-long", s.do(0, "GET", "/orders/1", "x-api-key", strings.Repeat(badKey, 20)), 200)

	// The outage below takes Redis's data and its command stream with it
	// (Redis comes back empty, and MONITOR ends with the process), so what
	// the traffic so far left in Redis is read now, and the recording kept.
	beforeKeys, beforeDump := s.dumpRedis()
	before.caughtUp(t, s.redis.Client(t))
	if err := s.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	before.stop()
	want("during an outage", s.do(0, "GET", "/orders/1", "x-api-key", outageKey), 200)
	testkit.Poll(t, 10*time.Second, "the sidecar logs the failed decision", func() bool {
		return strings.Contains(s.sidecars[0].Output(), "decision failed")
	})
	if err := s.redis.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := startMonitor(t, s.redis.Addr)
	want("after the outage", s.do(0, "GET", "/orders/1", "x-api-key", outageKey), 200)
	want("allowed again", s.doDecided(0, "GET", "/orders/1", "x-api-key", allowedKey), 200)

	// A plans file the sidecar rejects, whose error is about the line that
	// lists the key twice.
	bad := plans + "  \"" + listedKey + "\": tiny\n"
	if err := os.WriteFile(s.plans, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecars[0].Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(t, 10*time.Second, "the sidecar rejects the plans file", func() bool {
		return strings.Contains(s.sidecars[0].Output(), "plans reload rejected")
	})

	redisKeys, redisDump := s.dumpRedis()
	after.caughtUp(t, s.redis.Client(t))
	after.stop()
	places := map[string]string{
		"Redis keys and values before the outage": beforeDump,
		"Redis command stream before the outage":  before.String(),
		"Redis keys and values":                   redisDump,
		"Redis command stream":                    after.String(),
		"Redis log":                               s.redis.Log(),
		"sidecar log":                             s.sidecars[0].Output(),
		"gateway log":                             s.gateways[0].Output(),
		"sidecar /metrics":                        get(t, "http://"+s.scAddrs[0]+"/metrics"),
		"gateway /stats":                          get(t, "http://"+s.gateways[0].Admin+"/stats"),
		"sidecar /readyz":                         get(t, "http://"+s.scAddrs[0]+"/readyz"),
		"sidecar /healthz":                        get(t, "http://"+s.scAddrs[0]+"/healthz"),
		"gateway /ready":                          get(t, "http://"+s.gateways[0].Admin+"/ready"),
		"sidecar's log, unquoted":                 unquote(s.sidecars[0].Output()),
	}
	// Not vacuous: the places searched saw these clients, by digest.
	// Before the outage Redis held the bucket of every client the sidecar
	// decided for (the cached denial is the gateway's own and reaches
	// neither the sidecar nor Redis); after it, the allowed client's again.
	digest := keys.New(nil)
	allowedBucket := digest.BucketKey([]byte(allowedKey))
	for client, key := range map[string]string{"allowed": allowedKey, "denied": deniedKey, "bearer": bearerKey, "listed": listedKey} {
		bucket := digest.BucketKey([]byte(key))
		if !slices.Contains(beforeKeys, bucket) {
			t.Errorf("Redis had no bucket %s for the %s client before the outage; keys: %v", bucket, client, beforeKeys)
		}
		mustContain(t, "Redis command stream before the outage", before.String(), bucket)
	}
	if !slices.Contains(redisKeys, allowedBucket) {
		t.Errorf("Redis has no bucket %s for the allowed client; keys: %v", allowedBucket, redisKeys)
	}
	mustContain(t, "Redis command stream", after.String(), allowedBucket)
	mustContain(t, "sidecar log", s.sidecars[0].Output(), "client="+keys.LogID(allowedBucket))
	bucketKey := regexp.MustCompile(`^rl:\{[0-9a-f]{64}\}$`)
	for _, k := range append(beforeKeys, redisKeys...) {
		if !bucketKey.MatchString(k) {
			t.Errorf("Redis key %q is not a bucket digest", k)
		}
	}

	for _, core := range []string{allowedCore, deniedCore, bearerCore, listedCore, outageCore, badCore} {
		for where, text := range places {
			if strings.Contains(strings.ToLower(text), core) {
				t.Errorf("%s holds a raw API key (…%s…): %s", where, core, around(strings.ToLower(text), core))
			}
		}
	}
	// Metrics carry no digest either: clients are unbounded, labels are not.
	for _, k := range []string{allowedKey, deniedKey, bearerKey, listedKey, outageKey} {
		sum := sha256.Sum256([]byte(k))
		h := hex.EncodeToString(sum[:])
		for _, where := range []string{"sidecar /metrics", "gateway /stats"} {
			if strings.Contains(places[where], h[:keys.LogIDLen]) {
				t.Errorf("%s holds a key digest", where)
			}
		}
	}
}

// unquote undoes Go and JSON string escaping in logs (\x41, \u0041), so
// that a key written escaped is found too.
func unquote(s string) string {
	re := regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	return re.ReplaceAllStringFunc(s, func(q string) string {
		var u string
		if _, err := fmt.Sscanf(q, "%q", &u); err == nil {
			return u
		}
		return q
	})
}

// around shows where sub occurs in s.
func around(s, sub string) string {
	i := strings.Index(s, sub)
	from, to := max(0, i-80), min(len(s), i+len(sub)+80)
	return fmt.Sprintf("%q", s[from:to])
}

// With -key-salt the bucket key is an HMAC of the API key under the salt:
// knowing a key, or a table of SHA-256 digests of likely keys, does not
// tell which bucket in Redis is whose.
func TestSaltedBucketKeys(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const salt = "a-secret-salt-for-this-test"
	p, addr, err := harness.StartSidecar(ctx, bins, harness.SidecarConfig{Redis: s.redis.URL(), Plans: s.plans,
		Extra: []string{"-key-salt", salt}})
	if err != nil {
		t.Fatal(err)
	}
	s.own(p)
	key, _ := secret(t, "salted")
	// A 503 is the sidecar's "cannot decide now" (Redis past the 4 ms
	// deadline, as a fresh sidecar's first decision on a busy machine can
	// be): asked again, as a client would. Anything else ends the test.
	testkit.PollErr(t, 10*time.Second, "a decision from the salted sidecar", func() error {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/check", nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			return nil
		case 503:
			return fmt.Errorf("check: %d", resp.StatusCode)
		}
		t.Fatalf("check: %d", resp.StatusCode)
		return nil
	})
	mac := hmac.New(sha256.New, []byte(salt))
	mac.Write([]byte(key))
	salted := "rl:{" + hex.EncodeToString(mac.Sum(nil)) + "}"
	plain := keys.New(nil).BucketKey([]byte(key))
	redisKeys, _ := s.dumpRedis()
	if !slices.Contains(redisKeys, salted) || slices.Contains(redisKeys, plain) {
		t.Fatalf("Redis keys %v: want the HMAC %s and not the plain digest %s", redisKeys, salted, plain)
	}
	if strings.Contains(p.Output(), salt) {
		t.Error("the sidecar logged its key salt")
	}
}

// rawRequest sends head (the request line and header lines, CRLF each)
// to addr exactly as given and returns the response.
func rawRequest(t *testing.T, addr, head string) (status int, body string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", head, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Bytes that could inject headers, or confuse the sidecar, through the key
// or the cost never get into a callout: the gateway's HTTP parser refuses
// what is not HTTP (400), the filter refuses any key that is not 1-256
// visible ASCII characters (401), and the cost a client claims is ignored
// (the cost comes from the filter's route rules). Every callout the
// sidecar received is checked: one key of visible ASCII, the route's cost,
// nothing else the client sent.
func TestInjectionThroughKeyOrCost(t *testing.T) {
	var rec *fakeSidecar
	s := startStack(t, stackConfig{
		plans: tinyPlans,
		sidecarFront: func(t *testing.T, addr string) string {
			rec = startFakeSidecar(t, addr) // relays, and records each check
			return rec.addr()
		},
	})
	req := func(headers ...string) string {
		return "GET /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: close\r\n" + strings.Join(headers, "\r\n") + "\r\n"
	}
	long := strings.Repeat("k", 257)
	// Where two statuses are allowed, which one depends on the proxy's HTTP
	// parser: the headless gateway's (Go's) takes a folded line into the
	// value and a bare LF as a line end; stricter parsers refuse both (400).
	cases := []struct {
		name   string
		head   string
		status []int // any of these
	}{
		{"NUL in the key", req("x-api-key: inj\x00ected"), []int{400, 401}},
		{"CR in the key", req("x-api-key: inj\rx-evil: 1"), []int{400, 401}},
		{"DEL in the key", req("x-api-key: inj\x7fected"), []int{400, 401}},
		{"folded header line", req("x-api-key: injected", " x-evil: 1"), []int{400, 401}},
		{"tab in the key", req("x-api-key: inj\tected"), []int{401}},
		{"space in the key", req("x-api-key: inj ected"), []int{401}},
		{"257 bytes", req("x-api-key: " + long), []int{401}},
		{"8 KiB", req("x-api-key: " + strings.Repeat("k", 8<<10)), []int{401}},
		{"UTF-8", req("x-api-key: ключ"), []int{401}},
		{"Latin-1 byte", req("x-api-key: caf\xe9"), []int{401}},
		{"NUL in a Bearer token", req("authorization: Bearer inj\x00ected"), []int{400, 401}},
		{"space in a Bearer token", req("authorization: Bearer inj ected"), []int{401}},
		{"Bearer over-long", req("authorization: Bearer " + long), []int{401}},
		// Escapes are characters like any other: a valid, odd key.
		{"URL-encoded CRLF", req("x-api-key: inj%0d%0ax-evil:%201"), []int{200}},
		// A bare LF ends a header line in HTTP/1.1 parsers that accept it:
		// this is two headers, a valid key and one the service gets.
		{"LF in the key", req("x-api-key: lf-key\nx-evil: 1"), []int{200, 400}},
		// Claimed costs and regions are the client's headers, not the
		// filter's: the check carries the route's cost, 1.
		{"cost 0 claimed", req("x-api-key: cost-claimer", "x-ratelimit-cost: 0"), []int{200}},
		{"cost -5 claimed", req("x-api-key: cost-claimer", "x-ratelimit-cost: -5"), []int{200}},
		{"cost with CR claimed", req("x-api-key: cost-claimer-2", "x-ratelimit-cost: 1\rx-evil: 1"), []int{400}},
		{"region claimed", req("x-api-key: region-claimer", "x-ratelimit-region: evil"), []int{200}},
		{"key sent twice", req("x-api-key: twice-1", "x-api-key: twice-2"), []int{200}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.orders.Stats().Total().Received
			status, body := rawRequest(t, s.gateways[0].Addr, c.head)
			if !slices.Contains(c.status, status) {
				t.Fatalf("status %d (%q), want one of %v", status, body, c.status)
			}
			if status >= 400 && s.orders.Stats().Total().Received != before {
				t.Fatalf("a refused request reached the service")
			}
		})
	}
	// A claimed cost of 0 is not honoured: the plan's 2 tokens are gone
	// after two requests, whatever they claimed. A request that failed open
	// went through undecided, its bucket charged or not, so such a run
	// runs again with a fresh client (decidedRun).
	s.decidedRun(t, "a claimed cost of 0", func(run int) error {
		key := "x-api-key: zero-claimer-" + strconv.Itoa(run)
		for i, want := range []int{200, 200, 429} {
			if st, body := rawRequest(t, s.gateways[0].Addr, req(key, "x-ratelimit-cost: 0")); st != want {
				return fmt.Errorf("request %d claiming cost 0: status %d (%q), want %d (each request costs 1 whatever it claims)", i+1, st, body, want)
			}
		}
		return nil
	})

	visible := regexp.MustCompile(`^[\x21-\x7e]{1,256}$`)
	sentClock := regexp.MustCompile(`^[0-9]{16}$`) // µs since 1970, from 2001 to 2286
	checks := rec.requests()
	if len(checks) == 0 {
		t.Fatal("the sidecar received no check")
	}
	for _, h := range checks {
		if v := h.Values("x-api-key"); len(v) != 1 || !visible.MatchString(v[0]) {
			t.Errorf("a check carried x-api-key %q", v)
		}
		if v := h.Values("x-ratelimit-cost"); len(v) != 1 || v[0] != "1" {
			t.Errorf("a check carried x-ratelimit-cost %q, want the route's 1", v)
		}
		if v := h.Values("x-ratelimit-region"); len(v) != 1 || v[0] != "local" {
			t.Errorf("a check carried x-ratelimit-region %q, want envoy.yaml's \"local\"", v)
		}
		if v := h.Values("x-ratelimit-sent"); len(v) != 1 || !sentClock.MatchString(v[0]) {
			t.Errorf("a check carried x-ratelimit-sent %q, want the proxy's clock in microseconds", v)
		}
		for name, vs := range h {
			switch strings.ToLower(name) {
			// x-envoy-expected-rq-timeout-ms is Envoy's own, on every
			// request its router sends with a timeout (the callout's).
			case "x-api-key", "x-ratelimit-cost", "x-ratelimit-region", "x-ratelimit-sent", "content-length", "user-agent", "x-envoy-expected-rq-timeout-ms":
			default:
				t.Errorf("a check carried %s: %q", name, vs)
			}
		}
		if k := h.Get("x-api-key"); k == "twice-2" {
			t.Error("the second of two keys was checked")
		}
	}
}

// The sidecar answers 400, and touches no bucket, for a check whose key or
// cost is malformed, however it got there (the sidecar also listens for
// other local clients than the filter).
func TestSidecarRefusesMalformedChecks(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	check := func(headers ...string) string {
		return "POST /v1/check HTTP/1.1\r\nhost: ratelimit-sidecar\r\ncontent-length: 0\r\nconnection: close\r\n" +
			strings.Join(headers, "\r\n") + "\r\n"
	}
	cases := []struct{ name, head string }{
		{"no key", check()},
		{"empty key", check("x-api-key: ")},
		{"NUL in the key", check("x-api-key: inj\x00ected")},
		{"CR in the key", check("x-api-key: inj\rected")},
		{"tab in the key", check("x-api-key: inj\tected")},
		{"257-byte key", check("x-api-key: " + strings.Repeat("k", 257))},
		{"two keys", check("x-api-key: a", "x-api-key: b")},
		{"cost 0", check("x-api-key: a", "x-ratelimit-cost: 0")},
		{"cost -1", check("x-api-key: a", "x-ratelimit-cost: -1")},
		{"cost 1e3", check("x-api-key: a", "x-ratelimit-cost: 1e3")},
		{"cost 1.5", check("x-api-key: a", "x-ratelimit-cost: 1.5")},
		{"cost over the maximum", check("x-api-key: a", "x-ratelimit-cost: 1000000001")},
		{"cost of 30 digits", check("x-api-key: a", "x-ratelimit-cost: "+strings.Repeat("9", 30))},
		{"cost with CR", check("x-api-key: a", "x-ratelimit-cost: 1\rx: 2")},
		{"two costs", check("x-api-key: a", "x-ratelimit-cost: 1", "x-ratelimit-cost: 1")},
		{"bad region", check("x-api-key: a", "x-ratelimit-region: eu west")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if status, body := rawRequest(t, s.scAddrs[0], c.head); status != 400 {
				t.Fatalf("status %d (%q), want 400", status, body)
			}
		})
	}
	if keys, dump := s.dumpRedis(); len(keys) != 0 {
		t.Fatalf("malformed checks created buckets:\n%s", dump)
	}
}

// Keys that differ only in ways a client controls are different clients,
// unless HTTP itself makes them the same header value. By design the same
// key: surrounding spaces and tabs (HTTP strips them from field values),
// the header name's case, x-api-key and "Authorization: Bearer" (scheme in
// any case, any number of spaces). Different keys: letter case, a key that
// spells another key's bucket name, two keys in the same deny-cache shard.
// Keys that are not visible ASCII (Unicode in any normal form) are refused,
// so no two of them can meet in one bucket.
func TestKeyNormalisationCollisions(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	send := func(headerLine string) int {
		st, _ := rawRequest(t, s.gateways[0].Addr,
			"GET /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: close\r\n"+headerLine+"\r\n")
		return st
	}
	n := 0
	fresh := func(label string) string { n++; return fmt.Sprintf("%s-%d", label, n) }
	cases := []struct {
		name string
		a, b func(k string) string // header lines for the same base key
		same bool
	}{
		{"letter case", func(k string) string { return "x-api-key: " + k }, func(k string) string { return "x-api-key: " + strings.ToUpper(k) }, false},
		{"surrounding spaces", func(k string) string { return "x-api-key:    " + k + "   " }, func(k string) string { return "x-api-key: " + k }, true},
		{"surrounding tabs", func(k string) string { return "x-api-key:\t" + k + "\t" }, func(k string) string { return "x-api-key: " + k }, true},
		{"header name case", func(k string) string { return "X-API-KEY: " + k }, func(k string) string { return "x-api-key: " + k }, true},
		{"Bearer", func(k string) string { return "authorization: Bearer " + k }, func(k string) string { return "x-api-key: " + k }, true},
		{"bEaReR and spaces", func(k string) string { return "authorization: bEaReR    " + k }, func(k string) string { return "authorization: Bearer " + k }, true},
		{"another key's bucket name", func(k string) string { return "x-api-key: " + k }, func(k string) string {
			return "x-api-key: " + keys.New(nil).BucketKey([]byte(k))
		}, false},
		{"a prefix", func(k string) string { return "x-api-key: " + k }, func(k string) string { return "x-api-key: " + k + "x" }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.decidedRun(t, c.name, func(int) error {
				k := fresh("norm")
				for i, want := range []int{200, 200, 429} {
					if got := send(c.a(k)); got != want {
						return fmt.Errorf("spending a (%q): request %d status %d, want %d", c.a(k), i, got, want)
					}
				}
				got := send(c.b(k))
				switch {
				case c.same && got != 429:
					return fmt.Errorf("b (%q) after a spent the bucket: %d, want 429 (the same key)", c.b(k), got)
				case !c.same && got != 200:
					return fmt.Errorf("b (%q) after a spent its bucket: %d, want 200 (a different key)", c.b(k), got)
				}
				return nil
			})
		})
	}

	t.Run("Unicode forms", func(t *testing.T) {
		// é precomposed (NFC), e + combining acute (NFD), and fullwidth
		// letters: all refused, so none can spend anyone's tokens; the
		// ASCII look-alike is a client of its own.
		for _, k := range []string{"caf\u00e9-key", "cafe\u0301-key", "\uff43\uff41\uff46\uff45-key"} {
			if got := send("x-api-key: " + k); got != 401 {
				t.Errorf("key %q: status %d, want 401", k, got)
			}
		}
		s.decidedRun(t, "ASCII look-alike", func(run int) error {
			k := fmt.Sprintf("cafe-key-%d", run)
			for i, want := range []int{200, 200, 429} {
				if got := send("x-api-key: " + k); got != want {
					return fmt.Errorf("ASCII %s request %d: %d, want %d", k, i, got, want)
				}
			}
			return nil
		})
	})

	t.Run("same deny-cache shard", func(t *testing.T) {
		// The deny cache spreads clients over 64 shards by FNV-1a of the
		// key; two keys in one shard must not share a denial.
		shard := func(k string) uint32 {
			h := uint32(2166136261)
			for i := 0; i < len(k); i++ {
				h ^= uint32(k[i])
				h *= 16777619
			}
			return h % 64
		}
		s.decidedRun(t, "same deny-cache shard", func(run int) error {
			a := fresh("shard")
			var b string
			for i := 0; ; i++ {
				if b = fmt.Sprintf("shardmate-%d-%d", run, i); shard(b) == shard(a) {
					break
				}
			}
			for i, want := range []int{200, 200, 429, 429} {
				if got := send("x-api-key: " + a); got != want {
					return fmt.Errorf("%s request %d: %d, want %d", a, i, got, want)
				}
			}
			if got := send("x-api-key: " + b); got != 200 {
				return fmt.Errorf("%s, in the same shard as the denied %s: %d, want 200", b, a, got)
			}
			return nil
		})
	})
}

// The service receives only the key a bucket paid for. A request whose
// first x-api-key is empty is charged to its Bearer token; the key header
// after the empty value, which a service reading the last or the first
// non-empty value takes for the client, does not reach the service. Without
// a Bearer token such a request has no key (401) and reaches nothing.
// Through build/gateway serving envoy.yaml as shipped, to a service that
// records every header it receives; the plan holds 2 tokens, and each
// request is charged to a fresh Bearer key, so each is admitted.
func TestServiceSeesOnlyTheChargedKey(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	svc := startRecordingService(t, http.StatusOK)
	g := startGatewayTo(t, s, svc.Server)

	const victim, sent = "victim-key", 5 // more than the plan's 2 tokens
	head := "GET /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: close\r\nx-api-key: \r\nx-api-key: " + victim + "\r\n"
	for i := range sent {
		if st, body := rawRequest(t, g.Addr, head+"authorization: Bearer fresh-"+strconv.Itoa(i)+"\r\n"); st != 200 {
			t.Fatalf("request %d: status %d (%q), want 200 (charged to its fresh Bearer key)", i, st, body)
		}
	}
	if st, body := rawRequest(t, g.Addr, head); st != 401 {
		t.Fatalf("an empty key, then a key, and no Bearer token: status %d (%q), want 401", st, body)
	}
	seen := svc.requests()
	if len(seen) != sent {
		t.Fatalf("the service received %d requests, want %d", len(seen), sent)
	}
	withVictim := 0
	for i, h := range seen {
		if v := h.Values("x-api-key"); len(v) > 0 {
			t.Errorf("request %d reached the service with x-api-key %q; it was charged to its Bearer key", i, v)
		}
		if slices.Contains(h.Values("x-api-key"), victim) {
			withVictim++
		}
		if got, want := h.Get("authorization"), "Bearer fresh-"+strconv.Itoa(i); got != want {
			t.Errorf("request %d reached the service with authorization %q, want %q", i, got, want)
		}
	}
	if withVictim > 0 {
		t.Errorf("the service received %s's key on %d requests; its plan holds 2 tokens and none was charged to it", victim, withVictim)
	}
}

// The sidecar listens on loopback unless told otherwise: started with no
// -listen and no SIDECAR_LISTEN, it binds 127.0.0.1:8081 and nothing
// else. (If another process holds that port, the sidecar's refusal to
// start names the address it tried, which proves the same.)
func TestSidecarListensOnLoopbackByDefault(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans})
	if v := os.Getenv("SIDECAR_LISTEN"); v != "" {
		t.Skipf("SIDECAR_LISTEN=%q is set in the environment", v)
	}
	p, err := harness.StartProcess("sidecar-default-listen", bins.Sidecar, "-redis", s.redis.URL(), "-plans", s.plans)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	var addrs []string
	testkit.Poll(t, 30*time.Second, "the sidecar listens or gives up", func() bool {
		if exited, _ := p.Exited(); exited {
			return true
		}
		addrs, err = p.ListenAddrs()
		return err == nil && len(addrs) > 0
	})
	if exited, _ := p.Exited(); exited {
		out := p.Output()
		if !strings.Contains(out, "listen 127.0.0.1:8081") || !strings.Contains(out, "address already in use") {
			t.Fatalf("sidecar exited:\n%s", out)
		}
		t.Logf("port 8081 is taken on this machine; the sidecar tried 127.0.0.1:8081: %s", strings.TrimSpace(out))
		return
	}
	if !slices.Equal(addrs, []string{"127.0.0.1:8081"}) {
		t.Fatalf("the sidecar listens on %v, want only 127.0.0.1:8081", addrs)
	}
}

// The sidecar talks to a Redis that requires authentication as a Redis 6
// ACL user allowed only the commands and keys it needs, and over TLS with
// the server's certificate checked against a private CA. Passwords never
// appear in its logs, even when they are wrong.
func TestSidecarRedisACLAndTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeTestPKI(t, dir)
	tlsAddr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	const password = "Pw-7f3c19aa2b-limiter"
	s := startStack(t, stackConfig{
		plans: tinyPlans,
		redisArgs: []string{
			"--tls-port", tlsPort, "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca,
			// The sidecar has no client certificate to offer.
			"--tls-auth-clients", "no",
		},
	})
	ctx := context.Background()
	rc := s.redis.Client(t)
	// The limiter's user: its script (and the commands the script calls)
	// and the readiness probe, on bucket keys only. Everything else,
	// FLUSHALL and KEYS included, is refused. SECURITY.md shows this ACL.
	acl := []any{"ACL", "SETUSER", "limiter", "reset", "on", ">" + password, "~rl:*", "-@all",
		"+evalsha", "+eval", "+script|load", "+script|exists", "+time", "+hmget", "+hset", "+pexpire", "+pttl",
		"+ping", "+hello", "+client|setname"}
	if err := rc.Do(ctx, acl...).Err(); err != nil {
		t.Fatal(err)
	}

	start := func(name, redisURL string, env ...string) (*harness.Process, string) {
		t.Helper()
		addr, err := harness.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		p, err := harness.StartProcessEnv(name, env, bins.Sidecar, "-listen", addr, "-redis", redisURL, "-plans", s.plans)
		if err != nil {
			t.Fatal(err)
		}
		s.own(p)
		return p, addr
	}
	checkOK := func(addr, apiKey string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := harness.WaitHTTP(wctx, nil, "http://"+addr+"/readyz", 200); err != nil {
			t.Fatal(err)
		}
		// What this is about is reaching Redis as the ACL user and over
		// TLS at all; a first decision that misses the 4 ms deadline on a
		// loaded machine is answered 503 and asked again, with a key of its
		// own: the 503's script may still have run and spent a token (the
		// sidecar's README: a check already sent when its deadline passed
		// is run), and the plan's two refill at 0.001/s.
		var resp *http.Response
		key, attempt := apiKey, 0
		testkit.Poll(t, 10*time.Second, "a check through "+addr+" is decided", func() bool {
			if attempt++; attempt > 1 {
				key = fmt.Sprintf("%s-%d", apiKey, attempt)
			}
			req, _ := http.NewRequest("POST", "http://"+addr+"/v1/check", nil)
			req.Header.Set("x-api-key", key)
			var err error
			if resp, err = http.DefaultClient.Do(req); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode != http.StatusServiceUnavailable
		})
		if resp.StatusCode != 200 || resp.Header.Get("ratelimit-limit") != "2" {
			t.Fatalf("check through %s: %d %v", addr, resp.StatusCode, resp.Header)
		}
		if n, err := rc.Exists(ctx, keys.New(nil).BucketKey([]byte(key))).Result(); err != nil || n != 1 {
			t.Fatalf("no bucket for %s in Redis (%d, %v)", key, n, err)
		}
	}
	notReady := func(addr, why string) {
		t.Helper()
		testkit.Poll(t, 30*time.Second, "the sidecar reports it is not ready", func() bool {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode == 503 && strings.Contains(string(b), why)
		})
	}

	userURL := "redis://limiter:" + url.QueryEscape(password) + "@" + s.redis.Addr + "/0"
	aclSidecar, aclAddr := start("sidecar-acl", userURL)
	checkOK(aclAddr, "acl-client")

	wrong, wrongAddr := start("sidecar-wrong-password", "redis://limiter:not-"+password+"@"+s.redis.Addr+"/0")
	notReady(wrongAddr, "WRONGPASS")

	tlsURL := "rediss://limiter:" + url.QueryEscape(password) + "@" + tlsAddr + "/0"
	// Go's TLS trusts the CAs in SSL_CERT_FILE: how a private CA is given.
	tlsSidecar, tlsSidecarAddr := start("sidecar-tls", tlsURL, "SSL_CERT_FILE="+ca)
	checkOK(tlsSidecarAddr, "tls-client")
	clients, err := rc.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(clients, "laddr="+tlsAddr) || !strings.Contains(clients, "user=limiter") {
		t.Errorf("no connection of user limiter on the TLS port %s:\n%s", tlsAddr, clients)
	}
	// Without the CA the certificate is refused: the sidecar verifies it,
	// and /readyz says so (its client dials once, not five times in more
	// than its 250 ms, which said only "context deadline exceeded"), as
	// does go-redis's own report in the log.
	untrusted, untrustedAddr := start("sidecar-tls-untrusted", tlsURL, "SIDECAR_LOG_LEVEL=debug")
	notReady(untrustedAddr, "x509: certificate signed by unknown authority")
	testkit.Poll(t, 30*time.Second, "the sidecar refuses the unknown CA", func() bool {
		return strings.Contains(untrusted.Output(), "x509: certificate signed by unknown authority")
	})

	for _, p := range []*harness.Process{aclSidecar, wrong, tlsSidecar, untrusted} {
		if out := p.Output(); strings.Contains(out, password) {
			t.Errorf("%s logged the Redis password:\n%s", p.Name, out)
		}
	}
	mustContain(t, "sidecar log", aclSidecar.Output(), "redis=redis://limiter:xxxxx@")
}

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 into
// dir and returns the three PEM files' paths.
func writeTestPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	pki, err := harness.NewTestPKI("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for path, b := range map[string][]byte{caFile: pki.CA, certFile: pki.Cert, keyFile: pki.Key} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// Per-route costs cannot be dodged by spelling the path differently:
// the gateway normalizes the path (dot segments, repeated slashes) before
// the filter matches its cost rules and the router picks the service, as
// Envoy does with normalize_path and merge_slashes, so a request pays the
// price of the route that serves it, however the path was spelled. The
// prices are envoy.yaml's rules' (a POST under /orders costs 5, any other
// request 1), read from the file, and the plan holds exactly one orders
// request. A percent-encoded dot is a dot to normalize_path, so
// "/billing/%2e%2e/orders/1" is orders', at orders' price, and so is
// "/billing/..;x=1/orders/1": Envoy drops a dot segment's parameters, as a
// Java service reading ";x=1" as a path parameter would.
func TestCostRulesSeeNormalizedPaths(t *testing.T) {
	filter := shippedFilter(t)
	ordersPrice, billingPrice := float64(filter.Cost("POST", "/orders/1")), float64(filter.Cost("POST", "/billing/1"))
	if ordersPrice == billingPrice {
		t.Fatalf("envoy.yaml prices a POST to orders and to billing alike (%v), so where a path went cannot be read from the tokens it spent", ordersPrice)
	}
	capacity := ordersPrice
	s := startStack(t, stackConfig{
		plans: fmt.Sprintf("default_plan: one-order\nplans:\n  one-order: {capacity: %v, rate: 0.001}\n", capacity),
	})
	for i, path := range []string{"/orders/1", "/billing/../orders/1", "//orders//1", "/./orders/./1",
		"/billing/%2e%2e/orders/1", "/billing/..;x=1/orders/1", "/billing/1"} {
		s.decidedRun(t, path, func(run int) error {
			key := fmt.Sprintf("path-spelling-%d-%d", i, run)
			st, body := rawRequest(t, s.gateways[0].Addr, "POST "+path+" HTTP/1.1\r\nhost: shop\r\nconnection: close\r\ncontent-length: 0\r\nx-api-key: "+key+"\r\n")
			if st != 200 {
				return fmt.Errorf("%s: status %d (%q)", path, st, body)
			}
			// The bucket was full and this was its first decision, which
			// Redis stores as exactly the capacity less the price (the
			// refill of a bucket that starts full adds nothing).
			billing, orders := s.billing.Stats().Client(key).Received, s.orders.Stats().Client(key).Received
			var service string
			var price float64
			switch {
			case billing == 1 && orders == 0:
				service, price = "billing", billingPrice
			case billing == 0 && orders == 1:
				service, price = "orders", ordersPrice
			default:
				return fmt.Errorf("%s: 200, and billing received %d, orders %d; want one request at one of them", path, billing, orders)
			}
			tokens, err := s.tokens(key)
			if err != nil {
				return fmt.Errorf("%s: the bucket's tokens: %v", path, err)
			}
			if tokens != capacity-price {
				return fmt.Errorf("%s reached %s and left %v of the bucket's %v tokens, want %v (its price %v)", path, service, tokens, capacity, capacity-price, price)
			}
			if (path == "/billing/../orders/1" || path == "/billing/%2e%2e/orders/1" || path == "/billing/..;x=1/orders/1") && orders != 1 {
				return fmt.Errorf("%s did not reach orders", path)
			}
			return nil
		})
	}
}

// A path with an escaped slash or backslash (%2F, %5C) cannot pay another
// route's price: many services decode it before routing (the services
// here are fasthttp's, which read /billing%2F..%2Forders/1 as /orders/1),
// while Envoy and the filter would not take it for a separator. With
// envoy.yaml's path_with_escaped_slashes_action the proxy unescapes it,
// normalizes, and answers 307 with the result as location, before the
// filter: the client's bucket is not touched and no service receives the
// request; the request sent to the location pays that path's price (a
// POST under /orders, 5 in envoy.yaml, read from the file). The plan holds
// exactly one orders request.
func TestEscapedSlashesRedirectToTheirPath(t *testing.T) {
	filter := shippedFilter(t)
	ordersPrice := float64(filter.Cost("POST", "/orders/1"))
	s := startStack(t, stackConfig{
		plans: fmt.Sprintf("default_plan: one-order\nplans:\n  one-order: {capacity: %v, rate: 0.001}\n", ordersPrice),
	})
	post := func(path, key string) (*http.Response, error) {
		conn, err := net.DialTimeout("tcp", s.gateways[0].Addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nhost: shop\r\nconnection: close\r\ncontent-length: 0\r\nx-api-key: "+key+"\r\n\r\n"); err != nil {
			return nil, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, nil
	}
	for i, path := range []string{"/billing%2F..%2Forders/1", "/billing%2f..%2forders/1", "/%2Forders/1", "/billing%5C..%5Corders/1"} {
		s.decidedRun(t, path, func(run int) error {
			key := fmt.Sprintf("escaped-%d-%d", i, run)
			resp, err := post(path, key)
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("location") != "/orders/1" {
				return fmt.Errorf("%s: status %d, location %q; want 307 to /orders/1 (the service would read it as that path; here it was charged %s)",
					path, resp.StatusCode, resp.Header.Get("location"), s.spent(key, ordersPrice))
			}
			if n := s.received(key); n != 0 {
				return fmt.Errorf("%s: redirected, and the services received %d requests of its client", path, n)
			}
			if _, err := s.tokens(key); !errors.Is(err, redis.Nil) {
				return fmt.Errorf("%s: redirected, and its client's bucket was touched (%v)", path, err)
			}
			if resp, err = post("/orders/1", key); err != nil {
				return fmt.Errorf("the location /orders/1: %v", err)
			}
			if resp.StatusCode != 200 {
				return fmt.Errorf("the location /orders/1: status %d, want 200", resp.StatusCode)
			}
			if tokens, err := s.tokens(key); err != nil || tokens != 0 {
				return fmt.Errorf("after /orders/1 the bucket of %v holds %v (%v), want 0: orders' price", ordersPrice, tokens, err)
			}
			return nil
		})
	}
}

// spent describes what client's bucket of capacity shows it spent.
func (s *stack) spent(client string, capacity float64) string {
	tokens, err := s.tokens(client)
	if err != nil {
		return "nothing"
	}
	return strconv.FormatFloat(capacity-tokens, 'f', -1, 64) + " tokens"
}

// A method Envoy's HTTP/1 codec does not know, a POST in lower case among
// them, is refused (400) before the filter: it is not charged, and neither
// reaches a service nor pays a cheaper price than the POST it may stand
// for (envoy.yaml's rules price methods as written, POST under /orders at
// 5, read from the file). The plan holds exactly one orders POST.
func TestUnknownMethodsRefused(t *testing.T) {
	ordersPrice := float64(shippedFilter(t).Cost("POST", "/orders/1"))
	s := startStack(t, stackConfig{
		plans: fmt.Sprintf("default_plan: one-order\nplans:\n  one-order: {capacity: %v, rate: 0.001}\n", ordersPrice),
	})
	const key = "method-spelling"
	for _, method := range []string{"post", "Post", "FOO"} {
		st, body := rawRequest(t, s.gateways[0].Addr, method+" /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: close\r\ncontent-length: 0\r\nx-api-key: "+key+"\r\n")
		if st != 400 {
			t.Errorf("%s /orders/1: status %d (%q), want 400 (charged %s)", method, st, body, s.spent(key, ordersPrice))
		}
	}
	if n := s.received(key); n != 0 {
		t.Fatalf("the services received %d requests with unknown methods", n)
	}
	if _, err := s.tokens(key); !errors.Is(err, redis.Nil) {
		t.Fatalf("requests with unknown methods touched the bucket (%v)", err)
	}
	s.decidedRun(t, "POST after the refusals", func(run int) error {
		k := fmt.Sprintf("%s-%d", key, run)
		if st, body := rawRequest(t, s.gateways[0].Addr, "POST /orders/1 HTTP/1.1\r\nhost: shop\r\nconnection: close\r\ncontent-length: 0\r\nx-api-key: "+k+"\r\n"); st != 200 {
			return fmt.Errorf("POST /orders/1: status %d (%q), want 200", st, body)
		}
		if tokens, err := s.tokens(k); err != nil || tokens != 0 {
			return fmt.Errorf("after POST /orders/1 the bucket of %v holds %v (%v), want 0", ordersPrice, tokens, err)
		}
		return nil
	})
}
