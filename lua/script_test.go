package lua

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/edgelimit/edgelimit/internal/redisproc"
)

// backend is a real Redis the suite runs against.
type backend struct {
	c redis.UniversalClient
	// restart restarts the server holding key with empty data and returns
	// once it serves again.
	restart func(t *testing.T, key string)
}

func TestScriptOnRedis(t *testing.T) {
	t.Parallel()
	s := redisproc.StartT(t, redisproc.Options{})
	runSuite(t, backend{
		c: s.Client(t),
		restart: func(t *testing.T, _ string) {
			if err := s.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
	})
}

func TestScriptOnCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := redisproc.StartClusterT(t, 3, 0)
	cc := cl.Client(t)
	runSuite(t, backend{
		c: cc,
		restart: func(t *testing.T, key string) {
			m, err := cc.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if err := cl.Node(m.Options().Addr).Restart(ctx); err != nil {
				t.Fatal(err)
			}
			if err := cl.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		},
	})

	// The suite's buckets are spread over the slots; show they land on,
	// and are served by, every master.
	t.Run("buckets on every master", func(t *testing.T) {
		masters, err := cl.Masters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l := Limit{Capacity: 10, Rate: 1e-6}
		hit := map[string]int{}
		for i := range 30 {
			key := fmt.Sprintf("spread:%d", i)
			if r, err := Take(ctx, cc, key, l, 4); err != nil || !r.Allowed {
				t.Fatalf("Take %s = %+v, %v", key, r, err)
			}
			m, err := cc.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			addr := m.Options().Addr
			// Read the bucket from the master itself, not through the
			// cluster client. A new bucket starts full and nothing refills
			// before its first write: 10 - 4 is stored, exactly.
			tokens, err := cl.Node(addr).Client(t).HGet(ctx, key, "tokens").Float64()
			if err != nil || tokens != 6 {
				t.Errorf("bucket %s on master %s holds %v tokens, %v; want 6", key, addr, tokens, err)
			}
			hit[addr]++
		}
		for _, m := range masters {
			if hit[m] == 0 {
				t.Errorf("no bucket on master %s (hits %v)", m, hit)
			}
		}
	})
}

func runSuite(t *testing.T, b backend) {
	// Subtests run one after another: the restart case empties a server
	// the others use.
	t.Run("semantics", func(t *testing.T) { testSemantics(t, b) })
	t.Run("invalid arguments", func(t *testing.T) { testInvalidArgs(t, b) })
	t.Run("ttl", func(t *testing.T) { testTTL(t, b) })
	t.Run("idle key expires", func(t *testing.T) { testExpiry(t, b) })
	t.Run("plan change outlives the old expiry", func(t *testing.T) { testPlanChangeExpiry(t, b) })
	t.Run("hammer", func(t *testing.T) { testHammer(t, b) })
	t.Run("differential", func(t *testing.T) { testDifferential(t, b) })
	t.Run("clock stepped back", func(t *testing.T) { testClockStepBack(t, b) })
	t.Run("idle for days refills exactly", func(t *testing.T) { testIdleDays(t, b) })
	t.Run("fractional refills do not drift", func(t *testing.T) { testNoDrift(t, b) })
	t.Run("noscript", func(t *testing.T) { testNoScript(t, b) })
}

// step is one call and its expected outcome. tokens is what the bucket
// should hold after the call if no time passed during the test; time does
// pass, so the test accepts up to rate*(time elapsed) more.
type step struct {
	cost           int64
	allowed, never bool
	tokens         float64
}

