package app

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// TestRedisLoggerWarnsOncePerInterval: go-redis's messages go out at warn
// once per redisLogEvery, through faillog (whose tests hold the clock
// stepping back, callers out of order and the count held back), the rest
// at debug. The test sends its messages within a few microseconds, far
// inside the 10 s interval.
func TestRedisLoggerWarnsOncePerInterval(t *testing.T) {
	var out bytes.Buffer
	l := newRedisLogger(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Printf(context.Background(), "dial tcp: connection refused")
	l.Printf(context.Background(), "dial tcp: connection refused again")
	l.Printf(context.Background(), "dial tcp: connection refused a third time")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "suppressed=0") ||
		!strings.Contains(lines[1], "level=DEBUG") || !strings.Contains(lines[2], "level=DEBUG") {
		t.Fatalf("log:\n%s\nwant the first message at warn with suppressed=0, the others at debug", out.String())
	}
}
