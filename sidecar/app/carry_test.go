package app

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
	"github.com/edgelimit/edgelimit/sidecar/server"
)

// TestHotMarkCarriesTokens: a client marked hot, and later unmarked, while
// its traffic flows keeps the tokens it had: two sidecars on one Redis
// load each change (one of them carries the tokens, once), and the client
// is admitted no more over the run than its plan allows, capacity + rate ×
// the run's time. Its new buckets used to start full: marked hot, a client
// that had spent 50 of 60 was admitted 30 more in each of its two
// regions, and unmarked, its old bucket, untouched while it was hot, gave
// the 10 left in it again: 120 in all where the plan allows 60.
//
// The arithmetic: the plan is 60 burst + 60 an hour, a token a minute, so
// a run of t seconds refills t/60 tokens and admits at most 60 + t/60.
// The 10 left when the client is marked hot are split evenly, 5 in each
// region's bucket (no shares are in Redis yet), and each region sends
// more checks than that: all 10 are admitted, so the run admits at least
// 60, and an unmarked client has nothing left to carry back but the
// refill.
//
// On one Redis and on a Redis Cluster of three masters, where the client's
// buckets are on different masters.
func TestHotMarkCarriesTokens(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		testHotMarkCarriesTokens(t, redisproc.StartT(t, redisproc.Options{}).URL())
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redisproc.StartClusterT(t, 3, 0)
		testHotMarkCarriesTokens(t, "redis+cluster://"+strings.Join(cl.Addrs, ","))
	})
}

func testHotMarkCarriesTokens(t *testing.T, url string) {
	const client = "carried-client"
	plain := "plans:\n  p: {capacity: 60, rate: \"60/h\"}\nclients:\n  " + client + ": p\n"
	hotFile := "plans:\n  p: {capacity: 60, rate: \"60/h\"}\nclients:\n  " + client + ": {plan: p, regions: [eu, us]}\n"
	// The reconciler is kept from running (an hour): a tick between the
	// regions' checks would move the shares toward eu and cut us's bucket
	// to its smaller share, and this test counts tokens, not shares.
	slowReconcile := func(c *Config) { c.HotInterval = time.Hour }
	// decidesAnyway: the checks below count tokens, and one answered 503 on
	// a busy machine would read as a token not there.
	a := startSidecarWith(t, url, plain, decidesAnyway, slog.LevelInfo, slowReconcile)
	b := startSidecarWith(t, url, plain, decidesAnyway, slog.LevelInfo, slowReconcile)

	admitted := func(s *sidecar, n int, region string) int {
		got := 0
		for i := 0; i < n; i++ {
			switch r := s.check(t, client, "x-ratelimit-region", region); r.status {
			case 200:
				got++
			case 429:
			default:
				t.Fatalf("check from %s: %d %s", region, r.status, r.body)
			}
		}
		return got
	}
	load := func(content string) {
		for _, s := range []*sidecar{a, b} {
			if err := os.WriteFile(s.plansPath, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := s.Reload(); err != nil {
				t.Fatal(err)
			}
		}
	}

	start := time.Now()
	before := admitted(a, 50, "eu")
	load(hotFile)
	hotEU, hotUS := admitted(a, 30, "eu"), admitted(b, 30, "us")
	load(plain)
	after := admitted(a, 30, "eu") + admitted(b, 30, "us")
	elapsed := time.Since(start)

	total := before + hotEU + hotUS + after
	most := 60 + int(elapsed.Seconds()/60)
	t.Logf("admitted %d before marking, %d (eu) + %d (us) while hot, %d after unmarking: %d in %v, the plan allows %d",
		before, hotEU, hotUS, after, total, elapsed.Round(time.Millisecond), most)
	if before != 50 {
		t.Fatalf("%d of the first 50 admitted, want all", before)
	}
	if total > most || total < 60 {
		t.Errorf("admitted %d in all, want 60 to %d (capacity + rate × %v)", total, most, elapsed.Round(time.Millisecond))
	}
	carried := strings.Count(a.logs.String(), "tokens carried") + strings.Count(b.logs.String(), "tokens carried")
	if failed := strings.Count(a.logs.String(), "not carried") + strings.Count(b.logs.String(), "not carried"); failed != 0 {
		t.Errorf("%d log lines of tokens not carried, want none", failed)
	}
	if carried != 2 {
		t.Errorf("%d log lines of tokens carried, want 2 (one per change, by one of the two sidecars)", carried)
	}
}

// TestHotMarkWithRedisPaused: a reload marking clients hot while Redis does
// not answer still puts the file in force, within the carry's bound (2 s
// for all the clients of one reload, not for each), and says so in one
// line naming how many clients' tokens were not carried.
func TestHotMarkWithRedisPaused(t *testing.T) {
	srv := redisproc.StartT(t, redisproc.Options{})
	const clients = 5
	plain, hotFile := "plans:\n  p: {capacity: 60, rate: 1}\nclients:\n", "plans:\n  p: {capacity: 60, rate: 1}\nclients:\n"
	for i := 0; i < clients; i++ {
		plain += fmt.Sprintf("  c%d: p\n", i)
		hotFile += fmt.Sprintf("  c%d: {plan: p, regions: [eu, us]}\n", i)
	}
	s := startSidecarWith(t, srv.URL(), plain, server.DefaultTimeout, slog.LevelInfo, nil)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	if err := os.WriteFile(s.plansPath, []byte(hotFile), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if got := s.plans.Current().HotClients(); got != clients {
		t.Fatalf("%d hot clients in force after the reload, want %d", got, clients)
	}
	// carryTimeout for the reload, and a second for this machine's stalls.
	if took > carryTimeout+time.Second {
		t.Errorf("reload took %v with Redis paused, want at most %v", took, carryTimeout+time.Second)
	}
	logs := s.logs.String()
	if n := strings.Count(logs, "not carried"); n != 1 || !strings.Contains(logs, fmt.Sprintf("failed=%d", clients)) {
		t.Errorf("%d lines of tokens not carried, want 1 with failed=%d:\n%s", n, clients, logs)
	}
	t.Logf("reload with Redis paused took %v", took.Round(time.Millisecond))
}
