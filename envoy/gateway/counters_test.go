package main

import (
	"regexp"
	"testing"
)

func TestNewRequestIDIsAUUIDv4(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		id := newRequestID()
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("request id %q (seen before: %t)", id, seen[id])
		}
		seen[id] = true
	}
}

func TestCountersAreListedOnceUsed(t *testing.T) {
	var c counters
	cc := newClusterCounters(&c, "orders")
	cc.total.inc()
	cc.total.inc()
	cc.class.inc(200)
	cc.class.inc(503)
	cc.class.inc(1200) // no class of its own: counted by name
	c.add("gateway.reload_failed", 0)
	want := map[string]int64{
		"cluster.orders.upstream_rq_total": 2, "cluster.orders.upstream_rq_2xx": 1,
		"cluster.orders.upstream_rq_5xx": 1, "cluster.orders.upstream_rq_12xx": 1, "gateway.reload_failed": 0,
	}
	got := c.snapshot()
	if len(got) != len(want) {
		t.Errorf("counters %v, want %v", got, want)
	}
	for name, n := range want {
		if v, ok := got[name]; !ok || v != n {
			t.Errorf("%s = %d (listed %t), want %d", name, v, ok, n)
		}
	}
}
