package plans

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

func planFile(capacity int) string {
	return fmt.Sprintf("default_plan: free\nplans:\n  free: {capacity: %d, rate: 1}\n", capacity)
}

// replace writes content the way careful editors and config tools do: to a
// temporary file, then renamed over the old one (a new inode).
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type reloads struct{ ok, failed atomic.Int64 }

func (r *reloads) observe(ok bool) {
	if ok {
		r.ok.Add(1)
	} else {
		r.failed.Add(1)
	}
}

func openStore(t *testing.T, content string) (*Store, string, *reloads, *bytes.Buffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var mu sync.Mutex
	r := &reloads{}
	s, err := Open(path, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)), r.observe)
	if err != nil {
		t.Fatal(err)
	}
	return s, path, r, &logs
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func capacity(s *Store) float64 { return s.Current().Default.Capacity }

func TestStoreChanges(t *testing.T) {
	tests := []struct {
		name       string
		write      func(t *testing.T, path string)
		wantCap    float64
		wantOK     int64
		wantFailed int64
	}{
		{"rename over", func(t *testing.T, path string) { replace(t, path, planFile(20)) }, 20, 1, 0},
		{"write in place, same size", func(t *testing.T, path string) {
			// Same length as planFile(10): only the content tells the change,
			// which the coarse mtime clock may not.
			if err := os.WriteFile(path, []byte(planFile(30)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, 30, 1, 0},
		{"invalid file keeps the old plans", func(t *testing.T, path string) {
			replace(t, path, "plans:\n  free: {capacity: -1, rate: 1}\n")
		}, 10, 0, 1},
		{"touch without change", func(t *testing.T, path string) {
			now := time.Now().Add(time.Minute)
			if err := os.Chtimes(path, now, now); err != nil {
				t.Fatal(err)
			}
		}, 10, 0, 0},
		{"file removed keeps the old plans", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, 10, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, path, r, _ := openStore(t, planFile(10))
			tt.write(t, path)
			s.poll()
			s.poll() // a second look must not reload or report again
			if got := capacity(s); got != tt.wantCap {
				t.Errorf("capacity = %v, want %v", got, tt.wantCap)
			}
			if r.ok.Load() != tt.wantOK || r.failed.Load() != tt.wantFailed {
				t.Errorf("reloads ok=%d failed=%d, want %d and %d", r.ok.Load(), r.failed.Load(), tt.wantOK, tt.wantFailed)
			}
		})
	}
}

func TestStoreBadThenGood(t *testing.T) {
	s, path, r, logs := openStore(t, planFile(10))
	replace(t, path, "plans: [\n")
	s.poll()
	if capacity(s) != 10 || r.failed.Load() != 1 {
		t.Fatalf("after a bad file: capacity %v, failed %d; want 10 and 1", capacity(s), r.failed.Load())
	}
	if !strings.Contains(logs.String(), "plans reload rejected") || !strings.Contains(logs.String(), path) {
		t.Errorf("log does not report the rejected file:\n%s", logs)
	}
	replace(t, path, planFile(40))
	s.poll()
	if capacity(s) != 40 || r.ok.Load() != 1 {
		t.Fatalf("after fixing the file: capacity %v, ok %d; want 40 and 1", capacity(s), r.ok.Load())
	}
}

// TestStoreMissingFileReported: a plans file gone for good (a ConfigMap
// whose key was renamed) is a refused reload once it has been missing for
// missingGrace, counted once, so that sidecar_plans_last_reload_successful
// and its alert say what a restart would find: a sidecar that does not
// start. It used to be one warning line and nothing counted, however long
// it lasted. A moment's absence (an editor between delete and write)
// still counts nothing, and the file put back as it was ends the refusal.
func TestStoreMissingFileReported(t *testing.T) {
	s, path, r, logs := openStore(t, planFile(10))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	s.poll()
	if r.failed.Load() != 0 {
		t.Fatalf("a file missing for a moment counted %d failed reloads, want 0", r.failed.Load())
	}
	testkit.Poll(t, 10*time.Second, "the missing file to be reported", func() bool {
		s.poll()
		return r.failed.Load() > 0
	})
	if d := time.Since(removed); d < missingGrace {
		t.Errorf("reported %v after the removal, want at least %v", d, missingGrace)
	}
	s.poll()
	s.poll()
	if r.failed.Load() != 1 || capacity(s) != 10 {
		t.Fatalf("failed %d, capacity %v; want one report and the plans in force kept (10)", r.failed.Load(), capacity(s))
	}
	if !strings.Contains(logs.String(), "a sidecar started now would not start") {
		t.Errorf("the log does not say what a restart would do:\n%s", logs)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s.poll()
	if r.ok.Load() != 1 || capacity(s) != 10 {
		t.Fatalf("the file put back: ok %d, capacity %v; want 1 reload and 10", r.ok.Load(), capacity(s))
	}
}

func TestStoreReloadForced(t *testing.T) {
	s, path, r, _ := openStore(t, planFile(10))
	if err := s.Reload("SIGHUP"); err != nil {
		t.Fatal(err)
	}
	replace(t, path, "nonsense: true\n")
	err := s.Reload("SIGHUP")
	if err == nil || !strings.Contains(err.Error(), path+":1: unknown top-level field") {
		t.Fatalf("Reload(bad) = %v, want the field error", err)
	}
	if capacity(s) != 10 || r.ok.Load() != 1 || r.failed.Load() != 1 {
		t.Fatalf("capacity %v ok %d failed %d; want 10, 1, 1", capacity(s), r.ok.Load(), r.failed.Load())
	}
}

func TestOpenInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plans.yaml")
	if err := os.WriteFile(path, []byte("plans: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, nil, nil); err == nil || err.Error() != path+":1: plans: required: at least one plan" {
		t.Fatalf("Open = %v", err)
	}
	if _, err := Open(path+".missing", nil, nil); err == nil {
		t.Fatal("Open(missing) succeeded")
	}
}

// TestWatchUnderReaders swaps plans while readers hammer Current: every read
// must see a complete plan set (old or new), and the watcher must pick up the
// last file.
func TestWatchUnderReaders(t *testing.T) {
	s, path, _, _ := openStore(t, planFile(10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Watch(ctx, 5*time.Millisecond)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				plan, ok := s.Current().Lookup([]byte("anyone"))
				if !ok || plan.Capacity < 10 || plan.Capacity > 59 || plan.LimitHeader == "" {
					t.Errorf("read a torn or missing plan: %+v, %v", plan, ok)
					return
				}
			}
		}()
	}
	for c := 11; c < 60; c++ {
		replace(t, path, planFile(c))
	}
	// The watcher polls every 5 ms; allow it generously long on a busy machine.
	testkit.Until(30*time.Second, func() bool { return capacity(s) == 59 })
	close(stop)
	wg.Wait()
	if got := capacity(s); got != 59 {
		t.Fatalf("watcher did not load the last file: capacity %v, want 59", got)
	}
}

// swapConfigMap updates dir the way the kubelet updates a ConfigMap volume
// (its AtomicWriter): the files go into a new directory
// "..<timestamp>.<random>", a symlink "..data_tmp" to it is renamed over
// "..data", the visible "plans.yaml" (a symlink to "..data/plans.yaml") is
// made if missing, and the old directory is removed. mtime, if not zero,
// is put on the new file (a copy that keeps its source's time).
func swapConfigMap(t *testing.T, dir, content string, mtime time.Time) {
	t.Helper()
	data := filepath.Join(dir, "..data")
	old, _ := os.Readlink(data)
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(ts, "plans.yaml")
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if !mtime.IsZero() {
		if err := os.Chtimes(file, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		t.Fatal(err)
	}
	visible := filepath.Join(dir, "plans.yaml")
	if _, err := os.Lstat(visible); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", "plans.yaml"), visible); err != nil {
			t.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStoreConfigMapSwaps follows a plans file in a ConfigMap volume
// through the kubelet's updates, each looked at by one poll: a plan raised
// (the same size), a client added, a bad file (kept out, counted once),
// and two updates between two polls, of the same size, with the kubelet's
// own modification times and with one put back on both files. Two swaps
// in a row give the last file the inode of the one the store read (ext4
// reuses it almost every time), so size, inode and a put-back mtime match.
func TestStoreConfigMapSwaps(t *testing.T) {
	dir := t.TempDir()
	swapConfigMap(t, dir, planFile(10), time.Time{})
	r := &reloads{}
	s, err := Open(filepath.Join(dir, "plans.yaml"), nil, r.observe)
	if err != nil {
		t.Fatal(err)
	}
	swapConfigMap(t, dir, planFile(20), time.Time{})
	s.poll()
	if capacity(s) != 20 || r.ok.Load() != 1 {
		t.Fatalf("plan raised: capacity %v, ok %d; want 20, 1", capacity(s), r.ok.Load())
	}
	swapConfigMap(t, dir, planFile(20)+"clients:\n  \"client-x\": free\n", time.Time{})
	s.poll()
	if n := s.Current().Clients(); n != 1 || r.ok.Load() != 2 {
		t.Fatalf("client added: %d clients, ok %d; want 1, 2", n, r.ok.Load())
	}
	swapConfigMap(t, dir, planFile(30)+"clients:\n  \"client-x\": nosuch\n", time.Time{})
	s.poll()
	s.poll()
	if n := s.Current().Clients(); n != 1 || capacity(s) != 20 || r.failed.Load() != 1 {
		t.Fatalf("bad file: %d clients, capacity %v, failed %d; want the plans kept (1, 20) and 1", n, capacity(s), r.failed.Load())
	}
	for round, mtime := range []time.Time{{}, time.Now().Add(-time.Hour).Truncate(time.Second)} {
		for c := 30; c < 40; c++ {
			swapConfigMap(t, dir, planFile(c), mtime)
			s.poll()
			swapConfigMap(t, dir, planFile(c+50), mtime)
			swapConfigMap(t, dir, planFile(c+10), mtime)
			s.poll()
			if got := capacity(s); got != float64(c+10) {
				t.Fatalf("round %d: two swaps between polls: capacity %v, want %d", round, got, c+10)
			}
		}
	}
	if r.failed.Load() != 1 {
		t.Fatalf("failed reloads %d, want the bad file's 1", r.failed.Load())
	}
}

// TestStoreMtimePutBack: a file rewritten in place, the same size, with
// its old modification time put back (cp -p over it, rsync -t --inplace)
// keeps its inode, size and mtime; its change time tells.
func TestStoreMtimePutBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plans.yaml")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	write(planFile(10))
	s, err := Open(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	write(planFile(20))
	s.poll()
	if got := capacity(s); got != 20 {
		t.Fatalf("capacity %v after the file was rewritten with its mtime put back, want 20", got)
	}
}
