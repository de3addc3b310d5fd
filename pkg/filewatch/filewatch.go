package filewatch

import (
	"context"
	"errors"
	"log/slog"
	"time"
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
	// MaxDirs bounds the directories watched with inotify and walked by
	// the fingerprint, over all paths.
	MaxDirs int
	// MaxEntries bounds the directory entries one fingerprint looks at,
	// over all paths; entries past it are still covered by their
	// directory's inotify watch, not by the poll.
	MaxEntries int
}

// Watcher reports changes to a set of files and directories on Changes.
// Its methods are safe for concurrent use; Run is called once.
type Watcher struct {
	changes chan struct{}
}

// New checks the options and takes the first fingerprint of paths (files
// or directories; relative paths are taken from the working directory).
// A change made after New returns is reported once Run runs, so a caller
// may call New, load its configuration, then start Run without missing an
// edit. A path that does not exist yet, or cannot be read, is not an error:
// it is logged and watched until it appears. log may be nil.
func New(paths []string, opts Options, log *slog.Logger) (*Watcher, error) {
	return nil, errors.New("filewatch: todo")
}

// Changes is a channel with room for one value: a change sends on it
// unless a notification is already waiting, so a receiver busy reloading
// gets one notification for any number of changes since. It is never
// closed.
func (w *Watcher) Changes() <-chan struct{} { return w.changes }

// Run watches until ctx ends, then releases its inotify instance and
// returns nil. When inotify cannot be used (no instances left, not
// supported) it logs a warning and relies on polling alone; trouble with
// a single path is logged, never returned.
func (w *Watcher) Run(ctx context.Context) error {
	return errors.New("filewatch: todo")
}
