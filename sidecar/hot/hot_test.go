package hot

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/syncbuf"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// TestSlot compares Slot with Redis's own CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	rc := redisproc.StartClusterT(t, 3, 0).Client(t)
	ctx := context.Background()
	tests := []string{
		"", "a", "123456789", "rl:{abc}", "rl:{abc}:hot:shares", "{}", "{}x", "x{}y", "{a}{b}", "a{b", "a}b{c}",
		"rl:{" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + ".eu.17}",
	}
	for i := range 50 {
		tests = append(tests, fmt.Sprintf("key-%d", i), fmt.Sprintf("{tag-%d}rest", i))
	}
	for _, key := range tests {
		want, err := rc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}
}

// TestKeysSpread: region i of k lands exactly in the middle of the i-th k-th
// of the slot space, so with k or more evenly split masters each region is
// on its own master.
func TestKeysSpread(t *testing.T) {
	base := keys.New(nil).BucketKey([]byte("a-hot-client"))
	for _, regions := range [][]string{{"eu", "us"}, {"eu", "us", "ap"}, {"a", "b", "c", "d", "e", "f", "g"}} {
		ks := Keys(base, regions)
		k := len(regions)
		for i, key := range ks {
			want := (2*i + 1) * SlotCount / (2 * k)
			if got := Slot(key); got != want {
				t.Errorf("%d regions: %s is on slot %d, want %d", k, key, got, want)
			}
			if keys.LogID(key) != keys.LogID(base) {
				t.Errorf("%s: log id %q, want the client's %q", key, keys.LogID(key), keys.LogID(base))
			}
		}
	}
}

// TestRegionKeyIsSmallestN: a region's key is the one its N tried one by
// one gives, the smallest N whose slot is the target, so every sidecar
// version places a hot client's buckets under the same keys.
func TestRegionKeyIsSmallestN(t *testing.T) {
	byTrying := func(digest, region string, target int) string {
		for n := 0; n < maxSuffix; n++ {
			key := "rl:{" + digest + "." + region + "." + strconv.Itoa(n) + "}"
			if Slot(key) == target {
				return key
			}
		}
		t.Fatalf("no N for slot %d", target)
		return ""
	}
	for c, client := range []string{"a-hot-client", "another", "c"} {
		digest := strings.TrimSuffix(strings.TrimPrefix(keys.New(nil).BucketKey([]byte(client)), "rl:{"), "}")
		for i, region := range []string{"eu", "us-east-1", "r15"} {
			for _, target := range []int{0, 1, 4096 + c, 8191 + i, 12288, SlotCount - 1} {
				if got, want := regionKey(digest, region, target), byTrying(digest, region, target); got != want {
					t.Errorf("%s in %s, slot %d: %s, want %s", client, region, target, got, want)
				}
			}
		}
	}
}

func TestReconcile(t *testing.T) {
	tests := []struct {
		name        string
		old, demand []float64
		want        []float64
	}{
		{"no demand keeps shares", []float64{0.5, 0.3, 0.2}, []float64{0, 0, 0}, []float64{0.5, 0.3, 0.2}},
		// Three regions: a floor of 0.04/3 each, target = 0.04/3 + 0.96*d/total:
		// 0.04/3 + 0.672, + 0.192, + 0.096; half-way from 1/3.
		{"70/20/10 from equal", []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, []float64{700, 200, 100},
			[]float64{(1.0/3 + 0.04/3 + 0.672) / 2, (1.0/3 + 0.04/3 + 0.192) / 2, (1.0/3 + 0.04/3 + 0.096) / 2}},
		{"at target stays", []float64{0.04/3 + 0.672, 0.04/3 + 0.192, 0.04/3 + 0.096}, []float64{70, 20, 10},
			[]float64{0.04/3 + 0.672, 0.04/3 + 0.192, 0.04/3 + 0.096}},
		// Sixteen regions, one asking: the quiet ones keep 0.0025 each, 3.75%
		// of the plan together (2% each would be 30%).
		{"one of sixteen", slices.Repeat([]float64{1.0 / 16}, 16), append([]float64{1}, make([]float64, 15)...),
			append([]float64{(1.0/16 + 1 - 15*0.0025) / 2}, slices.Repeat([]float64{(1.0/16 + 0.0025) / 2}, 15)...)},
		// A silent region drifts toward the floor, never below it.
		{"silent region", []float64{0.5, 0.5}, []float64{10, 0}, []float64{(0.5 + 0.98) / 2, (0.5 + 0.02) / 2}},
		{"negative demand is none", []float64{0.5, 0.5}, []float64{-5, 10}, []float64{(0.5 + 0.02) / 2, (0.5 + 0.98) / 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Reconcile(tt.old, tt.demand)
			var sum float64
			for i := range got {
				sum += got[i]
				if math.Abs(got[i]-tt.want[i]) > 1e-12 {
					t.Errorf("share %d = %v, want %v (all %v)", i, got[i], tt.want[i], got)
				}
			}
			if math.Abs(sum-1) > 1e-12 {
				t.Errorf("shares %v sum to %v", got, sum)
			}
		})
	}
	// Repeated steps converge to the target and stay above the floor.
	s := []float64{0.98, 0.01, 0.01}
	for range 40 {
		s = Reconcile(s, []float64{1, 1, 1})
	}
	for i, v := range s {
		if math.Abs(v-1.0/3) > 1e-9 {
			t.Errorf("after 40 steps share %d = %v, want 1/3", i, v)
		}
	}
}

