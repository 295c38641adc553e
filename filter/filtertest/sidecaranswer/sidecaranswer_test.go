package sidecaranswer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/lua"
)

// TestScriptResultIsTheScripts: the model of the script
// (lua.Decide, which every answer of Check is made from) answers as
// tokenbucket.lua does in Redis, to the bit. Each case writes the bucket
// with a timestamp an hour ahead of Redis's clock, so that the script sees
// no time pass (it never refills backwards) and starts from exactly the
// tokens the model is given.
func TestScriptResultIsTheScripts(t *testing.T) {
	ctx := context.Background()
	rdb := redisproc.StartT(t, redisproc.Options{}).Client(t)
	rng := rand.New(rand.NewPCG(5, 6))
	type tc struct {
		capacity, rate, tokens float64
		cost                   int64
	}
	cases := []tc{
		{10, 1, 3, 1}, {10, 1, 0.5, 1}, {10, 1, 10, 10}, {10, 1, 9.999999999999998, 10},
		{10, 0.3, 6.6, 3}, {10, 1, 5, 20}, {10, 1, 5, 0}, {1e6, 1e3, 999999.5, 1000000}, {0.5, 1e-3, 0.25, 1},
	}
	for range 200 {
		capacity := float64(1 + rng.IntN(1000))
		cases = append(cases, tc{capacity, rng.Float64() * 100, rng.Float64() * capacity, int64(1 + rng.IntN(5))})
	}
	for i, c := range cases {
		key := "model-" + strconv.Itoa(i)
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ahead := now.UnixMicro() + 3600e6
		if err := rdb.HSet(ctx, key, "tokens", strconv.FormatFloat(c.tokens, 'g', 17, 64), "ts", ahead).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := lua.Take(ctx, rdb, key, lua.Limit{Capacity: c.capacity, Rate: c.rate}, c.cost)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		want := decide(c.capacity, c.rate, c.tokens, c.cost)
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Errorf("%+v:\nscript %+v\nmodel  %+v", c, got, want)
		}
	}
}

// TestBucketIsTheScripts: Bucket keeps a client's bucket as tokenbucket.lua
// keeps it in Redis, to the bit, over timelines of calls a few ms apart,
// mixed costs (peeks and costs above the capacity among them), most of them
// denied, on plans whose rates have no short binary form among others.
// Redis's clock is read before and after each call: a call that wrote ran
// at the ts it wrote, and for one that wrote nothing, some microsecond
// between the two readings must give the script's result. The bucket is
// then compared with what Redis holds.
func TestBucketIsTheScripts(t *testing.T) {
	ctx := context.Background()
	rdb := redisproc.StartT(t, redisproc.Options{}).Client(t)
	rng := rand.New(rand.NewPCG(7, 8))
	micros := func() int64 {
		t.Helper()
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMicro()
	}
	state := func(key string) [2]string {
		t.Helper()
		v, err := rdb.HMGet(ctx, key, "tokens", "ts").Result()
		if err != nil {
			t.Fatal(err)
		}
		var s [2]string
		for i := range s {
			if v[i] != nil {
				s[i] = v[i].(string)
			}
		}
		return s
	}
	var calls, written, refilledDenials int
	for i, l := range []lua.Limit{{Capacity: 7, Rate: 10.0 / 3}, {Capacity: 10, Rate: 0.2}, {Capacity: 5, Rate: 100}, {Capacity: 10, Rate: 1000}} {
		key := "bucket-" + strconv.Itoa(i)
		b := NewBucket(l.Capacity, l.Rate)
		costs := []int64{0, 1, 1, 2, 3, 5, int64(l.Capacity) + 1}
		for range 300 {
			cost := costs[rng.IntN(len(costs))]
			before := state(key)
			lo := micros()
			got, err := lua.Take(ctx, rdb, key, l, cost)
			if err != nil {
				t.Fatal(err)
			}
			hi := micros()
			after := state(key)
			calls++
			if after != before {
				// It wrote: it ran at the ts it wrote.
				written++
				now, err := strconv.ParseInt(after[1], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				want := b.Take(now, cost)
				if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
					t.Fatalf("%+v, cost %d at %d us:\nscript %+v\nmodel  %+v", l, cost, now, got, want)
				}
			} else {
				if !got.Allowed && !got.Never && b.written && got.Tokens < l.Capacity {
					refilledDenials++
				}
				found := false
				for now := lo; now <= hi && !found; now++ {
					m := *b
					found = fmt.Sprintf("%+v", m.Take(now, cost)) == fmt.Sprintf("%+v", got) && m == *b
				}
				if !found {
					t.Fatalf("%+v, cost %d between %d and %d us: the script gave %+v, the model nothing alike (bucket %+v)", l, cost, lo, hi, got, *b)
				}
			}
			if b.written {
				if want := [2]string{strconv.FormatFloat(b.tokens, 'g', 17, 64), strconv.FormatInt(b.ts, 10)}; after != want {
					t.Fatalf("%+v: Redis holds %q, the model %q", l, after, want)
				}
			} else if after != [2]string{} {
				t.Fatalf("%+v: Redis holds %q, the model nothing", l, after)
			}
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		}
	}
	t.Logf("%d calls, %d written, %d denials of a bucket refilled since its last write", calls, written, refilledDenials)
	if written < 50 || refilledDenials < 200 {
		t.Errorf("the timelines did not exercise both: %d written, %d denials of a refilled bucket", written, refilledDenials)
	}
}
