package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Admin statistics build/gateway keeps about configuration reloads.
const (
	StatConfigGeneration = "gateway.config_generation"
	StatReloadFailed     = "gateway.reload_failed"
)

// ConfigPath returns the -config file the gateway was started with.
func (g *Gateway) ConfigPath() (string, error) {
	args := g.cmd.Args
	for i := 1; i+1 < len(args); i++ {
		if args[i] == "-config" {
			return args[i+1], nil
		}
	}
	return "", fmt.Errorf("%s was started without -config", g.Name)
}

// SetFilterConfig rewrites the gateway's configuration file with the wasm
// filter's plugin configuration replaced by config (JSON). The file is
// replaced by a rename, so a reload never reads it half written. It does
// not reload the gateway: see Reload.
func (g *Gateway) SetFilterConfig(config string) error {
	path, err := g.ConfigPath()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".rewrite-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	written, err := WithFilterConfig(path, tmp, config)
	if err != nil {
		return err
	}
	return os.Rename(written, path)
}

// Reload sends the gateway SIGHUP and waits until it serves the next
// configuration generation, which it returns. A reload the gateway rejects
// (gateway.reload_failed rises) is an error carrying the end of its log.
func (g *Gateway) Reload(ctx context.Context) (int64, error) {
	before, err := g.Stats()
	if err != nil {
		return 0, err
	}
	if err := g.Signal(syscall.SIGHUP); err != nil {
		return 0, err
	}
	delay := 5 * time.Millisecond
	for {
		now, err := g.Stats()
		if err != nil {
			return 0, err
		}
		if n := now[StatConfigGeneration]; n > before[StatConfigGeneration] {
			return n, nil
		}
		if now[StatReloadFailed] > before[StatReloadFailed] {
			out := g.Output()
			if len(out) > 2000 {
				out = "…" + out[len(out)-2000:]
			}
			return 0, fmt.Errorf("%s rejected the new configuration:\n%s", g.Name, out)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for %s to reload: %w", g.Name, ctx.Err())
		case <-time.After(delay):
		}
		if delay < 100*time.Millisecond {
			delay *= 2
		}
	}
}