func testSemantics(t *testing.T, b backend) {
	ctx := context.Background()
	const negligible = 1e-6 // tokens/s: refill during a test is < 1e-3 tokens
	for _, tc := range []struct {
		name string
		l    Limit
		// If set, the bucket is written directly before the first step:
		// tokens, and ts this long before Redis's now.
		state     string
		stateAgo  time.Duration
		withState bool
		steps     []step
	}{
		{name: "new client starts full, peek writes nothing",
			l: Limit{Capacity: 5, Rate: 0.01},
			steps: []step{
				{cost: 0, allowed: true, tokens: 5},
				{cost: 0, allowed: true, tokens: 5},
				{cost: 5, allowed: true, tokens: 0},
				{cost: 1, tokens: 0},
			}},
		{name: "spend until denied, denial spends nothing",
			l: Limit{Capacity: 3, Rate: negligible},
			steps: []step{
				{cost: 2, allowed: true, tokens: 1},
				{cost: 2, tokens: 1},
				{cost: 2, tokens: 1},
				{cost: 1, allowed: true, tokens: 0},
				{cost: 1, tokens: 0},
				{cost: 0, allowed: true, tokens: 0},
			}},
		{name: "cost above capacity can never succeed",
			l: Limit{Capacity: 3, Rate: negligible},
			steps: []step{
				{cost: 4, never: true, tokens: 3},
				{cost: 1, allowed: true, tokens: 2},
				{cost: 4, never: true, tokens: 2},
				{cost: 2, allowed: true, tokens: 0},
			}},
		{name: "fractional capacity and rate",
			l: Limit{Capacity: 2.5, Rate: 0.001},
			steps: []step{
				{cost: 1, allowed: true, tokens: 1.5},
				{cost: 1, allowed: true, tokens: 0.5},
				{cost: 1, tokens: 0.5},
				{cost: 3, never: true, tokens: 0.5},
			}},
		{name: "continuous refill since the stored ts",
			l:     Limit{Capacity: 10, Rate: 2},
			state: "1.25", stateAgo: 1500 * time.Millisecond, withState: true,
			steps: []step{
				{cost: 0, allowed: true, tokens: 4.25},
				{cost: 4, allowed: true, tokens: 0.25},
			}},
		{name: "refill capped at capacity",
			l:     Limit{Capacity: 10, Rate: 1},
			state: "0", stateAgo: time.Hour, withState: true,
			steps: []step{
				{cost: 0, allowed: true, tokens: 10},
				{cost: 10, allowed: true, tokens: 0},
			}},
		{name: "balance above a shrunk capacity is capped",
			l:     Limit{Capacity: 4, Rate: negligible},
			state: "100", withState: true,
			steps: []step{
				{cost: 1, allowed: true, tokens: 3},
			}},
		// A denial restamps such a bucket (testClockStepBack); a peek
		// writes nothing.
		{name: "stored ts in the future refills nothing",
			l:     Limit{Capacity: 10, Rate: 1},
			state: "2", stateAgo: -time.Hour, withState: true,
			steps: []step{
				{cost: 0, allowed: true, tokens: 2},
				{cost: 2, allowed: true, tokens: 0},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "bucket:" + t.Name()
			start := time.Now()
			if tc.withState {
				writeState(t, b.c, key, tc.state, redisMicros(t, b.c)-tc.stateAgo.Microseconds())
			}
			for i, s := range tc.steps {
				before := hgetall(t, b.c, key)
				r, err := Take(ctx, b.c, key, tc.l, s.cost)
				if err != nil {
					t.Fatalf("step %d (cost %d): %v", i, s.cost, err)
				}
				// Refill while the test ran is at most rate*elapsed, since
				// Redis's clock and this one are the same machine's.
				slack := tc.l.Rate * time.Since(start).Seconds()
				checkResult(t, fmt.Sprintf("step %d (cost %d)", i, s.cost), r, tc.l, s.cost,
					s.allowed, s.never, s.tokens, slack)

				after := hgetall(t, b.c, key)
				if r.Allowed && s.cost > 0 {
					// The stored balance is the reply's, to the bit.
					if got, err := strconv.ParseFloat(after["tokens"], 64); err != nil || got != r.Tokens {
						t.Errorf("step %d: stored tokens %q, reply %v", i, after["tokens"], r.Tokens)
					}
				} else if !maps.Equal(before, after) {
					// Denials, "never" and peeks write nothing (and so create
					// no key for a new client).
					t.Errorf("step %d (allowed %v, cost %d) changed the bucket: %v -> %v", i, r.Allowed, s.cost, before, after)
				}
			}
		})
	}
}

// checkResult checks r against the expected outcome; tokens may exceed
// want by up to slack (refill during the test) and never exceed capacity.
func checkResult(t *testing.T, what string, r Result, l Limit, cost int64, allowed, never bool, want, slack float64) {
	t.Helper()
	if r.Allowed != allowed || r.Never != never {
		t.Errorf("%s: allowed %v never %v, want allowed %v never %v (%+v)", what, r.Allowed, r.Never, allowed, never, r)
	}
	// 1e-9 absorbs rounding in the expected values written as decimals.
	if r.Tokens < want-1e-9 || r.Tokens > want+slack+1e-9 || r.Tokens > l.Capacity {
		t.Errorf("%s: tokens %v, want %v (+ up to %v refill), at most %v", what, r.Tokens, want, slack, l.Capacity)
	}
	// The waits follow from the tokens by the script's own arithmetic,
	// which Go's float64 reproduces bit for bit.
	wantRetry := time.Duration(0)
	if !allowed && !never {
		wantRetry = time.Duration(math.Ceil((float64(cost) - r.Tokens) / l.Rate * 1000 * 1e6))
	}
	wantReset := time.Duration(math.Ceil((l.Capacity - r.Tokens) / l.Rate * 1000 * 1e6))
	if r.RetryAfter != wantRetry || r.ResetAfter != wantReset {
		t.Errorf("%s: retry %v reset %v, want %v and %v (tokens %v)", what, r.RetryAfter, r.ResetAfter, wantRetry, wantReset, r.Tokens)
	}
}