func TestParseShares(t *testing.T) {
	regions := []string{"eu", "us"}
	tests := []struct {
		name   string
		fields map[string]string
		ok     bool
	}{
		{"good", map[string]string{"_regions": "eu,us", "eu": "0.7", "us": "0.3"}, true},
		{"other regions", map[string]string{"_regions": "eu,ap", "eu": "0.7", "ap": "0.3"}, false},
		{"missing share", map[string]string{"_regions": "eu,us", "eu": "0.7"}, false},
		{"zero share", map[string]string{"_regions": "eu,us", "eu": "1", "us": "0"}, false},
		{"not a number", map[string]string{"_regions": "eu,us", "eu": "x", "us": "0.3"}, false},
		{"over one", map[string]string{"_regions": "eu,us", "eu": "1.5", "us": "0.3"}, false},
		{"empty", map[string]string{}, false},
	}
	for _, tt := range tests {
		got, ok := parseShares(tt.fields, regions, "eu,us")
		if ok != tt.ok {
			t.Errorf("%s: ok = %v, want %v (%v)", tt.name, ok, tt.ok, got)
		}
		if ok && math.Abs(got[0]+got[1]-1) > 1e-12 {
			t.Errorf("%s: shares %v do not sum to 1", tt.name, got)
		}
	}
}

// TestRouteLargeCost: a cost above the region's share of the capacity goes
// to the bucket of the region with the largest share when that one holds
// it, and counts as its own region's demand; a cost no region's share
// holds stays with its region (the script answers it never).
func TestRouteLargeCost(t *testing.T) {
	s := New(nil, nil)
	base := keys.New(nil).BucketKey([]byte("a-hot-client"))
	regions := []string{"eu", "us", "ap"}
	ks := Keys(base, regions)
	s.Route(time.Time{}, base, regions, []byte("eu"), lua.Limit{Capacity: 200, Rate: 100}, 1)
	shares := []float64{0.02, 0.9, 0.08}
	s.state(time.Time{}, base, regions).shares.Store(&shares)
	for _, c := range []struct {
		region string
		cost   int64
		key    string
		share  float64
	}{
		{"eu", 4, ks[0], 0.02},   // 4 tokens fit eu's 4
		{"eu", 5, ks[1], 0.9},    // 5 do not: us holds 180
		{"ap", 16, ks[2], 0.08},  // ap's own 16
		{"ap", 180, ks[1], 0.9},  // us's whole 180
		{"ap", 181, ks[2], 0.08}, // no region holds 181: ap's, answered never
	} {
		key, l := s.Route(time.Time{}, base, regions, []byte(c.region), lua.Limit{Capacity: 200, Rate: 100}, c.cost)
		if key != c.key || l.Capacity != 200*c.share || l.Rate != 100*c.share {
			t.Errorf("%s, cost %d: %s %+v, want %s at share %v", c.region, c.cost, key, l, c.key, c.share)
		}
	}
	st := s.state(time.Time{}, base, regions)
	if got := [3]int64{st.demand[0].Load(), st.demand[1].Load(), st.demand[2].Load()}; got != [3]int64{1 + 4 + 5, 0, 16 + 180 + 181} {
		t.Errorf("demand %v, want each check counted for the region it came from", got)
	}
}

