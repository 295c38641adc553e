// Package hot splits the bucket of a hot client into one bucket per region,
// each on its own Redis Cluster slot, and keeps their shares of the plan in
// step with where the client's demand comes from.
//
// A hot client (marked in the plans file with a list of regions) gets one
// bucket per region. Region i of k lives under a hash tag chosen so that its
// slot is the middle of the i-th of k equal slices of the slot space; on a
// cluster whose slots are split into even contiguous ranges (what
// `redis-cli --cluster create` does) with at least k masters, every region's
// bucket is on a different master. Each bucket gets share_i of the plan's
// capacity and rate; the shares always sum to 1.
//
// Every sidecar counts the demand it sees per region (tokens asked for) and
// adds it to a hash in Redis once per interval. One sidecar at a time, the
// holder of a short lease (SET NX PX, renewed by its holder), reads and
// clears that hash, moves the shares toward the regions' demand, and writes
// them to Redis; every sidecar reads the shares from Redis at its first
// check of a client and once per interval after, so they all use the same.
// A reload that marks a client hot, unmarks it or changes its regions
// carries the tokens of its old buckets to its new ones (Carry).
// See RATIONALE.md, "Why is a hot client split by region, and how?".
package hot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/tick"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/faillog"
)

// Defaults and tuning of the reconciler.
const (
	// DefaultInterval is how often demand is flushed and shares reconciled.
	DefaultInterval = time.Second
	// Floor is the smallest share a region gets, so a region whose demand
	// returns is never left with nothing while the shares catch up; with
	// more than two regions, FloorTotal over k (FloorOf).
	Floor = 0.02
	// FloorTotal bounds what the floors of all a client's regions add up
	// to: the part of the plan its quiet regions keep, refilling tokens
	// nobody asks for. 2% each would be 30% of the plan for a client of 16
	// regions whose traffic all comes from one; 4% keeps that client
	// within the 5% its limit is held to.
	FloorTotal = 0.04
	// Step is how far the shares move toward the demand's split each
	// interval (1 would jump; smaller damps noise in one second's counts).
	Step = 0.5
	// leaseIntervals is the lease's lifetime in intervals: a dead holder is
	// replaced after at most this long.
	leaseIntervals = 3
	// idleAfter drops a client's state when no check used it for this long
	// (it left the hot list, or stopped sending).
	idleAfter = time.Minute
)

// start is when the package was loaded: sinceStart reads the monotonic
// clock from it, so that a step of the wall clock (an NTP correction, a
// VM resumed) neither drops every hot client's state at once nor keeps an
// idle one, and reconciles it, for as long as the clock went back.
var start = time.Now()

func sinceStart() int64 { return int64(time.Since(start)) }

// Sharder routes hot clients' checks to their region buckets and runs the
// reconciler. It is safe for concurrent use.
type Sharder struct {
	client redis.UniversalClient
	id     string // this sidecar's lease identity
	log    *slog.Logger
	mu     sync.Mutex // serialises creating a state
	states sync.Map   // base bucket key → *state
	// OnReconcileError, if set before Run, is called for each hot
	// client's reconcile that failed (its shares in force kept).
	OnReconcileError func()
	failLog          faillog.Log
}

