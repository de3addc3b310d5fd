package filewatch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Defaults for the zero fields of Options.
const (
	DefaultDebounce     = 200 * time.Millisecond
	DefaultMaxDelay     = time.Second
	DefaultPollInterval = 2 * time.Second
	DefaultMaxDepth     = 16
	DefaultMaxDirs      = 1024
	DefaultMaxEntries   = 10000
)

// eventBuffer is the room for events between fsnotify's reader and Run;
// past it the kernel queues them, and past the kernel's queue an overflow
// is reported, which the watcher treats as a change.
const eventBuffer = 1024

// Options tune a Watcher. A zero field means its default.
type Options struct {
	// Debounce is how long the files must stay quiet after an event before
	// the change is reported: a burst of events (a ConfigMap update makes
	// several) gives one notification.
	Debounce time.Duration
	// MaxDelay bounds the wait from the first event of a burst to its
	// notification, so a burst that never goes quiet still notifies at
	// least this often. It must not be below Debounce.
	MaxDelay time.Duration
	// PollInterval is how often the fingerprint of every watched file is
	// compared, to catch what inotify missed (a dropped event, NFS, a
	// mount it cannot see). Negative turns polling off.
	PollInterval time.Duration
	// MaxDepth bounds how deep below a watched directory the watcher
	// descends (a watched directory itself is depth 0).
	MaxDepth int
	// MaxDirs bounds the directories watched with inotify, over all paths.
	MaxDirs int
	// MaxEntries bounds the directory entries one fingerprint looks at,
	// over all paths; entries past it are still covered by their
	// directory's inotify watch, not by the poll.
	MaxEntries int

	// noInotify makes the watcher rely on polling alone (tests of the
	// fallback).
	noInotify bool
}

func (o *Options) setDefaults() error {
	if o.Debounce < 0 || o.MaxDelay < 0 || o.MaxDepth < 0 || o.MaxDirs < 0 || o.MaxEntries < 0 {
		return errors.New("filewatch: Debounce, MaxDelay, MaxDepth, MaxDirs and MaxEntries must not be negative")
	}
	if o.Debounce == 0 {
		o.Debounce = DefaultDebounce
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = max(DefaultMaxDelay, o.Debounce)
	}
	if o.MaxDelay < o.Debounce {
		return fmt.Errorf("filewatch: MaxDelay %v is below Debounce %v", o.MaxDelay, o.Debounce)
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.MaxDepth == 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	if o.MaxDirs == 0 {
		o.MaxDirs = DefaultMaxDirs
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.noInotify && o.PollInterval < 0 {
		return errors.New("filewatch: nothing would watch: no inotify and no polling")
	}
	return nil
}

// Watcher reports changes to a set of files and directories on Changes.
// Its methods are safe for concurrent use; Run is called once.
type Watcher struct {
	paths    []string
	opts     Options
	lim      limits
	log      *slog.Logger
	changes  chan struct{}
	baseline scanResult // taken by New
	running  atomic.Bool

	// For tests: closed once Run has armed its first watches; counts of
	// polls, events ignored and notifications sent.
	armed    chan struct{}
	polls    atomic.Int64
	ignored  atomic.Int64
	notified atomic.Int64
}

// New checks the options and takes the first fingerprint of paths (files
// or directories; relative paths are taken from the working directory).
// A change made after New returns is reported once Run runs, so a caller
// may call New, load its configuration, then start Run without missing an
// edit. A path that does not exist yet, or cannot be read, is not an error:
// it is logged and watched until it appears. log may be nil.
func New(paths []string, opts Options, log *slog.Logger) (*Watcher, error) {
	if len(paths) == 0 {
		return nil, errors.New("filewatch: no path to watch")
	}
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abs := make([]string, 0, len(paths))
	for _, p := range paths {
		if p == "" {
			return nil, errors.New("filewatch: empty path")
		}
		a, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("filewatch: path %q: %w", p, err)
		}
		abs = append(abs, a)
	}
	w := &Watcher{
		paths:   abs,
		opts:    opts,
		lim:     limits{maxDepth: opts.MaxDepth, maxDirs: opts.MaxDirs, maxEntries: opts.MaxEntries},
		log:     log,
		changes: make(chan struct{}, 1),
		armed:   make(chan struct{}),
	}
	w.baseline = scan(w.paths, w.lim)
	if p := w.baseline.problemText(); p != "" {
		log.Warn("filewatch: cannot watch everything", "problems", p)
	}
	return w, nil
}

// Changes is a channel with room for one value: a change sends on it
// unless a notification is already waiting, so a receiver busy reloading
// gets one notification for any number of changes since. It is never
// closed.
func (w *Watcher) Changes() <-chan struct{} { return w.changes }

// Run watches until ctx ends, then releases its inotify instance and
// returns nil. When inotify cannot be used (no instances left, not
// supported) it logs a warning and relies on polling alone, or returns
// the error when polling is off; trouble with a single path is logged,
// never returned.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("filewatch: Run called twice")
	}
	r := &run{w: w, armed: make(map[string]armedDir), problems: w.baseline.problemText()}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if !w.opts.noInotify {
		fsw, err := fsnotify.NewBufferedWatcher(eventBuffer)
		switch {
		case err != nil && w.opts.PollInterval < 0:
			return fmt.Errorf("filewatch: inotify, with polling off: %w", err)
		case err != nil:
			// EMFILE here is the per-user instance limit,
			// fs.inotify.max_user_instances.
			w.log.Warn("filewatch: inotify unavailable, polling only", "interval", w.opts.PollInterval, "err", err)
		default:
			r.fsw = fsw
			defer fsw.Close()
			events, errs = fsw.Events, fsw.Errors
		}
	}
	return w.loop(ctx, r, events, errs)
}

