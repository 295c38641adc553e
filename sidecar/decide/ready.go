package decide

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/lua"
)

// Readiness defaults.
const (
	DefaultReadyTimeout = 250 * time.Millisecond
	DefaultReadyCache   = time.Second
)

// Ready reports whether decisions can be made now: Redis answers and holds
// the script (every shard of a cluster). A missing script is loaded, since a
// Redis that restarted empty is otherwise healthy. The answer is cached for
// DefaultReadyCache so that frequent probes cost Redis almost nothing, and a
// check is bounded by DefaultReadyTimeout.
func (d *Decider) Ready(ctx context.Context) error {
	d.ready.mu.Lock()
	defer d.ready.mu.Unlock()
	if now := time.Now(); now.Before(d.ready.until) {
		return d.ready.err
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultReadyTimeout)
	defer cancel()
	err := d.checkScript(ctx)
	if err == nil {
		err = d.checkConns()
	}
	d.ready.err, d.ready.until = err, time.Now().Add(DefaultReadyCache)
	return err
}

// checkConns reports whether the connections Options.WarmConns asks for
// are open: the client dials them ahead of need (redisconn.Tuning's
// MinIdleConns), and until it has, a decision could spend its few
// milliseconds on a dial and a TLS handshake.
func (d *Decider) checkConns() error {
	if n := d.client.PoolStats().TotalConns; n < uint32(d.opt.WarmConns) {
		return fmt.Errorf("redis: %d of %d connections open", n, d.opt.WarmConns)
	}
	return nil
}

type readyCache struct {
	mu    sync.Mutex
	until time.Time
	err   error
}

func (d *Decider) checkScript(ctx context.Context) error {
	sha := lua.Script.Hash()
	exists, err := d.client.ScriptExists(ctx, sha).Result()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if len(exists) == 1 && exists[0] {
		return nil
	}
	got, err := d.client.ScriptLoad(ctx, lua.Source).Result()
	if err != nil {
		return fmt.Errorf("redis: load script: %w", err)
	}
	if got != sha {
		return fmt.Errorf("redis: loaded script has sha1 %s, want %s", got, sha)
	}
	return nil
}
