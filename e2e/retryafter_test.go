package e2e_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// bucketWait is how long, from Redis's clock now, client's bucket under a
// plan of capacity and rate needs until it holds cost: the stored state
// refilled to Redis's TIME with the script's formula. Nothing refills
// between that reading and the reply it is compared with but what the
// client is owed anyway, so it never overstates the wait.
func (s *stack) bucketWait(client string, cost, capacity, rate float64) (float64, error) {
	ctx := context.Background()
	rc := s.redis.Client(s.t)
	v, err := rc.HMGet(ctx, keys.New(nil).BucketKey([]byte(client)), "tokens", "ts").Result()
	if err != nil {
		return 0, err
	}
	if v[0] == nil {
		return 0, nil // expired: full
	}
	tokens, err1 := strconv.ParseFloat(v[0].(string), 64)
	ts, err2 := strconv.ParseFloat(v[1].(string), 64)
	now, err3 := rc.Time(ctx).Result()
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, fmt.Errorf("bucket %v: %v %v %v", v, err1, err2, err3)
	}
	tokens = math.Min(capacity, tokens+rate*math.Max(0, float64(now.UnixMicro())-ts)/1e6)
	return math.Max(0, (float64(cost)-tokens)/rate), nil
}

// TestRetryAfterCountsSpendingElsewhere: a client behind three gateways,
// each with its own sidecar (as the chart deploys them), on a plan of 5
// burst + 1/s, with envoy.yaml's cost rule (POST /orders costs 5). Its
// POST is denied through gateway A with 3 tokens left; it then spends those
// 3 with GETs through gateway B; its POST again through A must be told the
// wait from the empty bucket (5 s), not the 2 s that A's deny cache and A's
// sidecar, which saw none of B's GETs, hold from the first denial: the
// client that waited 2 s was denied again. Every 429 is held to the bucket
// in Redis: its Retry-After is no earlier than the wait the bucket really
// needs when the reply is read, with no tolerance (Redis's clock and the
// client's are this host's; the reading comes after the decision, so the
// bucket can only have refilled more). Waiting it out, the client is
// admitted. A second POST through A within the same second is answered by
// A's cache, without a callout, and with the same care.
func TestRetryAfterCountsSpendingElsewhere(t *testing.T) {
	const capacity, rate, postCost = 5.0, 1.0, 5
	s := startStack(t, stackConfig{
		plans:    "default_plan: small\nplans:\n  small: {capacity: 5, rate: 1}\n",
		gateways: 3,
		sidecars: 3,
	})
	for g := range s.gateways {
		s.doDecided(g, "GET", "/orders/1", "x-api-key", "warm-up")
	}
	const A, B, C = 0, 1, 2
	s.decidedRun(t, "a POST denied through A, its tokens spent through B, the POST again through A", func(run int) error {
		client := "spread-" + strconv.Itoa(run)
		send := func(g int, method, path string, want int) (clientReply, error) {
			r, err := s.sendVia(g, method, path, client)
			if err == nil && r.status != want {
				err = fmt.Errorf("%s %s through gateway %d: %d (%v, retry-after %q), want %d",
					method, path, g, r.status, r.header.Values("ratelimit"), r.header.Get("retry-after"), want)
			}
			return r, err
		}
		// held checks a 429 against the bucket: its Retry-After is no
		// earlier than the wait for the POST's cost.
		held := func(what string, r clientReply) error {
			need, err := s.bucketWait(client, postCost, capacity, rate)
			if err != nil {
				return err
			}
			ra := atoi(r.header.Get("retry-after"))
			t.Logf("%s: 429, ratelimit %v, retry-after %d s; the bucket needs %.3f s", what, r.header.Values("ratelimit"), ra, need)
			if float64(ra) < need {
				return fmt.Errorf("%s: retry-after %d s, but the bucket needs %.3f s for the POST's %d tokens", what, ra, need, postCost)
			}
			return nil
		}
		for range 2 {
			if _, err := send(A, "GET", "/orders/1", http.StatusOK); err != nil {
				return err
			}
		}
		r, err := send(A, "POST", "/orders", http.StatusTooManyRequests)
		if err != nil {
			return err
		}
		if err := held("POST through A on 3 tokens", r); err != nil {
			return err
		}
		for range 3 {
			if _, err := send(B, "GET", "/orders/1", http.StatusOK); err != nil {
				return err
			}
		}
		before := s.decisions()
		if r, err = send(A, "POST", "/orders", http.StatusTooManyRequests); err != nil {
			return err
		}
		if err := held("POST through A after B spent the 3 tokens", r); err != nil {
			return err
		}
		r2, err := send(A, "POST", "/orders", http.StatusTooManyRequests)
		if err != nil {
			return err
		}
		if err := held("POST through A again", r2); err != nil {
			return err
		}
		t.Logf("the two POSTs through A: %v", s.decisions().minus(before))
		ra := atoi(r2.header.Get("retry-after"))
		time.Sleep(time.Until(r2.at.Add(time.Duration(ra) * time.Second)))
		_, err = send(C, "POST", "/orders", http.StatusOK)
		return err
	})
}