// New returns a Sharder on client. Call Run to reconcile.
func New(client redis.UniversalClient, log *slog.Logger) *Sharder {
	if log == nil {
		log = slog.Default()
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	// Now, not at the first check of a hot client, whose deadline it would
	// take.
	suffixes()
	return &Sharder{client: client, id: hex.EncodeToString(b[:]), log: log, failLog: faillog.Log{Every: reconcileLogEvery}}
}

// state is one hot client's split as this sidecar knows it.
type state struct {
	base     string   // the client's plain bucket key, "rl:{digest}"
	regions  []string // as in the plans file
	joined   string   // regions joined by ",", to detect a changed list
	keys     []string // bucket key per region
	shares   atomic.Pointer[[]float64]
	demand   []atomic.Int64 // tokens asked per region since the last flush
	lastUsed atomic.Int64   // sinceStart() at its last check
}

// Route returns the bucket key and limit for a check of cost by the hot
// client whose plain bucket key is base, arriving from region. A region not
// in regions (or empty) counts as the first. A cost above the region's
// share of the capacity, which its bucket could never hold, goes to the
// bucket of the region with the largest share instead, when that one can
// hold it: a region the client has been quiet in keeps only the floor
// share, 2% (4 tokens of a capacity of 200), and the plan's other tokens
// are in the other buckets. The demand still counts for the region the
// check came from. It touches Redis only for the first check of a client
// this sidecar has not seen (or not for a minute), to read the shares in
// force, until deadline at the latest.
func (s *Sharder) Route(deadline time.Time, base string, regions []string, region []byte, l lua.Limit, cost int64) (string, lua.Limit) {
	st := s.state(deadline, base, regions)
	i := 0
	for j, r := range st.regions {
		if r == string(region) {
			i = j
			break
		}
	}
	st.demand[i].Add(cost)
	st.lastUsed.Store(sinceStart())
	shares := *st.shares.Load()
	if float64(cost) > l.Capacity*shares[i] {
		largest := i
		for j, sh := range shares {
			if sh > shares[largest] {
				largest = j
			}
		}
		if float64(cost) <= l.Capacity*shares[largest] {
			i = largest
		}
	}
	return st.keys[i], lua.Limit{Capacity: l.Capacity * shares[i], Rate: l.Rate * shares[i]}
}

// Keys returns the bucket key of each region of a hot client, in the order
// of regions.
func Keys(base string, regions []string) []string {
	digest := strings.TrimSuffix(strings.TrimPrefix(base, "rl:{"), "}")
	out := make([]string, len(regions))
	for i, r := range regions {
		target := (2*i + 1) * SlotCount / (2 * len(regions))
		out[i] = regionKey(digest, r, target)
	}
	return out
}

// regionKey returns "rl:{digest.region.N}" with the smallest N whose slot is
// target, below maxSuffix; the nearest slot found is the fallback. The CRC
// of the common prefix is computed once. CRC16 is linear: the CRC of the
// prefix and N is the prefix's CRC run over as many zero bytes, xor N's
// own CRC; so the N of each length whose slot is target is looked up in a
// table (suffixes) of the smallest N of that length for each slot, and the
// shortest length that has one holds the smallest N. Trying N one by one
// took about 16,000 tries a region, 3 to 19 ms for a client of 2 to 16
// regions on a shared machine, beyond the 4 ms a check has: the first
// check of a 16-region client was answered 503, and the ones after it
// decided at equal shares, its region's bucket cut to a sixteenth.
func regionKey(digest, region string, target int) string {
	prefix := digest + "." + region + "."
	pc := crc16Update(0, prefix)
	tab := suffixes()
	z := pc
	for l := range tab {
		z = crc16Update(z, "\x00")
		if n := tab[l][(uint16(target)^z)%SlotCount]; n > 0 {
			return "rl:{" + prefix + strconv.Itoa(int(n-1)) + "}"
		}
	}
	var buf [20]byte
	best, bestDist := 0, SlotCount
	for n := 0; n < maxSuffix; n++ {
		d := int(crc16Update(pc, string(strconv.AppendInt(buf[:0], int64(n), 10))))%SlotCount - target
		if d < 0 {
			d = -d
		}
		if d < bestDist {
			best, bestDist = n, d
		}
	}
	return "rl:{" + prefix + strconv.Itoa(best) + "}"
}

// maxSuffix bounds N in a region's key; its decimal digits bound the
// suffix tables' lengths.
const (
	maxSuffix       = 1 << 20
	maxSuffixDigits = 7
)

// suffixes returns, for each length l+1 of N in decimal, the smallest N
// below maxSuffix plus 1 whose own CRC16 (from 0) is each slot, modulo
// SlotCount; 0 where none is. Built once (about 1M CRCs of 7 bytes at
// most, 450 KB), by New or the first Keys.
var suffixes = sync.OnceValue(func() *[maxSuffixDigits][SlotCount]int32 {
	var t [maxSuffixDigits][SlotCount]int32
	var buf [20]byte
	for n := 0; n < maxSuffix; n++ {
		d := strconv.AppendInt(buf[:0], int64(n), 10)
		slot := crc16Update(0, string(d)) % SlotCount
		if t[len(d)-1][slot] == 0 {
			t[len(d)-1][slot] = int32(n + 1)
		}
	}
	return &t
})

func (s *Sharder) state(deadline time.Time, base string, regions []string) *state {
	if v, ok := s.states.Load(base); ok {
		st := v.(*state)
		if slices.Equal(st.regions, regions) {
			return st
		}
	}
	// Finding the keys takes a fraction of a millisecond; under a burst of
	// first checks one goroutine does it and the others take its result.
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.states.Load(base); ok {
		st := v.(*state)
		if slices.Equal(st.regions, regions) {
			return st
		}
	}
	st := &state{
		base:    base,
		regions: regions,
		joined:  strings.Join(regions, ","),
		keys:    Keys(base, regions),
		demand:  make([]atomic.Int64, len(regions)),
	}
	// The shares in force are in Redis, where the other sidecars put them
	// (or this one before it forgot an idle client). Equal shares until the
	// next tick would decide this client's checks at 1/k of the plan for
	// up to a second, and the first of them would cut its region's bucket
	// to 1/k of the capacity, a burst it was owed lost. They are read once
	// here, within the check's deadline; equal shares only when there are
	// none yet, or Redis does not answer in time.
	shares := equal(len(regions))
	if s.client != nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		if fields, err := s.client.HGetAll(ctx, sharesKey(base)).Result(); err == nil {
			if read, ok := parseShares(fields, regions, st.joined); ok {
				shares = read
			}
		}
		cancel()
	}
	st.shares.Store(&shares)
	st.lastUsed.Store(sinceStart())
	s.states.Store(base, st)
	return st
}