func testInvalidArgs(t *testing.T, b backend) {
	ctx := context.Background()
	key := "bucket:" + t.Name()
	// A live bucket that no bad call may touch.
	if _, err := Take(ctx, b.c, key, Limit{Capacity: 10, Rate: 1e-6}, 3); err != nil {
		t.Fatal(err)
	}
	want := hgetall(t, b.c, key)
	ttl := pttl(t, b.c, key)
	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"10", "1"}, "want 3 arguments (capacity, rate, cost), got 2"},
		{[]any{}, "want 3 arguments (capacity, rate, cost), got 0"},
		{[]any{"10", "1", "1", "1"}, "want 3 arguments (capacity, rate, cost), got 4"},
		{[]any{"ten", "1", "1"}, `capacity: must be a finite number, got "ten"`},
		{[]any{"", "1", "1"}, `capacity: must be a finite number, got ""`},
		{[]any{"0", "1", "1"}, `capacity: must be > 0, got "0"`},
		{[]any{"-0", "1", "1"}, `capacity: must be > 0, got "-0"`},
		{[]any{"-5", "1", "1"}, `capacity: must be > 0, got "-5"`},
		// Lua's tonumber (C strtod) reads these as NaN and infinities.
		{[]any{"nan", "1", "1"}, `capacity: must be a finite number, got "nan"`},
		{[]any{"NaN", "1", "1"}, `capacity: must be a finite number, got "NaN"`},
		{[]any{"inf", "1", "1"}, `capacity: must be a finite number, got "inf"`},
		{[]any{"+Inf", "1", "1"}, `capacity: must be a finite number, got "+Inf"`},
		{[]any{"1e999", "1", "1"}, `capacity: must be a finite number, got "1e999"`},
		{[]any{"10", "0", "1"}, `rate: must be > 0, got "0"`},
		{[]any{"10", "-0.5", "1"}, `rate: must be > 0, got "-0.5"`},
		{[]any{"10", "-inf", "1"}, `rate: must be a finite number, got "-inf"`},
		{[]any{"10", "nan", "1"}, `rate: must be a finite number, got "nan"`},
		{[]any{"10", "fast", "1"}, `rate: must be a finite number, got "fast"`},
		// Past 2^53 a double cannot count single tokens: 1e17 - 1 is
		// 1e17, and every call would be admitted without spending.
		{[]any{"1e17", "1", "1"}, `capacity: must be at most 9007199254740992 (2^53), got "1e17"`},
		{[]any{"9007199254740994", "1", "1"}, `capacity: must be at most 9007199254740992 (2^53), got "9007199254740994"`},
		{[]any{"1e300", "1", "1"}, `capacity: must be at most 9007199254740992 (2^53), got "1e300"`},
		{[]any{"1e15", "1e-310", "1"}, `rate: too small for capacity "1e15": filling the bucket would take forever, got "1e-310"`},
		{[]any{"10", "1", "-1"}, `cost: must be >= 0, got "-1"`},
		{[]any{"10", "1", "nan"}, `cost: must be a finite number, got "nan"`},
		{[]any{"10", "1", "inf"}, `cost: must be a finite number, got "inf"`},
		{[]any{"10", "1", "one"}, `cost: must be a finite number, got "one"`},
	} {
		_, err := Script.Run(ctx, b.c, []string{key}, tc.args...).Result()
		if got, want := errString(err), "ERR tokenbucket: "+tc.want; got != want {
			t.Errorf("args %q: error %q, want %q", tc.args, got, want)
		}
	}
	for _, keys := range [][]string{{}, {"{" + key + "}a", "{" + key + "}b"}} {
		_, err := Script.Run(ctx, b.c, keys, Args(Limit{Capacity: 1, Rate: 1}, 1)...).Result()
		if got, want := errString(err), fmt.Sprintf("ERR tokenbucket: want exactly 1 key (the bucket), got %d", len(keys)); got != want {
			t.Errorf("keys %q: error %q, want %q", keys, got, want)
		}
	}
	if got := hgetall(t, b.c, key); !maps.Equal(got, want) {
		t.Errorf("bad calls changed the bucket: %v -> %v", want, got)
	}
	if got := pttl(t, b.c, key); got > ttl || got <= 0 {
		t.Errorf("bad calls changed the expiry: PTTL %d ms, was %d ms", got, ttl)
	}

	// A bucket whose stored state cannot be read is reported, not reset.
	bad := key + ":corrupt"
	if err := b.c.HSet(ctx, bad, "tokens", "lots").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := Take(ctx, b.c, bad, Limit{Capacity: 1, Rate: 1}, 1)
	if got, want := errString(err), `token bucket script: ERR tokenbucket: bucket holds unreadable state (tokens="lots", ts=nothing)`; got != want {
		t.Errorf("corrupt bucket: error %q, want %q", got, want)
	}
}

