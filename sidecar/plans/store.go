package plans

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/internal/tick"
)

// DefaultPollInterval is how often Store.Watch looks at the file.
const DefaultPollInterval = time.Second

// Store holds the plans in force and replaces them when the file changes.
// Readers call Current on every request; a reload swaps one pointer, so a
// request sees either the old plans or the new ones, never a mix, and never
// waits.
type Store struct {
	path     string
	log      *slog.Logger
	onReload func(ok bool)
	check    func(*Plans) error

	// BeforeSwap, if set before Watch or Reload is first called, is called
	// with the plans in force and a reloaded file's plans just before the
	// latter are put in force (the sidecar carries the tokens of clients
	// marked hot or unmarked to their new buckets).
	BeforeSwap func(old, new *Plans)

	cur atomic.Pointer[Plans]

	mu      sync.Mutex // serialises reloads (SIGHUP and the watcher)
	goodSum [sha256.Size]byte
	badSum  [sha256.Size]byte // last content rejected, not reported twice
	// refused: the last reload attempt failed (the file could not be read
	// or was rejected); the plans in force are not the file's.
	refused  bool
	lastStat os.FileInfo
	readAt   time.Time // when the file was last read
	statErr  string
	// goneSince is when the poll first could not stat the file, zero while
	// it can; goneReported: that absence has been reported as a refused
	// reload (missingGrace).
	goneSince    time.Time
	goneReported bool
}

// missingGrace is how long the file may be missing before the absence is
// reported as a refused reload. An editor between delete and write, or a
// tool that removes the file before writing the new one, takes
// milliseconds; a file still gone 2 s later (a ConfigMap whose key was
// renamed, a volume unmounted) is the plans the sidecar would refuse at
// start: it would not start.
const missingGrace = 2 * time.Second

// racyWindow is how close to the last read a modification time must be for
// an unchanged stat to be distrusted. File timestamps come from a coarse
// clock, so two writes of the same size within one tick leave identical stats;
// like git with "racily clean" index entries, the content is read again until
// the file's mtime is safely older than the last read.
const racyWindow = 2 * time.Second

// Open loads the plans file at path; the first load must succeed. log
// receives one line per reload; onReload, if not nil, is called after every
// reload attempt with its outcome (for metrics).
func Open(path string, log *slog.Logger, onReload func(ok bool)) (*Store, error) {
	return OpenChecked(path, log, onReload, nil)
}

// OpenChecked is Open with one more check: a file that parses but for which
// check returns an error is refused like one that does not parse (at start
// and on every reload). The sidecar checks the file's digests against its
// salt (Plans.CheckDigests).
func OpenChecked(path string, log *slog.Logger, onReload func(ok bool), check func(*Plans) error) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{path: path, log: log, onReload: onReload, check: check}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read plans: %w", err)
	}
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := s.parse(data)
	if err != nil {
		return nil, err
	}
	s.cur.Store(p)
	s.goodSum = sha256.Sum256(data)
	s.lastStat, s.readAt = fi, time.Now()
	return s, nil
}

// Current returns the plans in force. It never returns nil.
func (s *Store) Current() *Plans { return s.cur.Load() }

// Path returns the plans file's path.
func (s *Store) Path() string { return s.path }

// Reload reads the file and, if it is valid, puts it in force. A file that
// does not parse is logged and the plans in force are kept. reason goes into
// the log line ("SIGHUP", "file changed").
func (s *Store) Reload(reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloadLocked(reason, true)
}

// Watch polls the file every interval (DefaultPollInterval if <= 0) until ctx
// ends, reloading when its identity (inode), size, modification time or
// change time (ctime, on Linux) changes and its content differs from the
// plans in force. The change time catches a file whose modification time was
// put back (cp -p, rsync -t, tar) on an inode the file system reused: two
// ConfigMap-style swaps between polls give the new file the inode of the
// one deleted by the first swap (ext4 does so almost every time), and
// then only the content and the change time differ. Polling by path
// follows editors and tools that replace the file by renaming a new one over
// it (and Kubernetes' symlink swaps), which a watch on the old inode misses.
func (s *Store) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	tick.Every(ctx, interval, func() bool {
		s.poll()
		return true
	})
}