func equal(k int) []float64 {
	out := make([]float64, k)
	for i := range out {
		out[i] = 1 / float64(k)
	}
	return out
}

// Shares returns the shares this sidecar uses now for the hot client with
// plain bucket key base, or nil if it has seen no check of it.
func (s *Sharder) Shares(base string) []float64 {
	v, ok := s.states.Load(base)
	if !ok {
		return nil
	}
	return append([]float64(nil), *v.(*state).shares.Load()...)
}

// Run reconciles every interval (DefaultInterval if <= 0) until ctx ends.
// The failures of a round are logged together, in one line naming how
// many hot clients failed, the first of them and its error: the first
// round that fails at once, then at most one line every reconcileLogEvery
// with the failures held back since, and the end once a round succeeds
// reconcileLogEvery after the last failure. One line per hot client and
// round was 16 lines a second with 50 hot clients while Redis was down.
func (s *Sharder) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	tick.Every(ctx, interval, func() bool {
		var failed, clients int64
		var first string
		var firstErr error
		s.states.Range(func(k, v any) bool {
			st := v.(*state)
			if sinceStart()-st.lastUsed.Load() > int64(idleAfter) {
				s.states.CompareAndDelete(k, v)
				return true
			}
			clients++
			tctx, cancel := context.WithTimeout(ctx, interval)
			if err := s.tick(tctx, st, interval); err != nil {
				// The line names one client and its error: the first,
				// unless its error is only a timeout and a later one says
				// more (a refused connection, Redis's reply).
				if failed++; failed == 1 || errors.Is(firstErr, context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
					first, firstErr = st.base[4:20], err
				}
				if s.OnReconcileError != nil {
					s.OnReconcileError()
				}
			}
			cancel()
			return true
		})
		now := time.Now()
		if failed == 0 {
			if held, ended := s.failLog.Succeeded(now); ended {
				s.log.Info("hot client reconciles succeed again", "failed_unlogged", held)
			}
		} else if held, log := s.failLog.Failed(now, failed); log {
			s.log.Warn("hot client reconcile failed; shares in force kept", "failed", failed, "hot_clients", clients,
				"client", first, "err", firstErr, "failed_unlogged", held)
		}
		return true
	})
}

// reconcileLogEvery is the least time between two lines about failed
// reconciles.
const reconcileLogEvery = 10 * time.Second

// Redis keys of a hot client's coordination state. They share the plain
// bucket's hash tag, so on a cluster they live on one slot together.
func demandKey(base string) string { return base + ":hot:demand" }
func sharesKey(base string) string { return base + ":hot:shares" }
func leaseKey(base string) string  { return base + ":hot:lease" }

// regionsField holds the region list the shares were computed for.
const regionsField = "_regions"

// renewLease extends the lease only if this sidecar still holds it.
var renewLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