// loop is Run's body: it arms the watches, then turns events, errors,
// polls and the debounce timer into notifications until ctx ends.
func (w *Watcher) loop(ctx context.Context, r *run, events <-chan fsnotify.Event, errs <-chan error) error {
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var poll <-chan time.Time
	if w.opts.PollInterval > 0 {
		t := time.NewTicker(w.opts.PollInterval)
		defer t.Stop()
		poll = t.C
	}

	// Arm, then compare with New's fingerprint: a change made between New
	// and now is reported rather than lost. From then on a poll reports a
	// change when the fingerprint moved since the scan before it (one
	// change is marked once, not at every poll until it is notified).
	res := r.rescan()
	last := res.fp
	close(w.armed)
	b := &burst{timer: debounce, debounce: w.opts.Debounce, maxDelay: w.opts.MaxDelay}
	if res.fp != w.baseline.fp {
		b.mark("changed before the watch started")
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if r.relevant(ev) {
				b.mark(ev.String())
			} else {
				w.ignored.Add(1)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.inotifyError(err, b)
		case <-poll:
			res := r.rescan()
			w.polls.Add(1)
			if res.fp != last {
				last = res.fp
				b.mark("poll: fingerprint changed")
			}
		case <-debounce.C:
			last = w.notify(r, b)
		}
	}
}

// burst is a burst of changes: from its first change to its notification.
// Its log is one line at the notification, whatever the number of events.
type burst struct {
	timer              *time.Timer // the debounce timer, stopped between bursts
	debounce, maxDelay time.Duration
	pending            bool
	first              time.Time
	firstWhy           string
	seen               int
	overflowed         bool // an inotify overflow was logged
}

// mark records a change and sets the timer to fire after debounce of
// quiet, and no later than maxDelay after the burst's first change.
func (b *burst) mark(why string) {
	now := time.Now()
	if !b.pending {
		b.pending, b.first, b.firstWhy, b.seen = true, now, why, 0
	}
	b.seen++
	b.timer.Reset(min(b.debounce, b.first.Add(b.maxDelay).Sub(now)))
}

