package e2e_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"
)

// composeRedisArgs are the arguments deploy/compose/compose.yaml runs
// redis-server with.
func composeRedisArgs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(repoFile(t, "deploy/compose/compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Command []string `json:"command"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	cmd := c.Services["redis"].Command
	if len(cmd) == 0 || cmd[0] != "redis-server" {
		t.Fatalf("compose.yaml's redis command is %q, want redis-server and its arguments", cmd)
	}
	return cmd[1:]
}

// Redis as deploy/compose runs it, restarted as an operator restarts it
// (SIGTERM, then the same server started again on its data: docker
// compose restart, or a container recreated on the same volume). A client
// that had spent its bucket finds it spent after the restart, not full:
// every client sending past its plan would otherwise be admitted up to
// one more capacity, on every planned restart of Redis.
func TestComposeRedisRestartKeepsBuckets(t *testing.T) {
	s := startStack(t, stackConfig{plans: tinyPlans, redisArgs: composeRedisArgs(t)})
	for i := range 2 {
		if r := s.doDecided(0, "GET", "/orders/1", "x-api-key", "spent"); r.status != 200 {
			t.Fatalf("request %d: status %d, want 200 (the plan's 2 tokens)", i, r.status)
		}
	}
	before, err := s.tokens("spent")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.redis.RestartKeepingData(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The plan refills 0.001 tokens a second: a bucket that came back
	// holds what it held, short of a whole token.
	after, err := s.tokens("spent")
	if errors.Is(err, redis.Nil) {
		t.Fatalf("the client's bucket (%.3f tokens) is gone after Redis's restart: it would start over full, 2 tokens", before)
	}
	if err != nil {
		t.Fatal(err)
	}
	if after >= 1 {
		t.Fatalf("the client's bucket holds %.3f tokens after Redis's restart, %.3f before", after, before)
	}
	// And the limiter reads it: the client is denied, the sidecar having
	// reloaded the script.
	if r := s.doDecided(0, "GET", "/orders/1", "x-api-key", "spent"); r.status != 429 {
		t.Fatalf("after Redis's restart the spent client got %d, want 429", r.status)
	}
	t.Logf("the bucket held %.3f tokens before Redis's restart and %.3f after", before, after)
}
