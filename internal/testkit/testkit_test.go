package testkit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf only records the message, so that
// a failing Poll can be looked at.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestPollReturnsOnceTheConditionHolds(t *testing.T) {
	var calls int
	rec := &recorder{TB: t}
	Poll(rec, 10*time.Second, "the third call", func() bool { calls++; return calls == 3 })
	if rec.failed != "" || calls != 3 {
		t.Fatalf("Poll failed %q after %d calls, want success after 3", rec.failed, calls)
	}
}

func TestPollNamesWhatWasAwaited(t *testing.T) {
	rec := &recorder{TB: t}
	start := time.Now()
	Poll(rec, 30*time.Millisecond, "the impossible", func() bool { return false })
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Errorf("Poll gave up after %v, before its 30ms", took)
	}
	if want := "waiting for the impossible: not within 30ms"; rec.failed != want {
		t.Fatalf("failure %q, want %q", rec.failed, want)
	}
}

func TestPollErrReportsTheLastError(t *testing.T) {
	rec := &recorder{TB: t}
	n := 0
	PollErr(rec, 20*time.Millisecond, "a count of zero", func() error { n++; return fmt.Errorf("count %d", n) })
	if want := fmt.Sprintf("waiting for a count of zero: not within 20ms: count %d", n); rec.failed != want {
		t.Fatalf("failure %q, want %q", rec.failed, want)
	}
	rec = &recorder{TB: t}
	PollErr(rec, time.Second, "nil", func() error { return nil })
	if rec.failed != "" {
		t.Fatalf("a check that passes at once failed: %q", rec.failed)
	}
}

func TestUntilChecksOnceMoreAtTheDeadline(t *testing.T) {
	start := time.Now()
	ok := Until(15*time.Millisecond, func() bool { return time.Since(start) >= 15*time.Millisecond })
	if !ok {
		t.Fatal("a condition true at the deadline was reported false")
	}
}

// page has what the sidecar's page has (HELP lines without text, counters
// with and without labels, histograms) and what others may write:
// several labels, escaped values, a summary, an untyped sample.
const page = `# HELP sidecar_build_info
# TYPE sidecar_build_info gauge
sidecar_build_info{version="(devel)",goversion="go1.26.8"} 1
# HELP sidecar_decisions_total
# TYPE sidecar_decisions_total counter
sidecar_decisions_total{result="allowed"} 12
sidecar_decisions_total{result="denied"} 3
# TYPE sidecar_redis_errors_total counter
sidecar_redis_errors_total 0
# HELP sidecar_decision_duration_seconds Time to decide.
# TYPE sidecar_decision_duration_seconds histogram
sidecar_decision_duration_seconds_bucket{le="0.0001"} 0
sidecar_decision_duration_seconds_bucket{le="2.56e-07"} 0
sidecar_decision_duration_seconds_bucket{le="0.002"} 14
sidecar_decision_duration_seconds_bucket{le="+Inf"} 15
sidecar_decision_duration_seconds_sum 0.0125
sidecar_decision_duration_seconds_count 15
# TYPE http_latency histogram
http_latency_bucket{path="/a",le="1"} 2
http_latency_bucket{path="/a",le="+Inf"} 3
http_latency_sum{path="/a"} 4.5
http_latency_count{path="/a"} 3
# TYPE rpc_seconds summary
rpc_seconds{quantile="0.5"} 0.25
rpc_seconds{quantile="0.99"} 1.5
rpc_seconds_sum 10
rpc_seconds_count 7
# TYPE go_sched_latencies_seconds histogram
go_sched_latencies_seconds_bucket{le="0"} 0
go_sched_latencies_seconds_bucket{le="+Inf"} 12
# TYPE odd gauge
odd{v="quote \" backslash \\ newline \n"} -2.5
plain_untyped 1.7961269499121354e+09
`

// Every sample line of the page is one key, the series as written, with
// its value.
func TestParseMetricsKeysSeriesAsWritten(t *testing.T) {
	got, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{}
	for _, line := range strings.Split(page, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		want[line[:i]] = v
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d samples, want %d: %v", len(got), len(want), got)
	}
}

func TestParseMetricsRefusesWhatIsNotTheFormat(t *testing.T) {
	for _, bad := range []string{
		"metric{label=unquoted} 1\n",
		"metric one\n",
		"# TYPE m counter\n# TYPE m gauge\nm 1\n",
	} {
		if m, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed as %v, want an error", bad, m)
		}
	}
}

func TestGetMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, page)
	}))
	defer srv.Close()
	m, err := GetMetrics(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v := m[`sidecar_decisions_total{result="allowed"}`]; v != 12 {
		t.Fatalf("allowed = %v, want 12", v)
	}
	if _, err := GetMetrics(srv.URL + "/other"); err == nil || !strings.Contains(err.Error(), "status 404") {
		t.Fatalf("a 404 page: %v, want an error naming the status", err)
	}
}

func TestDoAndGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-seen", r.Header.Get("x-api-key"))
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, "body of "+r.URL.Path)
	}))
	defer srv.Close()
	resp, body := Get(t, srv.URL+"/p", "x-api-key", "k1")
	if resp.StatusCode != http.StatusTeapot || body != "body of /p" || resp.Header.Get("x-seen") != "k1" {
		t.Fatalf("Get: %d %q x-seen=%q", resp.StatusCode, body, resp.Header.Get("x-seen"))
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/q", strings.NewReader("x"))
	if _, body := Do(t, req); body != "body of /q" {
		t.Fatalf("Do: body %q", body)
	}
}

func TestDoFailsOnAnUnreachableAddress(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	rec := &recorder{TB: t}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	func() {
		defer func() { recover() }() // Do goes on after the recorder's Fatalf and trips on the nil response
		Do(rec, req)
	}()
	if !strings.HasPrefix(rec.failed, "GET "+url+": ") {
		t.Fatalf("failure %q, want one naming the request", rec.failed)
	}
}

func TestLoadRunsEachWorkerUntilStopped(t *testing.T) {
	var mu sync.Mutex
	next := map[int]int{} // worker → the i it must see next
	var calls atomic.Int64
	l := StartLoad(t, 3, func(w, i int) {
		mu.Lock()
		if i != next[w] {
			t.Errorf("worker %d: i = %d, want %d", w, i, next[w])
		}
		next[w] = i + 1
		mu.Unlock()
		calls.Add(1)
	})
	Poll(t, 10*time.Second, "every worker to run a few times", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(next) == 3 && next[0] > 5 && next[1] > 5 && next[2] > 5
	})
	l.Stop()
	after := calls.Load()
	time.Sleep(10 * time.Millisecond)
	if n := calls.Load(); n != after {
		t.Fatalf("%d calls after Stop returned", n-after)
	}
	l.Stop() // as the test's cleanup does: only waits
}

// A test that ends without stopping its load has it stopped by its
// cleanup.
func TestLoadStopsAtCleanup(t *testing.T) {
	var calls atomic.Int64
	t.Run("test", func(t *testing.T) {
		StartLoad(t, 2, func(int, int) { calls.Add(1) })
		Poll(t, 10*time.Second, "the load to run", func() bool { return calls.Load() > 0 })
	})
	after := calls.Load()
	time.Sleep(10 * time.Millisecond)
	if n := calls.Load(); n != after {
		t.Fatalf("%d calls after the subtest's cleanup", n-after)
	}
}

// A page may put spaces between labels (the Go runtime's go_info_ext does);
// the key has none, so that one series has one key however it was spaced.
func TestParseMetricsKeyHasNoSpaces(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader("# TYPE go_info_ext gauge\ngo_info_ext{compiler=\"gc\", GOOS=\"linux\"} 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m[`go_info_ext{compiler="gc",GOOS="linux"}`]; !ok || v != 1 || len(m) != 1 {
		t.Fatalf("samples %v, want go_info_ext{compiler=\"gc\",GOOS=\"linux\"} 1 alone", m)
	}
}

func TestWaitStopsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Wait(ctx, func() bool {
		calls++
		if calls == 3 {
			cancel()
		}
		return false
	})
	if !errors.Is(err, context.Canceled) || calls != 3 {
		t.Fatalf("Wait = %v after %d calls, want context.Canceled after 3", err, calls)
	}
	if err := Wait(context.Background(), func() bool { return true }); err != nil {
		t.Fatalf("Wait on a condition that holds: %v", err)
	}
}

func TestMetricsHistogramSortsTheBuckets(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader("# TYPE lat histogram\n" +
		`lat_bucket{le="10"} 1` + "\n" + `lat_bucket{le="2.5"} 0` + "\n" + `lat_bucket{le="+Inf"} 3` + "\n" +
		"lat_sum 40\nlat_count 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := m.Histogram("lat")
	want := []Bucket{{2.5, 0}, {10, 1}, {math.Inf(1), 3}}
	if !slices.Equal(got, want) {
		t.Errorf("Histogram = %v, want %v", got, want)
	}
	if m.Histogram("other") != nil {
		t.Error("a histogram the page lacks has buckets")
	}
}