func testTTL(t *testing.T, b backend) {
	ctx := context.Background()
	for _, tc := range []struct {
		l    Limit
		want int64 // ms: ceil(capacity/rate*1000) + 1000, at most 2^53
	}{
		{Limit{Capacity: 10, Rate: 0.5}, 21000},
		{Limit{Capacity: 1, Rate: 3}, 1334}, // 333.33.. -> 334
		{Limit{Capacity: 100, Rate: 1e-9}, 1e14 + 1000},
		{Limit{Capacity: 1e12, Rate: 1e-9}, 1 << 53},
	} {
		t.Run(fmt.Sprintf("%v/%v", tc.l.Capacity, tc.l.Rate), func(t *testing.T) {
			key := "bucket:" + t.Name()
			start := time.Now()
			if _, err := Take(ctx, b.c, key, tc.l, 1); err != nil {
				t.Fatal(err)
			}
			got := pttl(t, b.c, key)
			// PTTL counts down from the script's PEXPIRE; it cannot have
			// lost more than the time this test took (plus 1 ms rounding).
			took := time.Since(start).Milliseconds()
			if got > tc.want || got < tc.want-took-1 {
				t.Errorf("PTTL %d ms, want %d ms minus at most %d ms", got, tc.want, took+1)
			}
			// A refused call, an ordinary denial or a cost above the
			// capacity, leaves the expiry as it was: the stored state, and
			// so the time it takes to fill, did not change. The bucket is
			// emptied and stamped an hour ahead of Redis's clock, so that
			// nothing refills (the script never refills backwards) and a
			// cost of 1 is an ordinary denial however slow the test; then
			// the key gets a marker expiry an hour longer than any the
			// script sets for this limit. After each refused call PTTL is
			// the marker less the time since it was set: at most the
			// marker, and at least the marker less the time measured here
			// (plus 1 ms of rounding). A call that set the expiry again
			// would bring PTTL down to at most tc.want, an hour below that.
			writeState(t, b.c, key, "0", redisMicros(t, b.c)+time.Hour.Microseconds())
			marker := tc.want + time.Hour.Milliseconds()
			set := time.Now()
			if err := b.c.Do(ctx, "PEXPIRE", key, marker).Err(); err != nil {
				t.Fatal(err)
			}
			for _, refused := range []struct {
				what  string
				cost  int64
				never bool
			}{
				{"denial", 1, false},
				{"cost above the capacity", int64(tc.l.Capacity) + 1, true},
			} {
				r, err := Take(ctx, b.c, key, tc.l, refused.cost)
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed || r.Never != refused.never {
					t.Fatalf("%s (cost %d): %+v, want refused with never %v", refused.what, refused.cost, r, refused.never)
				}
				again := pttl(t, b.c, key)
				if took := time.Since(set).Milliseconds(); again > marker || again < marker-took-1 {
					t.Errorf("after a %s: PTTL %d ms, want the marker's %d ms less at most %d ms", refused.what, again, marker, took+1)
				}
			}
		})
	}
}

