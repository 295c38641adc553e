package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// Both floors answer a check as the sidecar answers an allowed one: 200
// and the same headers with the same values, which is what makes their
// cost comparable with the sidecar's.
func TestFloorsAnswerAsTheSidecar(t *testing.T) {
	plansFile := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(plansFile, []byte("default_plan: bench\nplans:\n  bench: {capacity: 1000000000, rate: 1000000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	answers := map[string]string{}
	for _, mode := range []string{"decided", "fixed"} {
		hs, err := newServer(plansFile, mode)
		if err != nil {
			t.Fatal(err)
		}
		ln := fasthttputil.NewInmemoryListener()
		go hs.Serve(ln)
		c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://floor/v1/check")
		req.Header.SetMethod("POST")
		req.Header.Set("x-api-key", "bench-key-000001")
		if err := c.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 200 {
			t.Fatalf("%s: status %d, %q", mode, resp.StatusCode(), resp.Body())
		}
		var h []string
		for k, v := range resp.Header.All() {
			h = append(h, strings.ToLower(string(k))+": "+string(v))
		}
		answers[mode] = strings.Join(h, "\n")
		hs.Shutdown()
	}
	if !strings.Contains(answers["decided"], "ratelimit-remaining: 999999999") || !strings.Contains(answers["decided"], "x-ratelimit-plan: bench") {
		t.Errorf("decided: not an allowed answer of the plan:\n%s", answers["decided"])
	}
	if answers["fixed"] != answers["decided"] {
		t.Errorf("fixed answers\n%s\nwhere the sidecar's handler answers\n%s", answers["fixed"], answers["decided"])
	}
}

func TestFloorConfigErrors(t *testing.T) {
	dir := t.TempDir()
	noDefault := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(noDefault, []byte("plans:\n  bench: {capacity: 10, rate: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, answer, want string }{
		{filepath.Join(dir, "missing.yaml"), "decided", "-plans"},
		{noDefault, "fixed", "default_plan"},
		{noDefault, "slow", "-answer"},
	} {
		if _, err := newServer(c.file, c.answer); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s, -answer %s: error %v, want one naming %s", c.file, c.answer, err, c.want)
		}
	}
}