func (s *Store) poll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(s.path)
	if err != nil {
		// Often transient (an editor between delete and write): say so once,
		// keep the plans in force, look again next tick. Past missingGrace
		// it is a refused reload, counted once, until the file is back and
		// loads: the plans in force are no longer the file's.
		now := time.Now()
		if s.goneSince.IsZero() {
			s.goneSince = now
		}
		// Whatever comes back at the path is read, even a file whose stat
		// matches the last one read.
		s.lastStat = nil
		if msg := err.Error(); msg != s.statErr {
			s.statErr = msg
			s.log.Warn("plans file unreadable, keeping the plans in force", "file", s.path, "err", err)
		}
		if !s.goneReported && now.Sub(s.goneSince) >= missingGrace {
			s.goneReported, s.refused = true, true
			s.log.Error("plans file unreadable for "+missingGrace.String()+", keeping the plans in force; a sidecar started now would not start",
				"file", s.path, "err", err)
			s.report(false)
		}
		return
	}
	s.statErr, s.goneSince, s.goneReported = "", time.Time{}, false
	if prev := s.lastStat; prev != nil && os.SameFile(prev, fi) &&
		prev.Size() == fi.Size() && prev.ModTime().Equal(fi.ModTime()) &&
		changeTime(prev).Equal(changeTime(fi)) &&
		fi.ModTime().Before(s.readAt.Add(-racyWindow)) &&
		changeTime(fi).Before(s.readAt.Add(-racyWindow)) {
		return
	}
	s.lastStat = fi
	_ = s.reloadLocked("file changed", false)
}

// reloadLocked reads and parses the file. With force false, content equal to
// the plans in force or to the last rejected content is skipped, so a touch
// does not reload and a bad file is reported once, not on every tick; but
// content equal to the plans in force after a failed attempt is loaded
// again, so that putting the file back ends the failure
// (sidecar_plans_last_reload_successful).
func (s *Store) reloadLocked(reason string, force bool) error {
	s.readAt = time.Now()
	data, err := ReadFile(s.path)
	if err != nil {
		s.refused = true
		s.log.Error("plans reload failed, keeping the plans in force", "file", s.path, "reason", reason, "err", err)
		s.report(false)
		return err
	}
	sum := sha256.Sum256(data)
	if !force && (sum == s.goodSum && !s.refused || sum == s.badSum) {
		return nil
	}
	p, err := s.parse(data)
	if err != nil {
		s.badSum, s.refused = sum, true
		s.log.Error("plans reload rejected, keeping the plans in force", "file", s.path, "reason", reason, "err", err)
		s.report(false)
		return err
	}
	if s.BeforeSwap != nil {
		s.BeforeSwap(s.cur.Load(), p)
	}
	s.cur.Store(p)
	s.goodSum, s.badSum, s.refused = sum, [sha256.Size]byte{}, false
	def := ""
	if p.Default != nil {
		def = p.Default.Name
	}
	s.log.Info("plans reloaded", "file", s.path, "reason", reason, "plans", len(p.ByName), "clients", p.Clients(), "default_plan", def)
	s.report(true)
	return nil
}

// parse parses and checks data, then collects the garbage parsing left.
// A parse allocates about 20 times the file's size (the YAML node tree:
// 90 MB for a file of 100,000 clients, 4.6 MB) and keeps a fraction of it
// (the plans). At the sidecar's GOGC of 400 the collector waits for the
// heap to grow to five times what its last cycle found live, often a
// cycle in the middle of a parse, so the garbage of each reload stayed:
// a sidecar with 100,000 clients went from 93 to 280 MiB resident over
// five reloads, past the Helm chart's 256 MiB limit. A collection after
// each parse, of a heap holding little more than the plans, returns the
// heap to the plans in force: 105 to 115 MiB over eight reloads.
func (s *Store) parse(data []byte) (*Plans, error) {
	defer runtime.GC()
	p, err := Parse(s.path, data)
	if err == nil && s.check != nil {
		err = s.check(p)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (s *Store) report(ok bool) {
	if s.onReload != nil {
		s.onReload(ok)
	}
}
