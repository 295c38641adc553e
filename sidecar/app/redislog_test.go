package app

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRedisLoggerClockSteppedBack: go-redis's messages go out at warn once
// per redisLogEvery on the host's wall clock. A last warn line stamped an
// hour ahead of the clock, as one is after the clock steps back an hour,
// does not hold the next message at debug for that hour: it goes out at
// warn, and the one after it, within the interval, at debug.
func TestRedisLoggerClockSteppedBack(t *testing.T) {
	var out bytes.Buffer
	l := newRedisLogger(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.last.Store(time.Now().Add(time.Hour).UnixNano())
	l.Printf(context.Background(), "dial tcp: connection refused")
	l.Printf(context.Background(), "dial tcp: connection refused again")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[1], "level=DEBUG") {
		t.Fatalf("log:\n%s\nwant the first message at warn, the second at debug", out.String())
	}
}
