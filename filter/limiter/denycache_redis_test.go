//go:build !wasip1

package limiter

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/bucketbound"
	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/plans"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// TestDenyCacheAgainstRedis is a differential test of the deny cache against
// the real script on a real redis-server: random timelines (plans from 0.001
// to 100,000 tokens/s, capacities from 1 to 10^6 within the plans file's
// one-year refill rule, random costs up to the capacity) run through the
// filter's cache logic and the script side by side. The sidecar's answer to
// each denial is made by the sidecar's own code (server.Answer), read by
// ParseAnswer and stored through the shard encoding, as in the filter.
//
// Every request the cache denies is checked against the bucket at that very
// instant: the stored state (tokens, ts) read from Redis and refilled to the
// cache's clock reading with the script's own formula and integer
// microseconds, which must hold less than the cost. The clock tolerance is
// none: the filter's clock here is time.Now (CLOCK_REALTIME) and Redis's
// TIME reads the same clock on the same host (measured: a script's TIME
// always lies between the send and the reply, to the microsecond). What the
// cache must absorb itself (TIME's whole microseconds, float64 rounding) is
// its margin, which is what this test holds it to. The script is then run
// for that cost too: it must deny, unless the refill between the cache's
// reading and the script's run (bounded by the reading after it returns)
// explains the difference, which at 100,000 tokens/s a delay of 10 µs does. Each timeline seeds
// its bucket a few milliseconds short of admitting a cost, and the test
// sleeps to within ±200 µs of the cache's own boundary, so that denials
// close to it occur at every rate.
//
// The random choices follow the seed (EDGELIMIT_DENY_SEED, default 1); the
// timings are real, so runs differ in where exactly each check lands. It
// runs for about 3 s.
func TestDenyCacheAgainstRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	seed := uint64(1)
	if v := os.Getenv("EDGELIMIT_DENY_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("EDGELIMIT_DENY_SEED=%q: %v", v, err)
		}
		seed = n
	}
	srv := redisproc.StartT(t, redisproc.Options{})
	c := srv.Client(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))

	var timelines, callouts, sidecarDenials, cached, othersCached, near, spent, late int
	closest := math.Inf(1)
	minRate, maxRate := math.Inf(1), 0.0
	// At least 3 s of timelines, and on until they have covered enough
	// (the coverage checked below), for 30 s at most: a machine slowed by
	// other tests (or the race detector) runs fewer per second.
	start := time.Now()
	enough := func() bool {
		el := time.Since(start)
		return el > 30*time.Second || (el > 3*time.Second && cached >= 100 && near >= 10)
	}
	for timelines = 0; !enough(); timelines++ {
		rate := math.Pow(10, -3+8*rng.Float64()) // 0.001 to 100,000 tokens/s
		capacity := math.Max(1, math.Floor(math.Pow(10, 6*rng.Float64())))
		capacity = math.Min(capacity, math.Max(1, math.Floor(rate*365*24*3600)))
		minRate, maxRate = math.Min(minRate, rate), math.Max(maxRate, rate)
		plan := &plans.Plan{Name: "p" + strconv.Itoa(timelines%7), Capacity: capacity, Rate: rate,
			LimitHeader: strconv.FormatFloat(capacity, 'f', -1, 64)}
		l := lua.Limit{Capacity: capacity, Rate: rate}
		key := "rl:{diff" + strconv.Itoa(timelines) + "}"
		take := func(cost int64) lua.Result {
			t.Helper()
			r, err := lua.Take(ctx, c, key, l, cost)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}

		var e denyEntry
		has := false
		// others says another gateway spent since the entry was made,
		// which the entry does not know of.
		others := false
		// level is the bucket at local time ns as the script would compute
		// it there: the stored state refilled with integer microseconds.
		level := func() func(ns int64) float64 {
			t.Helper()
			v, err := c.HMGet(ctx, key, "tokens", "ts").Result()
			if err != nil {
				t.Fatal(err)
			}
			if v[0] == nil {
				// Expired: a full bucket, as the script reads it.
				return func(int64) float64 { return capacity }
			}
			stored, _ := strconv.ParseFloat(v[0].(string), 64)
			ts, _ := strconv.ParseFloat(v[1].(string), 64)
			return func(ns int64) float64 {
				elapsed := math.Max(0, float64(ns/1000)-ts)
				return math.Min(capacity, stored+elapsed*rate/1000000)
			}
		}
		// check holds a cached denial of cost at local time now to the
		// bucket, then to the script.
		check := func(now, cost int64, e *denyEntry) lua.Result {
			t.Helper()
			at := level()
			if lv := at(now); lv >= float64(cost) {
				t.Fatalf("timeline %d (capacity %v, rate %v, entry %+v): cached denial of cost %d at +%d ns while the bucket held %v",
					timelines, capacity, rate, *e, cost, now-e.sent, lv)
			}
			r := take(cost)
			if after := time.Now().UnixNano(); r.Allowed {
				if lv := at(after); lv < float64(cost) {
					t.Fatalf("timeline %d: the script admitted cost %d that the bucket could not pay even %d ns later (%v tokens)", timelines, cost, after-now, lv)
				}
				late++
				has = false // the filter would have asked the sidecar: what it learnt is gone
			}
			return r
		}

		// The bucket holds k - rate·δ: cost k is admitted δ (< 5 ms) from
		// now, whatever the rate.
		k := 1 + rng.Int64N(int64(capacity))
		delta := 5e-3 * rng.Float64()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		tokens := math.Max(0, float64(k)-rate*delta)
		if err := c.HSet(ctx, key, "tokens", strconv.FormatFloat(tokens, 'g', 17, 64),
			"ts", strconv.FormatInt(now.UnixMicro(), 10)).Err(); err != nil {
			t.Fatal(err)
		}

		for step := 0; step < 40; step++ {
			// The cost: half the time the one closest to admission (the
			// next whole token above the cached state), else any.
			cost := k
			switch {
			case has && rng.IntN(2) == 0:
				cost = min(int64(capacity), int64(math.Floor(e.tokens))+1+rng.Int64N(2))
			case step > 0:
				cost = 1 + rng.Int64N(int64(capacity))
			}
			if has {
				w := e.wait(cost)
				boundary := e.sent + w - bucketbound.Margin(w)
				if until := boundary - time.Now().UnixNano(); until > 20e6 {
					// A boundary far away (a slow plan): one check now,
					// then a new timeline.
					if now := time.Now().UnixNano(); e.denies(cost, now) {
						cached++
						check(now, cost, &e)
					}
					break
				} else if jitter := until + rng.Int64N(400_000) - 200_000; jitter > 0 {
					time.Sleep(time.Duration(jitter))
				}
			}
			if now := time.Now().UnixNano(); has && e.denies(cost, now) {
				cached++
				r := check(now, cost, &e)
				if !r.Never && !r.Allowed {
					closest = math.Min(closest, r.RetryMs)
					if r.RetryMs < 1 {
						near++
					}
				}
				// What the client is told: its Retry-After is no earlier
				// than the script's wait now, also when another gateway
				// spent since the entry's answer (others). When the entry
				// was sure of it, nobody but the entry's own answer can
				// have spent: the same Retry-After as if nobody had.
				if _, retry, sure := e.reply(cost, 0, now); !r.Never && !r.Allowed && float64(retry)*1000 < r.RetryMs {
					t.Fatalf("timeline %d: cached Retry-After %d s (sure %v, spent elsewhere since the answer %v), the script still needs %v ms",
						timelines, retry, sure, others, r.RetryMs)
				}
				if others {
					othersCached++
				}
				continue
			}
			sent := time.Now().UnixNano()
			r := take(cost)
			recv := time.Now().UnixNano()
			callouts++
			if !r.Allowed {
				sidecarDenials++
			}
			// As the filter: a denial makes an entry, and an admission for a
			// client that has one brings it up to date.
			if !r.Allowed || has {
				a := answerFrom(r, plan)
				if ne, ok := newDenyEntry(key, cost, sent, recv, &a); ok {
					var found bool
					e, found = findEntry(encodeShard([]denyEntry{ne}), key)
					has, others = found, false
				}
			}
			// Another gateway spends now and then: the bucket holds less
			// than any entry says, which the cache must allow for.
			if rng.IntN(8) == 0 {
				if take(1 + rng.Int64N(int64(capacity))).Allowed {
					spent++
					others = true
				}
			}
		}
	}
	t.Logf("seed %d: %d timelines (rates %.3g to %.3g tokens/s), %d script calls for the filter, %d denied; %d cached denials, every one short of the cost in the bucket at that instant; %d of them within 1 ms of the bucket admitting, the closest %.3g ms; %d spends by other gateways, after which %d cached denials were told a Retry-After; %d checks where the script, run after the instant checked, found the refill since",
		seed, timelines, minRate, maxRate, callouts, sidecarDenials, cached, near, closest, spent, othersCached, late)
	if cached < 100 || near < 10 {
		t.Errorf("the timelines exercised too little: %d cached denials, %d near the boundary", cached, near)
	}
}

// answerFrom is the sidecar's answer to res, as the filter reads it.
func answerFrom(res lua.Result, plan *plans.Plan) Answer {
	var a server.Answer
	a.Fill(res, plan)
	h := [][2]string{{":status", strconv.Itoa(a.Status)}}
	for i := range a.Len() {
		name, v := a.Field(i)
		h = append(h, [2]string{name, string(v)})
	}
	return ParseAnswer(h)
}
