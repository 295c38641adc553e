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

// SetFilterConfig rewrites the gateway's bootstrap file with the wasm
// filter's plugin configuration replaced by config (JSON). The file is
// replaced by a rename, so a reload never reads it half written. It does
// not reload the gateway: see Reload.
func (g *Gateway) SetFilterConfig(config string) error {
	path := g.Bootstrap
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
// It is build/gateway's: with a real Envoy it is an error.
func (g *Gateway) Reload(ctx context.Context) (int64, error) {
	if g.Envoy != "" {
		return 0, errEnvoyReload
	}
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
