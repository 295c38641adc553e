package main

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/envoy/wasmhost"
)

// cluster is one upstream cluster as the process holds it: the router's
// connections to its endpoints, the plugin's callout connections to them,
// and its statistics. A reload that leaves a cluster's definition as it was
// keeps the cluster, open connections and all, as Envoy keeps a cluster
// that a listener or filter update does not touch: the new VMs' first
// callouts then go out on connections already open, instead of each
// dialling its own within the callout's 5 ms while the new VMs' warm-up
// calls dial theirs. Every generation that routes or calls through the
// cluster holds a reference; the last one to close closes its connections.
type cluster struct {
	def   envoyconfig.Cluster
	up    *upstream
	calls *wasmhost.HTTPDispatcher // this cluster alone
	stats *clusterCounters
	refs  atomic.Int32
}

func newCluster(c envoyconfig.Cluster, counters *counters) *cluster {
	cl := &cluster{def: c, up: newUpstream(c), stats: newClusterCounters(counters, c.Name),
		calls: wasmhost.NewHTTPDispatcher(map[string]wasmhost.HTTPCluster{c.Name: {
			Endpoints: c.Endpoints, ConnectTimeout: c.ConnectTimeout,
			Limits: wasmhost.CircuitBreaker{MaxConnections: c.Limits.MaxConnections,
				MaxPendingRequests: c.Limits.MaxPendingRequests, MaxRequests: c.Limits.MaxRequests},
		}})}
	cl.up.stats = cl.stats
	return cl
}

// sameCluster reports whether b can be served by a's connections: the same
// endpoints in the same order, connect timeout and circuit breaker.
func sameCluster(a, b envoyconfig.Cluster) bool {
	return a.Name == b.Name && slices.Equal(a.Endpoints, b.Endpoints) &&
		a.ConnectTimeout == b.ConnectTimeout && a.Limits == b.Limits
}

// clustersFor returns the clusters cfg defines, each taken over from prev
// (the running generation, nil at start) where its definition is the same,
// and new otherwise; each with one more reference.
func clustersFor(cfg *envoyconfig.Config, prev *generation, counters *counters) map[string]*cluster {
	out := make(map[string]*cluster, len(cfg.Clusters))
	for name, def := range cfg.Clusters {
		var cl *cluster
		if prev != nil {
			if old := prev.clusters[name]; old != nil && sameCluster(old.def, def) {
				cl = old
			}
		}
		if cl == nil {
			cl = newCluster(def, counters)
		}
		cl.refs.Add(1)
		out[name] = cl
	}
	return out
}

// release drops a generation's reference; the last one closes the idle
// connections, and those in use close when their request ends.
func (c *cluster) release() {
	if c.refs.Add(-1) == 0 {
		c.calls.Close()
		c.up.close()
	}
}

// countingDispatcher sends the plugin's callouts to their cluster's
// connections and counts them in the cluster's stats, as Envoy's async
// client does.
type countingDispatcher struct {
	clusters map[string]*cluster // read-only once built
}

func (d *countingDispatcher) Cluster(name string) bool {
	c := d.clusters[name]
	return c != nil && c.calls.Cluster(name)
}

func (d *countingDispatcher) Dispatch(ctx context.Context, call wasmhost.Callout, respond func(wasmhost.CalloutResponse)) error {
	_, err := d.DispatchWatched(ctx, call, respond)
	return err
}

// DispatchWatched is Dispatch, with the HTTP dispatcher's report of a
// response that reached the socket (wasmhost.WatchingDispatcher).
func (d *countingDispatcher) DispatchWatched(ctx context.Context, call wasmhost.Callout, respond func(wasmhost.CalloutResponse)) (func() bool, error) {
	c := d.clusters[call.Cluster]
	if c == nil {
		return nil, wasmhost.ErrNoSuchCluster
	}
	cc := c.stats
	cc.total.inc()
	arrived, err := c.calls.DispatchWatched(ctx, call, func(r wasmhost.CalloutResponse) {
		if r.Reset {
			cc.reset.inc()
		} else {
			cc.class.inc(r.Status())
		}
		respond(r)
	})
	if errors.Is(err, wasmhost.ErrOverflow) {
		cc.overflow.inc()
	}
	return arrived, err
}
