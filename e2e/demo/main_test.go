package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/gotool"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// TestStoppedDemoLeavesNothing: the demo stopped halfway, by Ctrl-C
// (SIGINT) or by its terminal closing (SIGHUP), stops what it
// started and removes its temporary files (the plans file, Redis's folder,
// the gateway's bootstrap) before it exits. Each run is the demo binary
// with its own TMPDIR, stopped once the gateway is up and the burst has
// begun, when everything it makes exists.
func TestStoppedDemoLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The binaries `make build` left (EDGELIMIT_BIN_DIR, as make sets it),
	// else built for this test.
	binDir := os.Getenv("EDGELIMIT_BIN_DIR")
	if binDir == "" {
		binDir = t.TempDir()
	}
	if _, err := harness.Locate(ctx, binDir); err != nil {
		t.Fatal(err)
	}
	demo := filepath.Join(t.TempDir(), "demo")
	if err := gotool.Run(ctx, root, nil, "build", "-trimpath", "-o", demo, "./e2e/demo"); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			tmp := t.TempDir()
			cmd := exec.Command(demo, "-bin", binDir)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			testkit.DieWithParent(cmd)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			signalled := make(chan struct{})
			var printed strings.Builder
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					printed.WriteString(sc.Text() + "\n")
					if strings.HasPrefix(sc.Text(), "• burst:") {
						if entries, _ := os.ReadDir(tmp); len(entries) == 0 {
							t.Errorf("the demo is running and has made nothing in TMPDIR: the check below would test nothing")
						}
						cmd.Process.Signal(sig)
						close(signalled)
					}
				}
				done <- cmd.Wait()
			}()
			// Starting takes the demo a few seconds (Redis, the sidecar,
			// the gateway compiling filter.wasm for each worker); 2 min
			// leaves room for a machine loaded by other tests. Once
			// signalled, it stops the gateway with 5 s of grace, then the
			// sidecar and Redis: well within 30 s.
			select {
			case <-signalled:
			case err := <-done:
				select {
				case <-signalled: // signalled, then ended before this select ran
					done <- err
				default:
					t.Fatalf("the demo ended before its burst\nstdout:\n%s\nstderr:\n%s", printed.String(), stderr.String())
				}
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				<-done
				t.Fatalf("the demo had not begun its burst within 2 min\nstdout:\n%s\nstderr:\n%s", printed.String(), stderr.String())
			}
			var exit error
			select {
			case exit = <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("the demo had not exited 30 s after %v\nstdout:\n%s\nstderr:\n%s", sig, printed.String(), stderr.String())
			}
			// Stopped, not failed: exit status 130, as a shell reports
			// Ctrl-C, and no error.
			var ee *exec.ExitError
			if !errors.As(exit, &ee) || ee.ExitCode() != 130 || strings.TrimSpace(stderr.String()) != "demo: stopped" {
				t.Errorf("after %v: exit %v, stderr %q; want exit status 130 and \"demo: stopped\"", sig, exit, stderr.String())
			}
			var left []string
			filepath.WalkDir(tmp, func(path string, d os.DirEntry, err error) error {
				if path != tmp {
					left = append(left, path)
				}
				return nil
			})
			if len(left) > 0 {
				t.Errorf("after %v the demo left in TMPDIR:\n%s\nstderr:\n%s", sig, strings.Join(left, "\n"), stderr.String())
			}
		})
	}
}
