package app

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/internal/testkit"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// TestEvictionPolicyWarned: a Redis with a memory limit and a policy that
// evicts keys (here allkeys-lru) may drop a live bucket, whose client then
// starts over with a full one; the sidecar says so at start, naming the
// policy. One that refuses writes when full (noeviction, Redis's default)
// or has no limit is not warned about. A policy changed while the sidecar
// runs (CONFIG SET, or a Redis replaced) is seen at the next minute's
// look; the test reads only the one at start.
func TestEvictionPolicyWarned(t *testing.T) {
	const warning = "redis evicts keys when full"
	for _, c := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}, true},
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"}, true},
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"}, false},
		{[]string{"--maxmemory-policy", "allkeys-lru"}, false}, // no limit: nothing is evicted
	} {
		srv := redisproc.StartT(t, redisproc.Options{Args: c.args})
		// decidesAnyway: the check only shows the sidecar is up, which a 503
		// on a busy machine would not.
		s := startSidecarLog(t, srv.URL(), contractPlans, decidesAnyway, slog.LevelInfo)
		if r := s.check(t, "a"); r.status != 200 {
			t.Fatalf("%v: check: %d %q", c.args, r.status, r.body)
		}
		if c.warn {
			testkit.Poll(t, 10*time.Second, "the eviction warning", func() bool { return strings.Contains(s.logs.String(), warning) })
			if line := s.logs.String(); !strings.Contains(line, "maxmemory_policy="+c.args[3]) {
				t.Errorf("%v: the warning does not name the policy:\n%s", c.args, line)
			}
			continue
		}
		// The look at start is done once Redis has answered it: Redis's
		// count of INFO calls says when, less the poll's own (each counted
		// once it has run).
		polls := int64(0)
		testkit.Poll(t, 10*time.Second, "the sidecar's INFO memory", func() bool {
			n, err := redisproc.CommandCalls(context.Background(), srv.Addr, "info")
			polls++
			return err == nil && n > polls-1
		})
		if strings.Contains(s.logs.String(), warning) {
			t.Errorf("%v: warned:\n%s", c.args, s.logs)
		}
	}
}

// On a Redis Cluster each master is read and named (node=) in its own line.
func TestEvictionPolicyWarnedPerMaster(t *testing.T) {
	cl := redisproc.StartClusterT(t, 3, 0)
	for _, addr := range cl.Addrs {
		c := cl.Node(addr).Client(t)
		if err := c.ConfigSet(context.Background(), "maxmemory", "64mb").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := startSidecarLog(t, "redis+cluster://"+strings.Join(cl.Addrs, ","), contractPlans, server.DefaultTimeout, slog.LevelInfo)
	testkit.Poll(t, 10*time.Second, "a warning for each master", func() bool {
		logs := s.logs.String()
		for _, addr := range cl.Addrs {
			if !strings.Contains(logs, "node="+addr+" maxmemory=67108864 maxmemory_policy=allkeys-lru") {
				return false
			}
		}
		return true
	})
}

// TestClusterFullCoverageWarned: a Redis Cluster master running
// cluster-require-full-coverage yes (Redis's default) refuses every command
// once any master is marked failed, so one master lost fails every check
// open (e2e's TestClusterMasterDownOthersKeepTheirLimit measures it); the
// sidecar warns at start, naming each such master. With no, as
// sidecar/README.md asks, it does not, once it has read every master.
func TestClusterFullCoverageWarned(t *testing.T) {
	for _, full := range []bool{true, false} {
		cl := redisproc.StartClusterT(t, 3, 0)
		if err := cl.RequireFullCoverage(context.Background(), full); err != nil {
			t.Fatal(err)
		}
		s := startSidecarLog(t, "redis+cluster://"+strings.Join(cl.Addrs, ","), contractPlans, server.DefaultTimeout, slog.LevelInfo)
		if full {
			testkit.Poll(t, 10*time.Second, "a warning for each master", func() bool {
				logs := s.logs.String()
				for _, addr := range cl.Addrs {
					if !strings.Contains(logs, "node="+addr+" cluster_require_full_coverage=yes") {
						return false
					}
				}
				return strings.Contains(logs, fullCoverageWarning)
			})
			continue
		}
		testkit.Poll(t, 10*time.Second, "the sidecar's CONFIG GET on every master", func() bool {
			for _, addr := range cl.Addrs {
				if n, err := redisproc.CommandCalls(context.Background(), addr, "config|get"); err != nil || n == 0 {
					return false
				}
			}
			return true
		})
		if logs := s.logs.String(); strings.Contains(logs, "cluster_require_full_coverage") {
			t.Errorf("warned with cluster-require-full-coverage no:\n%s", logs)
		}
	}
}
