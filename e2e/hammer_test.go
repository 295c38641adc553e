package e2e_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// Three gateways and two sidecars share one Redis; 48 concurrent clients
// hold the same API key and send 600 requests at once (five times, with a
// new key each round), spread over every
// gateway, against a bucket of 100 that refills one token every 1000 s.
// Exactly 100 are admitted, never one more.
//
// The refill is negligible by construction: the test runs for well under
// a minute, during which the bucket regains less than 0.06 of a token, so
// the bound is the capacity itself with no tolerance.
//
// The count is exact only if no request failed open: a request that fails
// open is admitted whatever the bucket says. The sidecar therefore gets a
// 200 ms Redis deadline and the filter a 250 ms callout timeout (the
// decision tests' values, see calloutTimeout): far above what the burst
// needs even on a loaded 2-core machine, so fail-open stays at zero, and
// the test checks that it did before it trusts the count.
func TestHammerOneBucketNeverOverAdmits(t *testing.T) {
	const (
		capacity = 100
		clients  = 48
		requests = 600
		rounds   = 5
		key      = "hammer-shared-key"
	)
	s := startStack(t, stackConfig{
		plans:        "default_plan: hammer\nplans:\n  hammer: {capacity: 100, rate: 0.001}\n",
		filter:       filterConfig{TimeoutMs: calloutTimeout},
		redisTimeout: redisTimeout,
		sidecars:     2,
		gateways:     3,
	})
	for round := 0; round < rounds; round++ {
		t.Run("round "+strconv.Itoa(round), func(t *testing.T) {
			hammer(s.on(t), key+"-"+strconv.Itoa(round), capacity, clients, requests)
		})
	}
}

// hammer sends requests for one key from concurrent clients and checks
// that exactly capacity were admitted.
func hammer(s *stack, key string, capacity, clients, requests int64) {
	t := s.t
	before := s.decisions()
	var next, ok, denied, other atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := int64(0); c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				i := next.Add(1) - 1
				if i >= requests {
					return
				}
				// Round-robin over the gateways, so every sidecar and
				// every gateway's deny cache take part.
				r, err := s.try(int(i)%len(s.gateways), "GET", "/orders/"+strconv.FormatInt(i, 10), "x-api-key", key)
				switch {
				case err != nil:
					other.Add(1)
				case r.status == http.StatusOK:
					ok.Add(1)
				case r.status == http.StatusTooManyRequests:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(began)

	d := s.decisions().minus(before)
	if n := d.failedOpen(); n != 0 {
		t.Fatalf("%d requests failed open (%v): the admitted count says nothing about the bucket", n, d)
	}
	if n := other.Load(); n != 0 {
		t.Fatalf("%d requests got neither 200 nor 429", n)
	}
	t.Logf("%d requests from %d clients over %d gateways and %d sidecars in %v: admitted %d, denied %d (%v)",
		requests, clients, len(s.gateways), len(s.sidecars), elapsed.Round(time.Millisecond), ok.Load(), denied.Load(), d)
	if got := ok.Load(); got != capacity {
		t.Fatalf("admitted %d, want exactly the capacity %d", got, capacity)
	}
	if got := s.received(key); got != capacity {
		t.Fatalf("services received %d requests, want %d", got, capacity)
	}
	if d["allowed"] != capacity || d["denied"]+d["denied_cached"] != requests-capacity {
		t.Fatalf("gateway counters %v, want allowed=%d and %d denials", d, capacity, requests-capacity)
	}

	// The bucket in Redis agrees: less than one token left.
	tokens, err := s.redis.Client(t).HGet(context.Background(), keys.New(nil).BucketKey([]byte(key)), "tokens").Float64()
	if err != nil {
		t.Fatal(err)
	}
	if tokens >= 1 {
		t.Fatalf("the bucket holds %v tokens after %d admissions, want < 1", tokens, capacity)
	}
}
