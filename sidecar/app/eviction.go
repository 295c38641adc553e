package app

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/internal/tick"
)

// evictionCheckEvery is how often the sidecar reads Redis's memory
// settings: at start, then this often, so that a Redis restarted or
// replaced with other settings, or changed by CONFIG SET, is seen.
const evictionCheckEvery = time.Minute

// evictionSettings are what decides whether Redis may evict a bucket.
type evictionSettings struct {
	maxmemory string // bytes, "0": no limit
	policy    string
}

// evicts reports whether Redis, when full, removes keys: a bucket so
// removed starts over full, and its client is admitted up to one capacity
// more than its plan. noeviction refuses the writes instead (the checks
// that would admit fail open, README.md "When something fails").
func (e evictionSettings) evicts() bool {
	return e.maxmemory != "0" && e.policy != "noeviction"
}

// fullCoverageWarning is logged for a Cluster master that runs
// cluster-require-full-coverage yes, Redis's default.
const fullCoverageWarning = "redis cluster refuses every command while any master is down: with cluster-require-full-coverage yes, a master lost makes every check fail open until its replica takes over, not just its own clients'; set it to no on every node (sidecar/README.md)"

// watchEviction reads each master's maxmemory and maxmemory-policy (INFO
// memory) now and every evictionCheckEvery until ctx ends, and logs a
// warning when a master may evict buckets, once per master and setting:
// again only after the settings changed. A user without +info (the ACL
// SECURITY.md gives) is told once, at debug level, and not asked again.
// On a Redis Cluster it reads each master's cluster-require-full-coverage
// (CONFIG GET) too, after INFO answered, and warns the same way of a
// master that runs yes; a user without +config|get is told once at debug
// level.
func (a *App) watchEviction(ctx context.Context, redisURL string) {
	var mu sync.Mutex
	last := map[string]evictionSettings{}
	coverage := map[string]string{} // cluster-require-full-coverage by master
	var configDenied atomic.Bool
	// check reads every master's settings; it says whether to go on, and
	// whether every master answered.
	check := func() (goOn, answered bool) {
		var denied, failed atomic.Bool
		err := forEachMaster(ctx, a.client, func(ctx context.Context, node string, c *redis.Client) {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			info, err := c.Info(cctx, "memory").Result()
			if err != nil {
				failed.Store(true)
				if strings.HasPrefix(err.Error(), "NOPERM") && denied.CompareAndSwap(false, true) {
					a.log.Debug("cannot read Redis's eviction policy (INFO memory)", "redis", redisURL, "err", err)
				}
				return
			}
			s := evictionSettings{maxmemory: infoField(info, "maxmemory"), policy: infoField(info, "maxmemory_policy")}
			mu.Lock()
			prev, seen := last[node]
			last[node] = s
			mu.Unlock()
			if s.evicts() && (!seen || prev != s) {
				a.log.Warn("redis evicts keys when full: a bucket evicted starts over full, and its client is admitted up to one capacity more than its plan; give Redis the memory for every active client's bucket (about 211 bytes each), or set maxmemory-policy noeviction to fail open instead (SECURITY.md)",
					"redis", redisURL, "node", node, "maxmemory", s.maxmemory, "maxmemory_policy", s.policy)
			}
			if node == "" || configDenied.Load() {
				return // one server, or a user that may not read it
			}
			v, err := c.ConfigGet(cctx, "cluster-require-full-coverage").Result()
			var refused redis.Error
			switch {
			case errors.As(err, &refused):
				// NOPERM, or a managed Redis without CONFIG: not asked again.
				if configDenied.CompareAndSwap(false, true) {
					a.log.Debug("cannot read Redis Cluster's cluster-require-full-coverage (CONFIG GET)", "redis", redisURL, "err", err)
				}
				return
			case err != nil:
				failed.Store(true)
				return
			}
			full := v["cluster-require-full-coverage"]
			mu.Lock()
			prevFull, seenFull := coverage[node]
			coverage[node] = full
			mu.Unlock()
			if full == "yes" && (!seenFull || prevFull != full) {
				a.log.Warn(fullCoverageWarning, "redis", redisURL, "node", node, "cluster_require_full_coverage", full)
			}
		})
		return !denied.Load(), err == nil && !failed.Load()
	}
	// Once a second until Redis has answered (it may not be up yet), then
	// every evictionCheckEvery.
	goOn, answered := check()
	if goOn && !answered {
		tick.Every(ctx, time.Second, func() bool {
			goOn, answered = check()
			return goOn && !answered
		})
	}
	if !goOn || !answered {
		return
	}
	tick.Every(ctx, evictionCheckEvery, func() bool {
		goOn, _ := check()
		return goOn
	})
}

// forEachMaster calls f with a client of each master and its address: the
// one server ("", the URL names it), or every master of a Redis Cluster.
// Through Sentinel the failover client talks to the master.
func forEachMaster(ctx context.Context, c redis.UniversalClient, f func(ctx context.Context, node string, c *redis.Client)) error {
	switch c := c.(type) {
	case *redis.Client:
		f(ctx, "", c)
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			f(ctx, m.Options().Addr, m)
			return nil
		})
	}
	return nil
}

// infoField is the value of name in an INFO reply, "" if absent.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
