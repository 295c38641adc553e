package lua_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/lua"
)

func ExampleTake() {
	ctx := context.Background()
	srv, err := redisproc.Start(ctx, redisproc.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()

	// 10 tokens, one back every 10,000 s: refill is invisible at 3 decimals.
	plan := lua.Limit{Capacity: 10, Rate: 0.0001}
	for _, cost := range []int64{4, 4, 4, 11} {
		r, err := lua.Take(ctx, c, "bucket:client-digest", plan, cost)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("cost %2d: allowed=%-5v never=%-5v tokens=%.3f retry=%v\n",
			cost, r.Allowed, r.Never, r.Tokens, r.RetryAfter.Round(time.Minute))
	}
	// Output:
	// cost  4: allowed=true  never=false tokens=6.000 retry=0s
	// cost  4: allowed=true  never=false tokens=2.000 retry=0s
	// cost  4: allowed=false never=false tokens=2.000 retry=5h33m0s
	// cost 11: allowed=false never=true  tokens=2.000 retry=0s
}
