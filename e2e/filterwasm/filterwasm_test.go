package filterwasm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
	"github.com/edgelimit/edgelimit/filter/filtertest"
)

var (
	modOnce sync.Once
	mod     *wasmhost.Module
	modErr  error
	modDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if mod != nil {
		mod.Close(context.Background())
	}
	if modDir != "" {
		os.RemoveAll(modDir)
	}
	os.Exit(code)
}

// filterModule builds and compiles filter.wasm once for the test binary.
func filterModule(t testing.TB) *wasmhost.Module {
	t.Helper()
	modOnce.Do(func() {
		modDir, modErr = os.MkdirTemp("", "filterwasm-")
		if modErr != nil {
			return
		}
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			modErr = err
			return
		}
		path, err := Build(root, modDir)
		if err != nil {
			modErr = err
			return
		}
		mod, modErr = wasmhost.LoadFile(context.Background(), path, wasmhost.ModuleOptions{})
	})
	if modErr != nil {
		t.Fatal(modErr)
	}
	return mod
}

func newHost(t *testing.T) filtertest.Host { return NewHost(t, filterModule(t)) }

// TestFilterSmoke drives the compiled filter through the main paths by hand:
// a missing key, an allowed request and a denied one.
func TestFilterSmoke(t *testing.T) {
	h := newHost(t)
	if !h.Configure(`{}`) { // the filter's defaults
		t.Fatalf("configuration refused; logs:\n%s", strings.Join(h.Logs(), "\n"))
	}
	req := []filtertest.Header{{":method", "GET"}, {":path", "/orders"}, {":authority", "shop"}, {":scheme", "http"}}

	s := h.NewStream()
	if s.RequestHeaders(req) {
		t.Fatal("a request without a key went on")
	}
	if r, ok := s.LocalReply(); !ok || r.Status != 401 {
		t.Fatalf("no key: reply %+v, %t", r, ok)
	}
	s.Done()

	// The sidecar's own answers (filtertest.SidecarAnswer) under a plan of
	// 10 tokens and 1/s: a full bucket, which admits the request and keeps
	// 9; and half a token, which refuses it for the 0.5 s until the next
	// whole one, a Retry-After of 1 s.
	for _, c := range []struct {
		status string
		answer []filtertest.Header
		want   int    // 0: continued
		header string // the answer's header the client sees
		value  string
	}{
		{"200", filtertest.SidecarAnswer("free", 10, 1, 10, 1), 0, "ratelimit-remaining", "9"},
		{"429", filtertest.SidecarAnswer("free", 10, 1, 0.5, 1), 429, "retry-after", "1"},
	} {
		s = h.NewStream()
		if s.RequestHeaders(append(req, filtertest.Header{"x-api-key", "k-" + c.status})) {
			t.Fatal("a request went on before its check")
		}
		call, ok := s.Callout()
		if !ok || call.Cluster != "ratelimit_sidecar" {
			t.Fatalf("callout %+v, %t", call, ok)
		}
		s.RespondCallout(c.answer, nil)
		var seen []filtertest.Header
		if c.want == 0 {
			if !s.Continued() {
				t.Errorf("sidecar said %s: not continued; logs:\n%s", c.status, strings.Join(h.Logs(), "\n"))
			}
			seen = s.ResponseHeaders([]filtertest.Header{{":status", "200"}})
		} else if r, ok := s.LocalReply(); !ok || r.Status != c.want {
			t.Errorf("sidecar said %s: reply %+v, %t", c.status, r, ok)
		} else {
			seen = r.Headers
		}
		if got, _ := filtertest.Get(seen, c.header); got != c.value {
			t.Errorf("sidecar said %s: %s %q, want %q (headers %v)", c.status, c.header, got, c.value, seen)
		}
		s.Done()
	}
}

// TestFilterBehaviour runs the filter's whole table of behaviour against
// the compiled module, the same table filter/filtertest/native runs
// natively.
func TestFilterBehaviour(t *testing.T) {
	filtertest.Run(t, newHost)
}
