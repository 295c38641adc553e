package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// Readiness defaults.
const (
	DefaultReadyTimeout = 250 * time.Millisecond
	DefaultReadyCache   = time.Second
)

// Ready reports whether decisions can be made now: Redis answers and holds
// the script (every shard of a cluster), and runs it on a bucket key as a
// check does (peek). A missing script is loaded, since a Redis that
// restarted empty is otherwise healthy. The answer is cached for
// DefaultReadyCache so that frequent probes cost Redis almost nothing, and a
// check is bounded by DefaultReadyTimeout. The first time Redis is ready it
// also opens the warm connections (warm).
func (d *Decider) Ready(ctx context.Context) error {
	d.ready.mu.Lock()
	defer d.ready.mu.Unlock()
	if now := time.Now(); now.Before(d.ready.until) {
		return d.ready.err
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultReadyTimeout)
	defer cancel()
	err := d.checkScript(ctx)
	if err == nil && !d.ready.warmed {
		if err = d.warm(ctx); err == nil {
			d.ready.warmed = true
		}
	}
	if err == nil {
		err = d.peek(ctx)
	}
	if err == nil {
		err = d.refusedLately(time.Now())
	}
	d.ready.err, d.ready.until = err, time.Now().Add(DefaultReadyCache)
	return err
}

// warm opens Options.WarmConns connections at once and sends a PING on
// each, so that each is dialed, through its TLS handshake and
// authenticated before a decision needs it: go-redis does all three
// lazily, on a connection's first command, which would spend a decision's
// few milliseconds. Only a single-node client can hold several
// connections at once (a cluster client keeps a pool per node and warms
// each on its first use). On a single server the decisions go over the
// sidecar's own connection instead, which is dialed and authenticated
// here (direct.warm), with no PING.
func (d *Decider) warm(ctx context.Context) error {
	if d.direct != nil {
		if d.opt.WarmConns <= 0 {
			return nil
		}
		return d.direct.warm(ctx)
	}
	c, ok := d.client.(*redis.Client)
	if !ok || d.opt.WarmConns <= 0 {
		return nil
	}
	conns := make([]*redis.Conn, d.opt.WarmConns)
	defer func() {
		for _, cn := range conns {
			if cn != nil {
				cn.Close()
			}
		}
	}()
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: warm connection %d of %d: %w", i+1, len(conns), err)
		}
	}
	return nil
}

// peekLimit is the plan a peek is made with: any plan does, as a peek
// (cost 0) takes nothing and writes nothing.
var peekLimit = lua.Limit{Capacity: 1, Rate: 1}

// peek makes one decision the way every check is made (the queue, a
// batch, the connection's writer and reader, the reply's parsing, the
// script in Redis on a bucket key): a peek (cost 0) at keys.WarmBucket,
// which writes nothing. Redis refusing it (an error reply: an ACL user
// without the bucket keys, say, whose SCRIPT EXISTS succeeds while every
// EVALSHA answers NOPERM) means no check can be decided, and is returned.
// A peek without an answer in time is not: Redis has just answered
// checkScript, and a slow decision is the checks' 503, not a reason to
// take the proxy out of service. The first peek also warms the path, so
// that a client's first check does not pay for its first run inside the
// gateway's 5 ms: on a fresh sidecar the first decision took 0.8-1.4 ms
// where later ones took 0.4-0.7 (the repository's RATIONALE.md, "What
// does a fresh stack's first burst cost?").
func (d *Decider) peek(ctx context.Context) error {
	deadline, _ := ctx.Deadline() // Ready's, which always has one
	_, err := d.Decide(deadline, keys.WarmBucket, peekLimit, 0)
	if reply := redis.Error(nil); errors.As(err, &reply) {
		return fmt.Errorf("redis: a decision: %w", err)
	}
	return nil
}

// refusalMemory is how long a check refused by Redis, with none admitted
// since, keeps Ready saying no. The checks keep it fresh while they keep
// being refused; once they stop coming, Ready goes back to its peek.
const refusalMemory = 5 * time.Second

// Refused returns Redis's error reply to the latest check that took
// tokens, if it came within refusalMemory and no check was admitted since:
// Redis answers peeks but refuses the writes every admission makes. nil
// otherwise.
func (d *Decider) Refused() error { return d.refusedAt(time.Now()) }

// refusedAt is Refused as of now.
func (d *Decider) refusedAt(now time.Time) error {
	if r := d.refused.Load(); r != nil && now.Sub(r.at) < refusalMemory {
		return r.err
	}
	return nil
}

// refusedLately returns, as not ready, Redis's error reply to the latest
// check that took tokens, if it came within refusalMemory before now and
// no check was admitted after it (refusedAt).
func (d *Decider) refusedLately(now time.Time) error {
	if err := d.refusedAt(now); err != nil {
		return fmt.Errorf("redis: checks refused: %w", err)
	}
	return nil
}

type readyCache struct {
	mu     sync.Mutex
	until  time.Time
	err    error
	warmed bool // the warm connections were opened, once
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