func testExpiry(t *testing.T, b backend) {
	ctx := context.Background()
	key := "bucket:" + t.Name()
	// Full again after 1/20 s, so the key goes after 50 ms + 1 s.
	l := Limit{Capacity: 1, Rate: 20}
	const ttl = 1050 * time.Millisecond
	start := time.Now()
	if r, err := Take(ctx, b.c, key, l, 1); err != nil || !r.Allowed {
		t.Fatalf("Take = %+v, %v", r, err)
	}
	// Redis removes an expired key on access, so EXISTS sees it gone as soon
	// as the TTL is over; the 30 s allowance is for a machine too busy to
	// run this loop, not for Redis.
	deadline := start.Add(ttl + 30*time.Second)
	for {
		n, err := b.c.Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key still there %v after the call (PTTL %d ms)", time.Since(start), pttl(t, b.c, key))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Expiry cannot come before the TTL (the key was written after start).
	if gone := time.Since(start); gone < ttl-time.Millisecond {
		t.Errorf("key gone after %v, before its TTL %v", gone, ttl)
	}
	// The client is then simply new: full.
	if r, err := Take(ctx, b.c, key, l, 0); err != nil || r.Tokens != l.Capacity {
		t.Errorf("after expiry: %+v, %v; want a full bucket", r, err)
	}
}

// A bucket spent under one plan and then refused under a slower one (a
// lower rate, a larger capacity) must not vanish when the old plan's
// expiry passes: a missing key reads full, and the client would be handed
// the new plan's whole capacity long before it refilled.
func testPlanChangeExpiry(t *testing.T, b backend) {
	ctx := context.Background()
	// Full again after 2/20 s: the key goes 100 ms + 1 s after a write.
	old := Limit{Capacity: 2, Rate: 20}
	const oldTTL = 1100 * time.Millisecond
	for _, tc := range []struct {
		name string
		l    Limit
		cost int64 // a cost the new plan's bucket cannot pay at once
	}{
		// Two tokens an hour: after the old expiry the bucket holds
		// about 2/3600 × 1.1 s ≈ 0.0006 tokens.
		{"rate lowered", Limit{Capacity: 2, Rate: 2.0 / 3600}, 1},
		// Capacity 1000 at the same 20/s: full after 50 s, not 1.1 s.
		{"capacity raised", Limit{Capacity: 1000, Rate: 20}, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "bucket:" + t.Name()
			// Taken before the spend, so that the time since it is at
			// least the time since the script's own clock reading.
			spent := time.Now()
			if r, err := Take(ctx, b.c, key, old, 2); err != nil || !r.Allowed {
				t.Fatalf("spend the old plan's bucket: %+v, %v", r, err)
			}
			r, err := Take(ctx, b.c, key, tc.l, tc.cost)
			if err != nil || r.Allowed || r.Never {
				t.Fatalf("first call at the new plan: %+v, %v; want an ordinary denial", r, err)
			}
			// The key lives until the bucket is full at the new plan: its
			// reset plus the second the script adds, less the time since
			// the spend (plus 1 ms of rounding).
			want := r.ResetMs + 1000
			if got := pttl(t, b.c, key); float64(got) < want-float64(time.Since(spent).Milliseconds())-1 {
				t.Errorf("PTTL %d ms after a denial at the new plan, want at least %.0f ms less the time since", got, want)
			}
			// Past the old plan's expiry the bucket holds what the new
			// plan refilled since the spend, not a full one: at most the
			// new rate times the time since the spend.
			for time.Since(spent) < oldTTL+50*time.Millisecond {
				time.Sleep(20 * time.Millisecond)
			}
			peek, err := Take(ctx, b.c, key, tc.l, 0)
			if err != nil {
				t.Fatal(err)
			}
			if most := tc.l.Rate * time.Since(spent).Seconds(); peek.Tokens > most {
				t.Errorf("%v after the spend the bucket holds %v tokens, want at most %v (rate %v × the time since): the key went at the old plan's expiry",
					time.Since(spent).Round(time.Millisecond), peek.Tokens, most, tc.l.Rate)
			}
		})
	}
}

