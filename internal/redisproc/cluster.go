package redisproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterNodeTimeout is cluster-node-timeout in ms: how long a node may be
// unreachable before the others consider it failed. Short enough for fault
// tests, long enough that a busy machine does not trigger false failovers.
const clusterNodeTimeout = 5000

// Cluster is a Redis Cluster of real redis-server processes on loopback.
type Cluster struct {
	// Addrs lists every node ("127.0.0.1:port"), masters first as created.
	Addrs []string

	nodes    []*Server
	replicas int
	dir      string
}

// StartCluster starts masters*(1+replicasPerMaster) nodes with
// --cluster-enabled yes, joins them with `redis-cli --cluster create`, and
// returns once every node reports cluster_state:ok with all 16384 slots
// assigned and every node known (and, with replicas, every replica's link to
// its master up). redis-cli needs at least 3 masters. ctx bounds start-up.
func StartCluster(ctx context.Context, masters, replicasPerMaster int) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("redis cluster: masters must be >= 3, got %d", masters)
	}
	if replicasPerMaster < 0 {
		return nil, fmt.Errorf("redis cluster: replicasPerMaster must be >= 0, got %d", replicasPerMaster)
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, fmt.Errorf("redis-cli not found: %w", ErrNotInstalled)
	}
	dir, err := os.MkdirTemp("", "redisproc-cluster-")
	if err != nil {
		return nil, fmt.Errorf("redis cluster: make working dir: %w", err)
	}
	c := &Cluster{dir: dir, replicas: replicasPerMaster}
	ctx, cancel := withDefaultTimeout(ctx, 60*time.Second)
	defer cancel()

	n := masters * (1 + replicasPerMaster)
	for i := range n {
		// One directory per node: each keeps its own nodes.conf, which is
		// what lets a restarted node rejoin the cluster.
		s, err := Start(ctx, Options{
			Dir: filepath.Join(dir, "node-"+strconv.Itoa(i)),
			Args: []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", strconv.Itoa(clusterNodeTimeout),
			},
		})
		if err != nil {
			_ = c.Stop()
			return nil, fmt.Errorf("redis cluster: node %d: %w", i, err)
		}
		c.nodes = append(c.nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}

	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.Wait(ctx); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("redis cluster: %w\nredis-cli output:\n%s", err, out)
	}
	return c, nil
}

// StartClusterT is StartCluster for tests: it fails the test when the cluster
// cannot start, stops it at cleanup, and prints every node's log when the
// test failed.
func StartClusterT(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found: run `make test`, which installs it")
	}
	c, err := StartCluster(context.Background(), masters, replicasPerMaster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop redis cluster: %v", err)
		}
		if t.Failed() {
			for _, s := range c.nodes {
				t.Logf("redis cluster node %s log:\n%s", s.Addr, s.Log())
			}
		}
	})
	return c
}

// Stop stops every node and removes the cluster's directory. Idempotent.
func (c *Cluster) Stop() error {
	var errs []error
	for _, s := range c.nodes {
		errs = append(errs, s.Stop())
	}
	// Each node's Stop captured its log before the directory goes.
	_ = os.RemoveAll(c.dir)
	return errors.Join(errs...)
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Masters returns the addresses of the nodes that are masters now, as the
// first reachable node sees them.
func (c *Cluster) Masters(ctx context.Context) ([]string, error) {
	var lastErr error
	for _, s := range c.nodes {
		nodes, err := clusterNodes(ctx, s.Addr)
		if err != nil {
			lastErr = err
			continue
		}
		var masters []string
		for _, n := range nodes {
			if n.master && !n.failed {
				masters = append(masters, n.addr)
			}
		}
		return masters, nil
	}
	return nil, fmt.Errorf("redis cluster: no node answers: %w", lastErr)
}

// RequireFullCoverage sets cluster-require-full-coverage on every node.
// Redis's default, yes, has every master refuse every command while any
// master is marked failed; sidecar/README.md asks for no.
func (c *Cluster) RequireFullCoverage(ctx context.Context, yes bool) error {
	value := map[bool]string{true: "yes", false: "no"}[yes]
	for _, s := range c.nodes {
		node := redis.NewClient(&redis.Options{Addr: s.Addr})
		err := node.ConfigSet(ctx, "cluster-require-full-coverage", value).Err()
		node.Close()
		if err != nil {
			return fmt.Errorf("redis cluster: %s: %w", s.Addr, err)
		}
	}
	return nil
}

// SlotOwners maps every slot to the address of the master serving it, as
// the first reachable node sees it (CLUSTER SLOTS); a slot no master
// serves is absent.
func (c *Cluster) SlotOwners(ctx context.Context) (map[int]string, error) {
	var lastErr error
	for _, s := range c.nodes {
		node := redis.NewClient(&redis.Options{Addr: s.Addr})
		slots, err := node.ClusterSlots(ctx).Result()
		node.Close()
		if err != nil {
			lastErr = err
			continue
		}
		owners := make(map[int]string, 16384)
		for _, r := range slots {
			for slot := r.Start; slot <= r.End; slot++ {
				owners[slot] = r.Nodes[0].Addr
			}
		}
		return owners, nil
	}
	return nil, fmt.Errorf("redis cluster: no node answers: %w", lastErr)
}

// Client returns a cluster client over every node, closed at test cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Wait polls until every node (all must be running) reports cluster_state:ok, all 16384
// slots assigned and ok, every node known, and every replica linked to its
// master. Use it after restarting a node. ctx bounds the wait (default 60 s).
func (c *Cluster) Wait(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		why := c.notReady(ctx)
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %s: %w", why, ctx.Err())
		case <-tick.C:
		}
	}
}

// notReady returns why the cluster is not ready yet, or "".
func (c *Cluster) notReady(ctx context.Context) string {
	want := strconv.Itoa(len(c.nodes))
	for _, s := range c.nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, PoolSize: 1, DisableIdentity: true})
		info, err := rc.ClusterInfo(ctx).Result()
		var repl string
		if err == nil {
			repl, err = rc.Info(ctx, "replication").Result()
		}
		_ = rc.Close()
		if err != nil {
			return fmt.Sprintf("node %s: %v", s.Addr, err)
		}
		for _, f := range []struct{ name, want string }{
			{"cluster_state", "ok"},
			{"cluster_slots_assigned", "16384"},
			{"cluster_slots_ok", "16384"},
			{"cluster_known_nodes", want},
		} {
			if got := infoField(info, f.name); got != f.want {
				return fmt.Sprintf("node %s: %s is %q, want %q", s.Addr, f.name, got, f.want)
			}
		}
		if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
			return fmt.Sprintf("node %s: replica link to master is %q", s.Addr, infoField(repl, "master_link_status"))
		}
	}
	return ""
}

type clusterNode struct {
	addr           string
	master, failed bool
}

// clusterNodes parses CLUSTER NODES as seen from addr.
func clusterNodes(ctx context.Context, addr string) ([]clusterNode, error) {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1, DisableIdentity: true})
	defer rc.Close()
	out, err := rc.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var nodes []clusterNode
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <epoch> <link> <slot>...
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("CLUSTER NODES from %s: unexpected line %q", addr, line)
		}
		hostPort, _, _ := strings.Cut(f[1], "@")
		flags := "," + f[2] + ","
		nodes = append(nodes, clusterNode{
			addr:   hostPort,
			master: strings.Contains(flags, ",master,"),
			failed: strings.Contains(flags, ",fail,") || strings.Contains(flags, ",fail?,"),
		})
	}
	return nodes, nil
}
