package main

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/e2e/harness"
)

// redisSample is Redis's memory and key count at a moment.
type redisSample struct {
	At         time.Duration // since the clients went idle
	Keys       int64
	UsedMemory int64
}

// redisResult is what the idle-expiry run saw.
type redisResult struct {
	Baseline   redisSample // before any client
	Active     redisSample // right after every client was checked once
	Samples    []redisSample
	EmptyAfter time.Duration // from idle until no key was left; 0 if never
	Statuses   map[int]int
}

// soakRedis checks clients distinct clients once each, then watches the
// bucket keys expire once the clients are idle.
func soakRedis(ctx context.Context, bins harness.Binaries, dir string, clients, workers int, watch time.Duration) (*redisResult, error) {
	// capacity 20 at 2 tokens/s: a bucket is full again 10 s after its
	// last check, and the script sets its TTL to that plus 1 s, long
	// enough for every client to have been seen before the first expires.
	sc, err := startSidecar(ctx, bins, dir, "default_plan: p\nplans:\n  p: {capacity: 20, rate: 2}\n")
	if err != nil {
		return nil, err
	}
	defer sc.stop()
	rc := redis.NewClient(&redis.Options{Addr: sc.redis.Addr})
	defer rc.Close()
	read := func(at time.Duration) (redisSample, error) {
		n, err := rc.DBSize(ctx).Result()
		if err != nil {
			return redisSample{}, err
		}
		info, err := rc.Info(ctx, "memory").Result()
		if err != nil {
			return redisSample{}, err
		}
		used, err := strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
		return redisSample{At: at, Keys: n, UsedMemory: used}, err
	}
	res := &redisResult{}
	if res.Baseline, err = read(0); err != nil {
		return nil, err
	}
	res.Statuses, err = checkKeys(sc.addr, "idle-client-", 0, clients, workers, clients, func(int) error { return nil })
	if err != nil {
		return nil, err
	}
	idle := time.Now()
	if res.Active, err = read(0); err != nil {
		return nil, err
	}
	for time.Since(idle) < watch {
		time.Sleep(time.Second)
		s, err := read(time.Since(idle))
		if err != nil {
			return nil, err
		}
		res.Samples = append(res.Samples, s)
		if s.Keys == 0 {
			res.EmptyAfter = s.At
			break
		}
	}
	return res, nil
}

// infoField returns the value of "name:value" in an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
