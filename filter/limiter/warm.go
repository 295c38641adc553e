package limiter

import "github.com/edgelimit/edgelimit/filter/abi"

// Warm connections (filter/RATIONALE.md, "Why the filter opens its
// connections before the traffic"): a callout goes out on an idle HTTP/1.1
// connection of the proxy's pool to the sidecar cluster, or waits for a new
// one. The first burst after start would set up one connection per request
// at once, in the proxy, the kernel and the sidecar, all inside the 5 ms the
// check has. So each root context, on its first tick and on every tick
// after, makes warm_connections calls at once to the sidecar's GET /healthz,
// which needs neither Redis nor a key: the proxy opens as many connections
// as it has no idle one for, and keeps them in its pool once answered. Their
// answers are not the filter's concern: the tokens are in no table, so
// OnHTTPCallResponse drops them.

// warmPath is what a warm-up call asks the sidecar.
const warmPath = "/healthz"

// warmTimeoutMs bounds a warm-up call. Far above a check's timeout: a call
// that times out resets its stream, and the proxy closes the HTTP/1.1
// connection the call was to leave open; and below the tick period, so that
// one round ends before the next.
const warmTimeoutMs = 1000

// firstTickMs is the first tick's delay after configuration: the warm-up
// goes out as soon as the proxy runs the root context's timers.
const firstTickMs = 1

// warm makes the root context's warm-up calls; it stops at the first the
// proxy refuses (no such cluster, or its circuit breaker full), and the next
// tick tries again.
func (l *Limiter) warm(r *root) {
	cfg := r.cfg
	if cfg == nil || cfg.Mode == ModeOff {
		return
	}
	l.headers = append(l.headers[:0],
		[2]string{":method", "GET"},
		[2]string{":path", warmPath},
		[2]string{":authority", cfg.SidecarAuthority})
	for range cfg.WarmConnections {
		if _, st := l.host.HTTPCall(cfg.SidecarCluster, l.headers, nil, nil, warmTimeoutMs); st != abi.StatusOK {
			return
		}
	}
}