func testHammer(t *testing.T, b backend) {
	const (
		workers = 64
		calls   = 8 // per worker: 512 attempts in all, more than any capacity below
		// Refill over even a very slow test (1e6 s) is 1e-3 tokens, so
		// the bucket can admit its initial content and not one more.
		negligible = 1e-9
	)
	for _, tc := range []struct {
		capacity float64
		cost     int64
		admitted int64 // floor(capacity/cost)
	}{
		{100, 1, 100},
		{100, 3, 33},
		{10.5, 2, 5},
	} {
		t.Run(fmt.Sprintf("capacity %v cost %d", tc.capacity, tc.cost), func(t *testing.T) {
			ctx := context.Background()
			key := "bucket:" + t.Name()
			l := Limit{Capacity: tc.capacity, Rate: negligible}
			start := time.Now()
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range calls {
						r, err := Take(ctx, b.c, key, l, tc.cost)
						if err != nil {
							t.Error(err)
							return
						}
						if r.Allowed {
							admitted.Add(1)
						} else {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != tc.admitted {
				t.Errorf("admitted %d of %d, want exactly %d", got, admitted.Load()+denied.Load(), tc.admitted)
			}
			if got := admitted.Load() + denied.Load(); got != workers*calls {
				t.Errorf("%d calls answered, want %d", got, workers*calls)
			}
			r, err := Take(ctx, b.c, key, l, 0)
			if err != nil {
				t.Fatal(err)
			}
			// What is left, plus at most the refill since the first call
			// (Redis's clock is this machine's). Each spend and the peek
			// add their refill to a balance of at most the capacity, and
			// the sum rounds up by at most half an ulp of the capacity;
			// rounding never takes the balance below what it was, and
			// taking a whole cost is exact.
			left := tc.capacity - float64(tc.admitted*tc.cost)
			halfUlp := (math.Nextafter(tc.capacity, math.Inf(1)) - tc.capacity) / 2
			slack := l.Rate*time.Since(start).Seconds() + float64(tc.admitted+1)*halfUlp
			if r.Tokens < left || r.Tokens > left+slack {
				t.Errorf("bucket holds %v after the hammer, want %v plus at most %g", r.Tokens, left, slack)
			}
		})
	}
}

// testDifferential runs one request timeline through the script and through
// golang.org/x/time/rate and compares every decision.
//
// Both run on Redis's clock: each call's time is read back exactly (from
// the ts the script stores when it spends, or, when it denies, solved from
// the balance it reports), and fed to rate.Limiter.AllowN. The two then do
// the same arithmetic on the same instants, so the only allowed difference
// is granularity: x/time/rate rounds the wait for a missing fraction down to
// whole nanoseconds, so it admits a request short by less than rate*1ns
// tokens, which the script refuses. That is the one difference the test
// lets pass: x/time/rate admits, the script refuses, and the script's
// balance is short of the cost by less than rate*1ns plus what the two
// balances may differ by (tokTol). Any other difference fails the test.
// After a tolerated difference the reference is rebuilt from the script's
// balance.
func testDifferential(t *testing.T, b backend) {
	ctx := context.Background()
	key := "bucket:" + t.Name()
	// 47.3 tokens/s puts a whole token on the timeline only every 10 s of
	// microseconds, so ties are rare; burst 5 and costs 1..3 with 0..20 ms
	// gaps keep the bucket near empty: many denials.
	l := Limit{Capacity: 5, Rate: 47.3}
	const n = 300
	// The two balances differ only by rounding until a rebuild. Each side
	// refills and spends with at most five float64 operations per call
	// (the script: elapsed*rate, /1e6, +stored, -cost; x/time/rate:
	// nsec/1e9, +sec, *rate, +tokens, -n), each off by at most 2^-53 of a
	// result that ends up at most the capacity, 5 tokens: under 2^-50
	// tokens each, 9*2^-50 for both sides together (the script's first
	// call starts from the capacity, exactly). Only a spend's are kept
	// (a denial writes nothing), and min with the capacity takes nothing
	// from a difference, so after k spends and the call's own refill the
	// balances differ by at most (k+1)*9*2^-50: at most rounding, below.
	rounding := float64(n+1) * 9 * 0x1p-50
	tokTol := rounding
	lim := rate.NewLimiter(rate.Limit(l.Rate), int(l.Capacity))
	rng := rand.New(rand.NewPCG(1, 2))

	var stored, storedTS float64 // the bucket's hash, once it exists
	var exists bool
	var allowed, denied, tolerated int
	for i := range n {
		cost := int64(1 + rng.IntN(3))
		r, err := Take(ctx, b.c, key, l, cost)
		if err != nil {
			t.Fatal(err)
		}
		var now int64
		if r.Allowed {
			allowed++
			h := hgetall(t, b.c, key)
			storedTS, _ = strconv.ParseFloat(h["ts"], 64)
			stored, _ = strconv.ParseFloat(h["tokens"], 64)
			now, exists = int64(storedTS), true
		} else {
			denied++
			if !exists {
				t.Fatalf("call %d denied on a new bucket: %+v", i, r)
			}
			now = solveNow(t, r.Tokens, stored, storedTS, l)
		}
		ref := lim.AllowN(time.UnixMicro(now), int(cost))

		before := r.Tokens // the balance the decision was made on
		if r.Allowed {
			before += float64(cost)
		}
		if ref != r.Allowed {
			// x/time/rate admits when its wait for the missing tokens,
			// (short/rate)*1e9 ns in float64, truncates to 0: when its
			// shortfall is below rate*1ns, give or take the two roundings
			// of that expression (a factor of 1+2^-51 at most). The
			// script's shortfall is larger by at most tokTol.
			short := float64(cost) - before
			if !ref || short <= 0 || short >= l.Rate*1e-9*(1+0x1p-51)+tokTol {
				t.Fatalf("call %d (cost %d at %d us): script allowed=%v with %v tokens, x/time/rate allowed=%v",
					i, cost, now, r.Allowed, before, ref)
			}
			tolerated++
			// Follow the script: rebuild the reference with its balance,
			// from a full bucket emptied a whole number of ns ago. The
			// count is rounded up, so the rebuilt reference holds at least
			// the script's balance and at most rate*1ns more: it can
			// admit where the script refuses, never the reverse.
			lim = rate.NewLimiter(rate.Limit(l.Rate), int(l.Capacity))
			lim.AllowN(time.UnixMicro(now).Add(-time.Duration(math.Ceil(r.Tokens/l.Rate*1e9))), int(l.Capacity))
			// The rebuild holds up to 1 ns of refill more than the script,
			// and rounds afresh.
			tokTol = l.Rate*1e-9 + rounding
		}
		if got := lim.TokensAt(time.UnixMicro(now)); math.Abs(got-r.Tokens) > tokTol {
			t.Fatalf("call %d: x/time/rate holds %v tokens, script %v", i, got, r.Tokens)
		}
		time.Sleep(time.Duration(rng.IntN(20_000)) * time.Microsecond)
	}
	t.Logf("%d calls: %d allowed, %d denied, %d tolerated differences", n, allowed, denied, tolerated)
	if allowed == 0 || denied == 0 {
		t.Errorf("timeline exercised only one outcome (%d allowed, %d denied)", allowed, denied)
	}
}

// solveNow recovers the Redis time (us) at which a denied call ran. Denied
// means the balance was below cost <= capacity, so not capped:
// tokens = stored + (now-ts)*rate/1e6. It solves for now, then checks the
// script's formula reproduces tokens bit for bit at that now.
func solveNow(t *testing.T, tokens, stored, ts float64, l Limit) int64 {
	t.Helper()
	guess := int64(ts + math.Round((tokens-stored)*1e6/l.Rate))
	for _, now := range []int64{guess, guess - 1, guess + 1, guess - 2, guess + 2} {
		if stored+float64(now-int64(ts))*l.Rate/1e6 == tokens {
			return now
		}
	}
	t.Fatalf("no time near %d us gives %v tokens from %v at %v", guess, tokens, stored, ts)
	return 0
}

func testIdleDays(t *testing.T, b backend) {
	ctx := context.Background()
	for _, l := range []Limit{
		{Capacity: 1, Rate: 1},
		{Capacity: 0.3, Rate: 0.1},
		{Capacity: 7.25, Rate: 1.0 / 3},
		{Capacity: 123456.789, Rate: 0.7},
		{Capacity: 1e15, Rate: 1e10}, // full after 1.2 days
		{Capacity: 1e-3, Rate: 1e-4},
	} {
		t.Run(fmt.Sprintf("%v", l.Capacity), func(t *testing.T) {
			key := "bucket:" + t.Name()
			writeState(t, b.c, key, "0", redisMicros(t, b.c)-(72*time.Hour).Microseconds())
			r, err := Take(ctx, b.c, key, l, 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.Tokens != l.Capacity {
				t.Errorf("after 3 idle days: %v tokens, want exactly %v", r.Tokens, l.Capacity)
			}
			if l.Capacity >= 1 {
				r, err = Take(ctx, b.c, key, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if want := l.Capacity - 1; !r.Allowed || r.Tokens != want {
					t.Errorf("spend 1 of a full bucket: %+v, want %v tokens exactly", r, want)
				}
			}
		})
	}
}

// testNoDrift spends one token per call for many calls while fractional
// refills accumulate, and compares the end balance with the exact rational
// value start + (ts_end-ts_start)*rate/1e6 - n.
//
// The bound: per call, the refill elapsed*rate/1e6 (about 1e-4 tokens) is
// off by ~1e-20 after its two roundings; adding it to a balance below 2048
// rounds by at most half an ulp, 2^-43; subtracting the whole token is exact
// (same binade or finer); the %.17g string reads back as the same double.
// So n calls are off by at most n*2^-43 (+ negligible); the test allows
// twice that, n*2^-42 (2.3e-10 for n = 1000). Storing 14 digits (tostring)
// would add ~5e-11 per call, and losing time between calls would show as
// missing refill: either exceeds it.
func testNoDrift(t *testing.T, b backend) {
	ctx := context.Background()
	key := "bucket:" + t.Name()
	// Never capped; a third of a token per second has no finite decimal
	// expansion, so every refill has more digits than a short format keeps.
	l := Limit{Capacity: 1e6, Rate: 1.0 / 3}
	const n = 1000
	const start = "2000.3"
	t0 := redisMicros(t, b.c)
	writeState(t, b.c, key, start, t0)
	for i := range n {
		r, err := Take(ctx, b.c, key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			t.Fatalf("call %d denied with %v tokens", i, r.Tokens)
		}
	}
	h := hgetall(t, b.c, key)
	got, err := strconv.ParseFloat(h["tokens"], 64)
	if err != nil {
		t.Fatal(err)
	}
	tEnd, err := strconv.ParseInt(h["ts"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	startF, _ := strconv.ParseFloat(start, 64)
	want := new(big.Rat).SetFloat64(startF)
	refill := new(big.Rat).Mul(new(big.Rat).SetInt64(tEnd-t0), new(big.Rat).SetFloat64(l.Rate))
	want.Add(want, refill.Quo(refill, big.NewRat(1e6, 1)))
	want.Sub(want, big.NewRat(n, 1))
	wantF, _ := want.Float64()
	bound := n * math.Ldexp(1, -42)
	if diff := math.Abs(got - wantF); diff > bound {
		t.Errorf("after %d calls over %d us: %v tokens, exact %v: off by %g, bound %g", n, tEnd-t0, got, wantF, diff, bound)
	}
}

func testNoScript(t *testing.T, b backend) {
	ctx := context.Background()
	key := "bucket:" + t.Name()
	l := Limit{Capacity: 10, Rate: 1e-6}
	for _, tc := range []struct {
		name  string
		empty func(t *testing.T) // drops the script cache
		left  float64            // tokens after the next call
	}{
		{"script flush", func(t *testing.T) {
			if err := b.c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}, 6},
		// A restarted Redis has no scripts and no data: the bucket is new.
		{"restart", func(t *testing.T) { b.restart(t, key) }, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			if _, err := Take(ctx, b.c, key, l, 2); err != nil {
				t.Fatal(err)
			}
			tc.empty(t)
			// Redis answers a bare EVALSHA with NOSCRIPT now...
			err := b.c.EvalSha(ctx, Script.Hash(), []string{key}, Args(l, 0)...).Err()
			if !IsNoScript(err) {
				t.Fatalf("EVALSHA after %s: %v, want NOSCRIPT", tc.name, err)
			}
			// ...and Take loads the script again and succeeds.
			r, err := Take(ctx, b.c, key, l, 2)
			if err != nil {
				t.Fatalf("Take after %s: %v", tc.name, err)
			}
			// The bucket the first Take of this case wrote (the flush) or
			// a new one (the restart): tc.left, plus at most the refill
			// since start, added to a balance below 16 in one sum that
			// rounds up by at most half an ulp, 2^-50.
			slack := l.Rate*time.Since(start).Seconds() + 0x1p-50
			if !r.Allowed || r.Tokens < tc.left || r.Tokens > tc.left+slack {
				t.Errorf("Take after %s: %+v, want allowed with %v tokens plus at most %g", tc.name, r, tc.left, slack)
			}
			if err := b.c.EvalSha(ctx, Script.Hash(), []string{key}, Args(l, 0)...).Err(); err != nil {
				t.Errorf("EVALSHA after reload: %v", err)
			}
		})
	}
}

// testClockStepBack: a bucket last written at a time Redis's clock has not
// reached, as a failover to a replica whose clock is behind the old
// master's (or an NTP step back) leaves every bucket, refills from the
// first refused call after the step, instead of staying as it is until
// the clock is back at the stamp: a client waits what the reply says, not
// the step. The refused call keeps the stored balance, to the byte, and
// stamps it with Redis's time at the call (between two TIME readings
// around it); once Redis's clock is past that stamp by the wait the reply
// quoted, the same cost is admitted.
func testClockStepBack(t *testing.T, b backend) {
	ctx := context.Background()
	// A token every 50 ms; 0.5 stored, so a cost of 1 waits 25 ms, and
	// 0.5 + 25000 µs * 20 / 1e6 is 1 exactly.
	l := Limit{Capacity: 10, Rate: 20}
	for _, step := range []time.Duration{2 * time.Second, 30 * time.Second, time.Hour} {
		for _, refused := range []struct {
			what  string
			cost  int64
			never bool
		}{{"denial", 1, false}, {"cost above the capacity", 11, true}} {
			t.Run(fmt.Sprintf("%v/%s", step, refused.what), func(t *testing.T) {
				key := "bucket:" + t.Name()
				writeState(t, b.c, key, "0.5", redisMicros(t, b.c)+step.Microseconds())
				before := redisMicros(t, b.c)
				r, err := Take(ctx, b.c, key, l, refused.cost)
				if err != nil {
					t.Fatal(err)
				}
				after := redisMicros(t, b.c)
				if r.Allowed || r.Never != refused.never || r.Tokens != 0.5 {
					t.Fatalf("%+v, want refused (never %v) with 0.5 tokens", r, refused.never)
				}
				h := hgetall(t, b.c, key)
				ts, err := strconv.ParseInt(h["ts"], 10, 64)
				if err != nil || h["tokens"] != "0.5" || ts < before || ts > after {
					t.Fatalf("bucket after the call %v, want tokens 0.5 stamped between %d and %d (Redis's clock around the call; it was stamped %v ahead)",
						h, before, after, step)
				}
				for redisMicros(t, b.c) < ts+25000 {
					time.Sleep(5 * time.Millisecond)
				}
				if r, err := Take(ctx, b.c, key, l, 1); err != nil || !r.Allowed {
					t.Errorf("25 ms of Redis's clock after the refused call: %+v, %v; want admitted", r, err)
				}
			})
		}
	}
}

// redisMicros is Redis's clock now, in microseconds, as TIME reports it.
func redisMicros(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

func writeState(t *testing.T, c redis.UniversalClient, key, tokens string, ts int64) {
	t.Helper()
	if err := c.HSet(context.Background(), key, "tokens", tokens, "ts", ts).Err(); err != nil {
		t.Fatal(err)
	}
}

func hgetall(t *testing.T, c redis.UniversalClient, key string) map[string]string {
	t.Helper()
	h, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// pttl is the key's PTTL in ms. (go-redis's PTTL returns a Duration, which
// overflows for the long TTLs of slow buckets.)
func pttl(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	ms, err := c.Do(context.Background(), "PTTL", key).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return ms
}
