package hot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Layout is how a client's bucket is laid out under one plans file: one
// bucket (Regions nil) or one per region, on a plan of Capacity tokens
// refilling at Rate a second.
type Layout struct {
	Regions  []string
	Capacity float64
	Rate     float64
}

func (l Layout) joined() string { return strings.Join(l.Regions, ",") }

// layoutKey holds the region list of the layout a client's tokens were last
// carried to ("" for one bucket), so that of the sidecars that load the
// same change one carries them, once.
func layoutKey(base string) string { return base + ":hot:layout" }

// layoutTTL is how long layoutKey is kept; past it a change is carried
// from the layout the carrying sidecar had in force.
const layoutTTL = 24 * time.Hour

// markLayout sets the layout a client's tokens are in to ARGV[2] unless it
// is that already; the layout they were in (ARGV[1] if none is recorded)
// is returned, nil when there is nothing to carry.
var markLayout = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then cur = ARGV[1] end
if cur == ARGV[2] then return false end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return {cur}`)

// takeTokens returns what a bucket of capacity ARGV[1] refilling at ARGV[2]
// holds now (full when it has no state), as the bucket script reckons it,
// and leaves it empty: the tokens go to the client's other layout.
var takeTokens = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = capacity
local stored, ts = tonumber(s[1]), tonumber(s[2])
if stored and ts and stored == stored and ts == ts then
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end
  tokens = math.min(capacity, stored + elapsed * rate / 1000000)
end
redis.call('HSET', KEYS[1], 'tokens', '0', 'ts', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(capacity / rate * 1000) + 1000))
return string.format('%.17g', tokens)`)

// putTokens sets a bucket of capacity ARGV[2] refilling at ARGV[3] to hold
// ARGV[1] tokens now, with the bucket script's expiry; a full bucket is
// one with no state.
var putTokens = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tokens, capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tokens >= capacity then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 'tokens', ARGV[1], 'ts', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(capacity / rate * 1000) + 1000))
return 1`)

// Carry moves the tokens of the client whose plain bucket key is base from
// the buckets of layout from to those of layout to, when a plans file
// marks it hot, unmarks it or changes its regions: without it the new
// buckets, never used or refilled while unused, start full, and the
// client is given a fresh burst of its capacity at every change. The
// tokens the old buckets hold now (each region's at its share in force)
// are summed, capped at to's capacity, and split by the shares the
// sidecars will use for to (those in Redis for its regions, else equal);
// the old buckets are left empty. Of the sidecars loading the same change,
// the first to reach Redis carries and the others find it done (carried
// false); the layout last carried to is kept in Redis for a day and, when
// known, is the one carried from, whatever this sidecar had in force.
func Carry(ctx context.Context, c redis.UniversalClient, base string, from, to Layout) (carried bool, tokens float64, err error) {
	if !(from.Capacity > 0 && from.Rate > 0 && to.Capacity > 0 && to.Rate > 0) {
		return false, 0, errors.New("hot: carry between layouts without a capacity and rate")
	}
	res, err := markLayout.Run(ctx, c, []string{layoutKey(base)}, from.joined(), to.joined(), int64(layoutTTL/time.Second)).Slice()
	if errors.Is(err, redis.Nil) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("mark layout: %w", err)
	}
	cur, _ := res[0].(string)
	if cur != from.joined() {
		from.Regions = nil
		if cur != "" {
			from.Regions = strings.Split(cur, ",")
		}
	}
	fields, err := c.HGetAll(ctx, sharesKey(base)).Result()
	if err != nil {
		return false, 0, fmt.Errorf("read shares: %w", err)
	}
	srcKeys, srcShares := layoutBuckets(base, from, fields)
	for i, k := range srcKeys {
		capacity, rate := from.Capacity*srcShares[i], from.Rate*srcShares[i]
		v, err := takeTokens.Run(ctx, c, []string{k}, exact(capacity), exact(rate)).Text()
		if err != nil {
			return false, 0, fmt.Errorf("take tokens: %w", err)
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return false, 0, fmt.Errorf("take tokens: %q: %w", v, err)
		}
		tokens += n
	}
	tokens = min(tokens, to.Capacity)
	dstKeys, dstShares := layoutBuckets(base, to, fields)
	for i, k := range dstKeys {
		sh := dstShares[i]
		if err := putTokens.Run(ctx, c, []string{k}, exact(tokens*sh), exact(to.Capacity*sh), exact(to.Rate*sh)).Err(); err != nil {
			return false, 0, fmt.Errorf("put tokens: %w", err)
		}
	}
	return true, tokens, nil
}

// layoutBuckets returns the bucket keys of layout l and the share of the
// plan each holds: the shares hash's when it was written for l's regions.
func layoutBuckets(base string, l Layout, shares map[string]string) ([]string, []float64) {
	if len(l.Regions) == 0 {
		return []string{base}, []float64{1}
	}
	sh, ok := parseShares(shares, l.Regions, l.joined())
	if !ok {
		sh = equal(len(l.Regions))
	}
	return Keys(base, l.Regions), sh
}

func exact(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
