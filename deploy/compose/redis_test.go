package compose

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/redisproc"
)

// Redis as compose runs it, whose snapshot on SIGTERM cannot be written
// (here the file's path is a directory; a full disk does the same), exits
// all the same: without `force`, Redis answers "Error trying to save the
// DB, can't exit" and keeps running until Docker kills it, 10 s after
// `docker compose stop` or `restart`. redisproc's Stop waits 10 s for the
// exit too, then kills and says so; the bound is that wait.
func TestComposeRedisExitsWhenItCannotSave(t *testing.T) {
	c, _, _ := load(t)
	cmd := c.Services["redis"].Command
	if len(cmd) == 0 || cmd[0] != "redis-server" {
		t.Fatalf("redis command %q, want redis-server and its arguments", cmd)
	}
	srv := redisproc.StartT(t, redisproc.Options{Args: cmd[1:]})
	if err := srv.Client(t).Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// redisproc names each server's snapshot dump-<port>.rdb.
	if err := os.MkdirAll(filepath.Join(srv.Dir(), "dump-"+port+".rdb", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := srv.Stop(); err != nil {
		t.Fatalf("stopping Redis whose snapshot cannot be written: %v", err)
	}
	t.Logf("Redis exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}