// inotifyError handles an error of the inotify reader: an overflow lost
// events, so it is a change (logged once a burst); any other is logged.
func (w *Watcher) inotifyError(err error, b *burst) {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		if !b.overflowed {
			w.log.Warn("filewatch: inotify queue overflowed: events were lost, reading everything again")
			b.overflowed = true
		}
		b.mark("inotify overflow")
		return
	}
	w.log.Warn("filewatch: inotify", "err", err)
}

// notify ends burst b once its timer fired: it rescans, sends on Changes
// unless a notification is waiting already, and logs the burst. It
// returns the fingerprint the next poll compares with.
func (w *Watcher) notify(r *run, b *burst) fingerprint {
	b.pending, b.overflowed = false, false
	res := r.rescan()
	w.notified.Add(1)
	select {
	case w.changes <- struct{}{}:
	default: // one is waiting already
	}
	w.log.Debug("filewatch: changed", "first", b.firstWhy, "seen", b.seen, "after", time.Since(b.first))
	return res.fp
}

// armedDir is a directory with an inotify watch, and the identity of the
// directory it was added on.
type armedDir struct{ dev, ino uint64 }

// run is the state of one Run, owned by its goroutine.
type run struct {
	w        *Watcher
	fsw      *fsnotify.Watcher // nil: polling only
	armed    map[string]armedDir
	watches  map[string]*dirWatch // what the last scan asked for
	problems string               // the last scan's, as logged
}

// rescan walks the paths, re-arms the inotify watches to match and logs
// the problems when they changed.
func (r *run) rescan() scanResult {
	res := scan(r.w.paths, r.w.lim)
	r.watches = res.watches
	for _, p := range r.arm() {
		res.addProblem(p)
	}
	if p := res.problemText(); p != r.problems {
		r.problems = p
		if p == "" {
			r.w.log.Info("filewatch: every path is watched again")
		} else {
			r.w.log.Warn("filewatch: cannot watch everything", "problems", p)
		}
	}
	return res
}

// arm adds the watches the last scan asked for and removes the others. A
// directory whose identity changed under the same path (swapped, removed
// and recreated) is watched anew. It returns what it could not watch.
func (r *run) arm() (problems []string) {
	if r.fsw == nil {
		return nil
	}
	for dir, a := range r.armed {
		want, ok := r.watches[dir]
		if ok && (want.ino == 0 || (want.dev == a.dev && want.ino == a.ino)) {
			continue
		}
		_ = r.fsw.Remove(dir) // gone already when the directory was removed
		delete(r.armed, dir)
	}
	for dir, want := range r.watches {
		if _, ok := r.armed[dir]; ok {
			continue
		}
		if err := r.fsw.Add(dir); err != nil {
			// Removed since the scan (the next event or poll tells), or out
			// of inotify watches (fs.inotify.max_user_watches): the poll
			// covers it, and the next scan tries again.
			switch {
			case errors.Is(err, fs.ErrNotExist):
			case errors.Is(err, syscall.ENOSPC):
				problems = append(problems, fmt.Sprintf("inotify watch on %s: out of watches (sysctl fs.inotify.max_user_watches): left to the poll", dir))
			default:
				problems = append(problems, fmt.Sprintf("inotify watch on %s: %v: left to the poll", dir, err))
			}
			continue
		}
		r.armed[dir] = armedDir{dev: want.dev, ino: want.ino}
	}
	return problems
}

// relevant reports whether an inotify event concerns the watched paths:
// an entry of a directory watched whole, a name a filtered directory is
// watched for, or a watched directory itself going away.
func (r *run) relevant(ev fsnotify.Event) bool {
	if _, ok := r.watches[ev.Name]; ok {
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			// Its inotify watch is gone or follows the moved directory:
			// the next scan watches the path anew.
			if _, armed := r.armed[ev.Name]; armed {
				_ = r.fsw.Remove(ev.Name)
				delete(r.armed, ev.Name)
			}
			return true
		}
	}
	d, ok := r.watches[filepath.Dir(ev.Name)]
	return ok && d.relevant(filepath.Base(ev.Name))
}
