package sidecaranswer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/lua"
)

// TestScriptResultIsTheScripts: the model of the script
// (scriptResult, which every answer of Check is made from) answers as
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
		want := scriptResult(c.capacity, c.rate, c.tokens, c.cost)
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Errorf("%+v:\nscript %+v\nmodel  %+v", c, got, want)
		}
	}
}