// TestReconcileErrorsReported: with Redis gone, each hot client's reconcile
// fails every interval and each failure is reported to OnReconcileError
// (the sidecar counts them in sidecar_hot_reconcile_errors_total); while
// Redis answers, none is.
func TestReconcileErrorsReported(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	s := New(srv.Client(t), nil)
	var failed atomic.Int64
	s.OnReconcileError = func() { failed.Add(1) }
	base := keys.New(nil).BucketKey([]byte("a-hot-client"))
	s.Route(time.Time{}, base, []string{"eu", "us"}, []byte("eu"), lua.Limit{Capacity: 200, Rate: 100}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The shipped interval (DefaultInterval, 1 s), which is also each
	// reconcile's deadline: a Redis that answers is well within it.
	go func() { s.Run(ctx, 0); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Redis answering: the shares move to the demand, no failure.
	testkit.Poll(t, 10*time.Second, "a reconcile to write the shares", func() bool {
		shares := s.Shares(base)
		return len(shares) == 2 && shares[0] > shares[1]
	})
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d reconcile errors with Redis up", n)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	testkit.Poll(t, 10*time.Second, "reconcile errors with Redis down", func() bool { return failed.Load() >= 2 })
}

// TestReconcileFailuresLoggedTogether: with many hot clients and Redis
// refusing a command every reconcile sends (PEXPIRE), the failed
// reconciles make one line, not one per client and round, naming Redis's
// reply; and the end of the failure is logged once Redis accepts it again.
// Run at the shipped interval (1 s) and log interval (10 s).
func TestReconcileFailuresLoggedTogether(t *testing.T) {
	const clients = 20
	srv := redisproc.StartT(t, redisproc.Options{})
	admin := srv.Client(t)
	var out syncbuf.Buffer
	s := New(srv.Client(t), slog.New(slog.NewTextHandler(&out, nil)))
	var failed atomic.Int64
	s.OnReconcileError = func() { failed.Add(1) }
	for i := range clients {
		base := keys.New(nil).BucketKey(fmt.Appendf(nil, "hot-client-%d", i))
		s.Route(time.Time{}, base, []string{"eu", "us"}, []byte("eu"), lua.Limit{Capacity: 200, Rate: 100}, 1)
	}
	lines := func(msg string) int { return strings.Count(out.String(), `msg="`+msg+`"`) }
	const failedMsg, endedMsg = "hot client reconcile failed; shares in force kept", "hot client reconciles succeed again"
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	refused := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.Run(ctx, 0); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// Three rounds of failures: 60 reconciles, once one line each.
	testkit.Poll(t, 20*time.Second, "three rounds of failed reconciles", func() bool { return failed.Load() >= 3*clients })
	// One line, and one more for each whole 10 s the rounds took (a
	// stalled machine can stretch three rounds past 10 s).
	if got, most := lines(failedMsg), 1+int(time.Since(refused)/reconcileLogEvery); got < 1 || got > most {
		t.Fatalf("%d failure lines for %d failed reconciles of %d clients in %v, want 1 to %d:\n%s",
			got, failed.Load(), clients, time.Since(refused).Round(time.Millisecond), most, out.String())
	}
	for _, want := range []string{fmt.Sprintf("failed=%d hot_clients=%d", clients, clients), "NOPERM"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the failure line does not say %q:\n%s", want, out.String())
		}
	}
	if lines(endedMsg) != 0 {
		t.Fatalf("an end line while Redis refuses:\n%s", out.String())
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "+pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	// The end: once a round succeeds 10 s after the last failure.
	testkit.Poll(t, 30*time.Second, "the end of the failure logged", func() bool { return lines(endedMsg) == 1 })
	if got, most := lines(failedMsg), 1+int(time.Since(refused)/reconcileLogEvery); got > most {
		t.Errorf("%d failure lines in %v, want at most %d:\n%s", got, time.Since(refused).Round(time.Millisecond), most, out.String())
	}
}

// A hot client no check has used for idleAfter is forgotten at the next
// round, and its reconciles stop; one used since is kept. Idleness is
// read on the monotonic clock from the package's start (sinceStart), so a
// step of the wall clock neither makes every client idle at once nor
// keeps an idle one.
func TestIdleClientForgotten(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	s := New(srv.Client(t), nil)
	idle, busy := keys.New(nil).BucketKey([]byte("idle-client")), keys.New(nil).BucketKey([]byte("busy-client"))
	for _, base := range []string{idle, busy} {
		s.Route(time.Time{}, base, []string{"eu", "us"}, []byte("eu"), lua.Limit{Capacity: 200, Rate: 100}, 1)
	}
	v, _ := s.states.Load(idle)
	v.(*state).lastUsed.Store(sinceStart() - int64(idleAfter) - 1) // its last check idleAfter ago
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The shipped interval (DefaultInterval, 1 s): the first round, a
	// second in, drops the idle client.
	go func() { s.Run(ctx, 0); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testkit.Poll(t, 10*time.Second, "the idle client forgotten", func() bool { return s.Shares(idle) == nil })
	if s.Shares(busy) == nil {
		t.Fatal("the client used within idleAfter was forgotten too")
	}
}
