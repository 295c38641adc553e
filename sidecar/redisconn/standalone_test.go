package redisconn

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/lua"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// TestStandaloneKilledServerFailsAtOnce: with a single server, built and
// decided on as the sidecar does (its own connection, dialed by the batch
// that finds none), the checks on a killed server fail at once rather
// than at their deadline, and the first checks after it is back are
// decided: each batch dials once, with no retry and no pause between
// dials, where go-redis's pool, as the cluster and Sentinel clients use
// it, stops dialing after its refused dials and dials again once a second.
//
// Fifty checks, one every 10 ms, each with the sidecar's deadline
// (server.DefaultTimeout, 4 ms): a refused dial on loopback fails in well
// under a millisecond, and a check that reaches its deadline is one a busy
// machine did not run for 4 ms. A quarter of them may. After the restart
// (redisproc returns once the server answers), ten checks go one after the
// other with the same deadline: the first finds the server empty, resends
// the script and is decided; on a busy machine one of the ten is.
func TestStandaloneKilledServerFailsAtOnce(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	_, d := readyDecider(t, srv.URL())
	const key = "rl:{killed}"
	limit := lua.Limit{Capacity: 1000, Rate: 1000}
	if r, err := d.Decide(time.Now().Add(time.Minute), key, limit, 1); err != nil || !r.Allowed {
		t.Fatalf("check before the kill: %+v, %v", r, err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}

	const checks = 50
	if waited := checksOnKilled(t, d, key, limit, checks, "server"); waited > checks/4 {
		t.Errorf("%d of %d checks on the killed server waited out their %v deadline, want at most %d", waited, checks, server.DefaultTimeout, checks/4)
	}

	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var errs []error
	for range 10 {
		_, err := d.Decide(time.Now().Add(server.DefaultTimeout), key, limit, 1)
		if err == nil {
			t.Logf("restarted server: check %d after it was back decided, %v after", len(errs)+1, time.Since(up))
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("restarted server: none of 10 checks after it was back decided (%v): %v", time.Since(up), errs)
}