// tick flushes this sidecar's demand counts, reconciles if it holds the
// lease, and reads the shares in force.
func (s *Sharder) tick(ctx context.Context, st *state, interval time.Duration) error {
	pipe := s.client.Pipeline()
	dk := demandKey(st.base)
	for i, r := range st.regions {
		if n := st.demand[i].Swap(0); n > 0 {
			pipe.HIncrBy(ctx, dk, r, n)
		}
	}
	pipe.PExpire(ctx, dk, 10*interval)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}

	leaseTTL := leaseIntervals * interval
	held, err := s.client.SetNX(ctx, leaseKey(st.base), s.id, leaseTTL).Result()
	if err != nil {
		return err
	}
	if !held {
		n, err := renewLease.Run(ctx, s.client, []string{leaseKey(st.base)}, s.id, leaseTTL.Milliseconds()).Int64()
		if err != nil {
			return err
		}
		held = n == 1
	}
	if held {
		if err := s.reconcile(ctx, st); err != nil {
			return err
		}
	}

	fields, err := s.client.HGetAll(ctx, sharesKey(st.base)).Result()
	if err != nil {
		return err
	}
	if shares, ok := parseShares(fields, st.regions, st.joined); ok {
		st.shares.Store(&shares)
	}
	return nil
}

// reconcile takes the demand counted since the last reconcile and moves the
// shares toward it.
func (s *Sharder) reconcile(ctx context.Context, st *state) error {
	tx := s.client.TxPipeline()
	got := tx.HGetAll(ctx, demandKey(st.base))
	tx.Del(ctx, demandKey(st.base))
	cur := tx.HGetAll(ctx, sharesKey(st.base))
	if _, err := tx.Exec(ctx); err != nil {
		return err
	}
	old, ok := parseShares(cur.Val(), st.regions, st.joined)
	if !ok {
		old = equal(len(st.regions))
	}
	demand := make([]float64, len(st.regions))
	for i, r := range st.regions {
		demand[i], _ = strconv.ParseFloat(got.Val()[r], 64)
	}
	next := Reconcile(old, demand)
	fields := make([]any, 0, 2*len(next)+2)
	fields = append(fields, regionsField, st.joined)
	for i, r := range st.regions {
		fields = append(fields, r, strconv.FormatFloat(next[i], 'g', -1, 64))
	}
	pipe := s.client.Pipeline()
	pipe.HSet(ctx, sharesKey(st.base), fields...)
	// Shares of a client that went quiet are not worth keeping forever.
	pipe.Expire(ctx, sharesKey(st.base), 24*time.Hour)
	_, err := pipe.Exec(ctx)
	return err
}

// FloorOf is the smallest share a region of a client with k regions gets:
// Floor, or FloorTotal / k when that is less.
func FloorOf(k int) float64 { return min(Floor, FloorTotal/float64(k)) }

// Reconcile returns the shares after one step from old toward the split of
// demand: target_i = f + (1 - k*f) * demand_i / sum(demand) with f =
// FloorOf(k), and next = old + Step*(target - old). With no demand the
// shares stay. The result sums to 1 and no share is below f once old
// respects it.
func Reconcile(old, demand []float64) []float64 {
	k := len(old)
	floor := FloorOf(k)
	var total float64
	for _, d := range demand {
		if d > 0 {
			total += d
		}
	}
	next := append([]float64(nil), old...)
	if total <= 0 {
		return next
	}
	var sum float64
	for i := range next {
		target := floor + (1-float64(k)*floor)*math.Max(demand[i], 0)/total
		next[i] = old[i] + Step*(target-old[i])
		sum += next[i]
	}
	for i := range next {
		next[i] /= sum
	}
	return next
}

// parseShares reads the shares hash. It accepts it only if it was written
// for exactly these regions and every share is a number in (0, 1]; the
// shares are renormalised so rounding in the decimal text cannot make them
// sum to more than the plan.
func parseShares(fields map[string]string, regions []string, joined string) ([]float64, bool) {
	if fields[regionsField] != joined {
		return nil, false
	}
	out := make([]float64, len(regions))
	var sum float64
	for i, r := range regions {
		v, err := strconv.ParseFloat(fields[r], 64)
		if err != nil || !(v > 0) || v > 1 {
			return nil, false
		}
		out[i] = v
		sum += v
	}
	for i := range out {
		out[i] /= sum
	}
	return out, true
}
