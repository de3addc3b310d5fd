package filewatch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// notifyTimeout is how long a test waits for a notification that must
// come: generous, as the machine may be busy.
const notifyTimeout = 5 * time.Second

// mode is one way of seeing changes: each must-notify case runs under
// both, so each is shown to catch every case on its own.
type mode struct {
	name string
	opts Options
}

var modes = []mode{
	// inotify alone: polling off, so only an event can notify.
	{"inotify", Options{Debounce: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, PollInterval: -1}},
	// The poll alone: what a dropped event or a filesystem without inotify
	// leaves.
	{"poll", Options{Debounce: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond, PollInterval: 15 * time.Millisecond, noInotify: true}},
}

// harness is a running Watcher and its log.
type harness struct {
	w    *Watcher
	logs *logbuf.Buffer
}

// start runs a Watcher on paths until the test ends, and waits until its
// first watches are armed. Cleanup checks that Run returns and leaves no
// goroutine behind.
func start(t *testing.T, paths []string, opts Options) *harness {
	t.Helper()
	goroutines := runtime.NumGoroutine()
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := New(paths, opts, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(notifyTimeout):
			t.Errorf("Run did not return after its context ended")
			return
		}
		if err := poll.Wait(notifyTimeout, 10*time.Millisecond, func() error {
			if n := runtime.NumGoroutine(); n > goroutines {
				return fmt.Errorf("%d goroutines, %d before the watcher", n, goroutines)
			}
			return nil
		}); err != nil {
			t.Errorf("goroutine leak: %v", err)
		}
		if t.Failed() {
			t.Logf("watcher log:\n%s", logs.String())
		}
	})
	select {
	case <-w.armed:
	case err := <-done:
		t.Fatalf("Run returned before arming: %v", err)
	case <-time.After(notifyTimeout):
		t.Fatalf("Run did not arm its watches")
	}
	return &harness{w: w, logs: logs}
}

// expectChange waits for a notification.
func (h *harness) expectChange(t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.w.Changes():
	case <-time.After(notifyTimeout):
		t.Fatalf("%s: no notification within %v", what, notifyTimeout)
	}
}

// expectQuiet waits until the watcher has looked target times (polls, or
// ignored events; the caller reads the count before its changes) and
// asserts that nothing was notified meanwhile.
func (h *harness) expectQuiet(t *testing.T, what string, looked func() int64, target int64) {
	t.Helper()
	poll.Until(t, notifyTimeout, 5*time.Millisecond, func() error {
		if got := looked(); got < target && h.w.notified.Load() == 0 {
			return fmt.Errorf("%s: the watcher looked %d times, want %d", what, got, target)
		}
		return nil
	})
	// Past the debounce of anything the last look may have started.
	time.Sleep(3 * h.w.opts.Debounce)
	select {
	case <-h.w.Changes():
		t.Fatalf("%s: notified, yet nothing watched changed", what)
	default:
	}
	if got := h.w.notified.Load(); got != 0 {
		t.Fatalf("%s: %d notifications sent", what, got)
	}
}

func (h *harness) polls() int64   { return h.w.polls.Load() }
func (h *harness) ignored() int64 { return h.w.ignored.Load() }

func write(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writeInPlace rewrites an existing file through the same inode, keeping
// its size: only the content and the times change.
func writeInPlace(t testing.TB, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt([]byte(data), 0)
	must(t, err)
	must(t, f.Close())
}

// configMap is a directory written as the kubelet's AtomicWriter writes
// a ConfigMap volume: each key a symlink "key -> ..data/key", "..data" a
// symlink to a timestamped directory holding the files.
type configMap struct {
	t   testing.TB
	dir string
	ts  string // the current timestamped directory's name
}

func newConfigMap(t testing.TB, dir string, files map[string]string) *configMap {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	c := &configMap{t: t, dir: dir}
	c.update(files)
	return c
}

// update is AtomicWriter.Write, step by step: write the payload into a new
// timestamped directory (os.MkdirTemp with the writer's pattern), create
// the user-visible symlinks of new keys, create "..data_tmp" pointing at
// the new directory and rename it over "..data", remove the symlinks of
// keys that are gone, remove the old timestamped directory.
func (c *configMap) update(files map[string]string) {
	t := c.t
	t.Helper()
	ts, err := os.MkdirTemp(c.dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	must(t, err)
	must(t, os.Chmod(ts, 0o755))
	for name, data := range files {
		must(t, os.WriteFile(filepath.Join(ts, name), []byte(data), 0o644))
		must(t, os.Chmod(filepath.Join(ts, name), 0o644))
	}
	for name := range files {
		link := filepath.Join(c.dir, name)
		if _, err := os.Readlink(link); errors.Is(err, fs.ErrNotExist) {
			must(t, os.Symlink(filepath.Join("..data", name), link))
		}
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	must(t, os.Symlink(filepath.Base(ts), tmp))
	must(t, os.Rename(tmp, filepath.Join(c.dir, "..data")))
	if c.ts != "" {
		old, err := os.ReadDir(filepath.Join(c.dir, c.ts))
		must(t, err)
		for _, e := range old {
			if _, ok := files[e.Name()]; !ok {
				must(t, os.Remove(filepath.Join(c.dir, e.Name())))
			}
		}
		must(t, os.RemoveAll(filepath.Join(c.dir, c.ts)))
	}
	c.ts = filepath.Base(ts)
}

// swapSymlink is `ln -sfn target link`: a symlink made at a temporary name
// and renamed over link.
func swapSymlink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	must(t, os.Symlink(target, tmp))
	must(t, os.Rename(tmp, link))
}

// Every case that must notify, under inotify alone and under the poll
// alone.
func TestNotifies(t *testing.T) {
	cases := []struct {
		name string
		// setup lays out the tree and returns the paths to watch and the
		// changes to make, in order; each must notify.
		setup func(t *testing.T, root string) ([]string, []func())
	}{
		{"write in place", func(t *testing.T, root string) ([]string, []func()) {
			f := filepath.Join(root, "ratelimit.yaml")
			write(t, f, "limit: 1\n")
			return []string{f}, []func(){
				func() { writeInPlace(t, f, "limit: 2\n") },
				func() { writeInPlace(t, f, "limit: 3\n") },
			}
		}},
		{"write in place, directory watched", func(t *testing.T, root string) ([]string, []func()) {
			f := filepath.Join(root, "conf", "sub", "a.yaml")
			write(t, f, "limit: 1\n")
			return []string{filepath.Join(root, "conf")}, []func(){
				func() { writeInPlace(t, f, "limit: 2\n") },
			}
		}},
		{"editor rename-over", func(t *testing.T, root string) ([]string, []func()) {
			f := filepath.Join(root, "ratelimit.yaml")
			write(t, f, "limit: 1\n")
			over := func(data string) func() {
				return func() {
					write(t, f+".swp", data)
					must(t, os.Rename(f+".swp", f))
				}
			}
			return []string{f}, []func(){over("limit: 2\n"), over("limit: 3\n")}
		}},
		{"delete and recreate", func(t *testing.T, root string) ([]string, []func()) {
			f := filepath.Join(root, "ratelimit.yaml")
			write(t, f, "limit: 1\n")
			return []string{f}, []func(){
				func() { must(t, os.Remove(f)) },
				func() { write(t, f, "limit: 2\n") },
				func() { writeInPlace(t, f, "limit: 3\n") },
			}
		}},
		{"ConfigMap, directory watched", func(t *testing.T, root string) ([]string, []func()) {
			dir := filepath.Join(root, "etc", "ratelimit")
			c := newConfigMap(t, dir, map[string]string{"ratelimit.yaml": "limit: 1\n", "other.yaml": "x\n"})
			return []string{dir}, []func(){
				func() { c.update(map[string]string{"ratelimit.yaml": "limit: 2\n", "other.yaml": "x\n"}) },
				func() { c.update(map[string]string{"ratelimit.yaml": "limit: 2\n", "new.yaml": "y\n"}) },
				func() { c.update(map[string]string{"ratelimit.yaml": "limit: 3\n"}) },
			}
		}},
		{"ConfigMap, key file watched", func(t *testing.T, root string) ([]string, []func()) {
			dir := filepath.Join(root, "etc", "ratelimit")
			c := newConfigMap(t, dir, map[string]string{"ratelimit.yaml": "limit: 1\n"})
			return []string{filepath.Join(dir, "ratelimit.yaml")}, []func(){
				func() { c.update(map[string]string{"ratelimit.yaml": "limit: 2\n"}) },
				func() { c.update(map[string]string{"ratelimit.yaml": "limit: 3\n", "other.yaml": "x\n"}) },
			}
		}},
		{"RUNTIME_WATCH_ROOT: current swapped", func(t *testing.T, root string) ([]string, []func()) {
			rt := filepath.Join(root, "srv", "runtime_data")
			write(t, filepath.Join(rt, "v1", "ratelimit", "config", "a.yaml"), "domain: a\n")
			write(t, filepath.Join(rt, "v2", "ratelimit", "config", "a.yaml"), "domain: b\n")
			write(t, filepath.Join(rt, "v3", "ratelimit", "config", "a.yaml"), "domain: c\n")
			must(t, os.Symlink("v1", filepath.Join(rt, "current")))
			cur := filepath.Join(rt, "current")
			return []string{cur}, []func(){
				func() { swapSymlink(t, "v2", cur) },
				func() { writeInPlace(t, filepath.Join(rt, "v2", "ratelimit", "config", "a.yaml"), "domain: B\n") },
				func() { swapSymlink(t, filepath.Join(rt, "v3"), cur) },
			}
		}},
		{"RUNTIME_WATCH_ROOT: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY watched", func(t *testing.T, root string) ([]string, []func()) {
			rt := filepath.Join(root, "srv", "runtime_data")
			write(t, filepath.Join(rt, "v1", "ratelimit", "config", "a.yaml"), "domain: a\n")
			cur := filepath.Join(rt, "current")
			must(t, os.Symlink("v1", cur))
			return []string{filepath.Join(cur, "ratelimit")}, []func(){
				func() {
					write(t, filepath.Join(rt, "v2", "ratelimit", "config", "a.yaml"), "domain: b\n")
					swapSymlink(t, "v2", cur)
				},
				func() {
					write(t, filepath.Join(rt, "v3", "ratelimit", "config", "a.yaml"), "domain: c\n")
					swapSymlink(t, "v3", cur)
					must(t, os.RemoveAll(filepath.Join(rt, "v1")))
				},
			}
		}},
		{"RUNTIME_WATCH_ROOT=false: config directory through current", func(t *testing.T, root string) ([]string, []func()) {
			rt := filepath.Join(root, "srv", "runtime_data")
			write(t, filepath.Join(rt, "v1", "ratelimit", "config", "a.yaml"), "domain: a\n")
			write(t, filepath.Join(rt, "v2", "ratelimit", "config", "a.yaml"), "domain: b\n")
			cur := filepath.Join(rt, "current")
			must(t, os.Symlink("v1", cur))
			return []string{filepath.Join(cur, "ratelimit", "config")}, []func(){
				func() { write(t, filepath.Join(rt, "v1", "ratelimit", "config", "b.yaml"), "domain: x\n") },
				func() { swapSymlink(t, "v2", cur) },
				func() { must(t, os.Remove(filepath.Join(rt, "v2", "ratelimit", "config", "a.yaml"))) },
			}
		}},
		{"directory appears later", func(t *testing.T, root string) ([]string, []func()) {
			dir := filepath.Join(root, "not", "yet", "config")
			return []string{dir}, []func(){
				func() { write(t, filepath.Join(dir, "a.yaml"), "domain: a\n") },
				func() { write(t, filepath.Join(dir, "deeper", "b.yaml"), "domain: b\n") },
				func() { writeInPlace(t, filepath.Join(dir, "deeper", "b.yaml"), "domain: c\n") },
			}
		}},
		{"directory removed and recreated", func(t *testing.T, root string) ([]string, []func()) {
			dir := filepath.Join(root, "config")
			write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
			return []string{dir}, []func(){
				func() { must(t, os.RemoveAll(dir)) },
				func() { write(t, filepath.Join(dir, "a.yaml"), "domain: b\n") },
				func() { writeInPlace(t, filepath.Join(dir, "a.yaml"), "domain: c\n") },
			}
		}},
		{"directory renamed over", func(t *testing.T, root string) ([]string, []func()) {
			dir := filepath.Join(root, "config")
			write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
			return []string{dir}, []func(){
				func() {
					write(t, filepath.Join(root, "config.new", "a.yaml"), "domain: b\n")
					must(t, os.Rename(dir, filepath.Join(root, "config.old")))
					must(t, os.Rename(filepath.Join(root, "config.new"), dir))
				},
				func() { writeInPlace(t, filepath.Join(dir, "a.yaml"), "domain: c\n") },
				// The old directory, moved away, is no longer watched.
			}
		}},
		{"subdirectory created after start", func(t *testing.T, root string) ([]string, []func()) {
			dir := filepath.Join(root, "config")
			must(t, os.MkdirAll(dir, 0o755))
			return []string{dir}, []func(){
				func() { must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755)) },
				func() { write(t, filepath.Join(dir, "sub", "a.yaml"), "x\n") },
				func() { must(t, os.Chmod(filepath.Join(dir, "sub", "a.yaml"), 0o600)) },
			}
		}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					root := t.TempDir()
					paths, changes := tc.setup(t, root)
					h := start(t, paths, m.opts)
					for i, change := range changes {
						// Each change comes after the last notification, so
						// it is seen by watches re-armed after it.
						change()
						h.expectChange(t, fmt.Sprintf("change %d", i+1))
					}
				})
			}
		})
	}
}

// A change made after New and before Run is reported, not lost: a
// caller may load its configuration between the two.
func TestChangeBeforeRun(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "ratelimit.yaml")
			write(t, f, "limit: 1\n")
			w, err := New([]string{f}, m.opts, nil)
			must(t, err)
			write(t, f, "limit: 22\n")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			defer func() { cancel(); <-done }()
			select {
			case <-w.Changes():
			case <-time.After(notifyTimeout):
				t.Fatal("a change between New and Run was not reported")
			}
		})
	}
}

// Nothing changed: the fingerprint is stable over polls, across files,
// symlinked directories and a ConfigMap layout, and no event fires.
func TestQuietWhenNothingChanges(t *testing.T) {
	root := t.TempDir()
	newConfigMap(t, filepath.Join(root, "cm"), map[string]string{"a.yaml": "a\n", "b.yaml": "b\n"})
	write(t, filepath.Join(root, "rt", "v1", "config", "a.yaml"), "a\n")
	must(t, os.Symlink("v1", filepath.Join(root, "rt", "current")))
	write(t, filepath.Join(root, "plain", "x", "y.yaml"), "y\n")
	paths := []string{filepath.Join(root, "cm"), filepath.Join(root, "rt", "current"), filepath.Join(root, "plain"), filepath.Join(root, "missing")}
	h := start(t, paths, Options{Debounce: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond, PollInterval: 5 * time.Millisecond})
	h.expectQuiet(t, "three polls of an unchanged tree", h.polls, h.polls()+3)
}

// A change beside the watched paths does not notify: not a sibling of a
// watched file, not a file in a directory outside the paths.
func TestQuietForSiblings(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			root := t.TempDir()
			f := filepath.Join(root, "conf", "ratelimit.yaml")
			write(t, f, "limit: 1\n")
			write(t, filepath.Join(root, "conf", "sibling.yaml"), "x\n")
			write(t, filepath.Join(root, "other", "x.yaml"), "x\n")
			cm := newConfigMap(t, filepath.Join(root, "cm"), map[string]string{"watched.yaml": "a\n", "unwatched.yaml": "b\n"})
			h := start(t, []string{f, filepath.Join(root, "cm", "watched.yaml")}, m.opts)
			polls, ignored := h.polls(), h.ignored()
			writeInPlace(t, filepath.Join(root, "conf", "sibling.yaml"), "y\n")
			write(t, filepath.Join(root, "conf", "new.yaml"), "z\n")
			must(t, os.Rename(filepath.Join(root, "conf", "new.yaml"), filepath.Join(root, "conf", "renamed.yaml")))
			writeInPlace(t, filepath.Join(root, "other", "x.yaml"), "y\n")
			writeInPlace(t, filepath.Join(root, "cm", cm.ts, "unwatched.yaml"), "c\n")
			if m.opts.noInotify {
				h.expectQuiet(t, "siblings changed", h.polls, polls+3)
			} else {
				h.expectQuiet(t, "siblings changed", h.ignored, ignored+4)
			}
			// The watch is alive: the watched file still notifies.
			writeInPlace(t, f, "limit: 2\n")
			h.expectChange(t, "the watched file, after its siblings")
		})
	}
}

// A burst of events gives one notification once it is quiet.
func TestDebounceCoalescesABurst(t *testing.T) {
	dir := t.TempDir()
	h := start(t, []string{dir}, Options{Debounce: 250 * time.Millisecond, MaxDelay: 10 * time.Second, PollInterval: -1})
	for i := range 50 {
		write(t, filepath.Join(dir, fmt.Sprintf("f%d.yaml", i)), "x\n")
	}
	h.expectChange(t, "a burst of 50 writes")
	if got := h.w.notified.Load(); got != 1 {
		t.Fatalf("notifications for one burst: %d, want 1", got)
	}
	h.expectQuiet2(t)
}

// expectQuiet2 asserts that no further notification follows within a few
// debounce periods (nothing changes any more).
func (h *harness) expectQuiet2(t *testing.T) {
	t.Helper()
	before := h.w.notified.Load()
	time.Sleep(2 * h.w.opts.Debounce)
	if got := h.w.notified.Load(); got != before {
		t.Fatalf("%d more notifications after the burst", got-before)
	}
}

// A burst that never goes quiet still notifies, every MaxDelay.
func TestMaxDelayBoundsAnEndlessBurst(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "busy.yaml")
	write(t, f, "0000\n")
	h := start(t, []string{dir}, Options{Debounce: 100 * time.Millisecond, MaxDelay: 150 * time.Millisecond, PollInterval: -1})
	stop := make(chan struct{})
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		deadline := time.After(2 * notifyTimeout)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-deadline:
				return
			case <-time.After(2 * time.Millisecond):
			}
			writeInPlace(t, f, fmt.Sprintf("%04d\n", i%10000))
		}
	}()
	defer func() { close(stop); <-writing }()
	for i := range 2 {
		h.expectChange(t, fmt.Sprintf("notification %d during the burst", i+1))
		select {
		case <-writing:
			t.Fatal("the writer had stopped: the notification was not the burst's")
		default:
		}
	}
}

// Changes coalesce: a receiver that does not read gets one value waiting,
// whatever the number of changes.
func TestChangesCoalesce(t *testing.T) {
	f := filepath.Join(t.TempDir(), "a.yaml")
	write(t, f, "1\n")
	h := start(t, []string{f}, modes[0].opts)
	for i := range 3 {
		writeInPlace(t, f, fmt.Sprintf("%d\n", i+2))
		want := int64(i + 1)
		poll.UntilTrue(t, notifyTimeout, 5*time.Millisecond, func() bool { return h.w.notified.Load() >= want })
	}
	if n := len(h.w.Changes()); n != 1 {
		t.Fatalf("values waiting after 3 notifications: %d, want 1", n)
	}
	<-h.w.Changes()
	if n := len(h.w.Changes()); n != 0 {
		t.Fatalf("values waiting after one read: %d, want 0", n)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		paths []string
		opts  Options
		want  string
	}{
		"no path":           {nil, Options{}, "no path"},
		"empty path":        {[]string{""}, Options{}, "empty path"},
		"negative debounce": {[]string{"."}, Options{Debounce: -1}, "negative"},
		"negative bound":    {[]string{"."}, Options{MaxDirs: -1}, "negative"},
		"max delay short":   {[]string{"."}, Options{Debounce: time.Second, MaxDelay: time.Millisecond}, "below Debounce"},
		"nothing watches":   {[]string{"."}, Options{PollInterval: -1, noInotify: true}, "nothing would watch"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.paths, tc.opts, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	w, err := New([]string{t.TempDir()}, Options{}, nil)
	must(t, err)
	want := Options{Debounce: DefaultDebounce, MaxDelay: DefaultMaxDelay, PollInterval: DefaultPollInterval,
		MaxDepth: DefaultMaxDepth, MaxDirs: DefaultMaxDirs, MaxEntries: DefaultMaxEntries}
	if w.opts != want {
		t.Fatalf("defaults: %+v, want %+v", w.opts, want)
	}
	// A Debounce above the default MaxDelay raises MaxDelay to it.
	w, err = New([]string{t.TempDir()}, Options{Debounce: 3 * time.Second}, nil)
	must(t, err)
	if w.opts.MaxDelay != 3*time.Second {
		t.Fatalf("MaxDelay with Debounce 3s: %v", w.opts.MaxDelay)
	}
}

func TestRunTwice(t *testing.T) {
	h := start(t, []string{t.TempDir()}, modes[0].opts)
	if err := h.w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Run: %v", err)
	}
}

// A watched directory moved away is forgotten: its inotify watch, which
// follows the inode, no longer reports, and its new name is not watched.
func TestMovedAwayDirectoryIsForgotten(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	write(t, filepath.Join(dir, "a.yaml"), "a\n")
	// A debounce long enough that the rename's events are one burst even
	// on a busy machine.
	h := start(t, []string{dir}, Options{Debounce: 100 * time.Millisecond, MaxDelay: time.Second, PollInterval: -1})
	must(t, os.Rename(dir, filepath.Join(root, "config.old")))
	h.expectChange(t, "the directory moved away")
	writeInPlace(t, filepath.Join(root, "config.old", "a.yaml"), "b\n")
	time.Sleep(3 * h.w.opts.Debounce)
	select {
	case <-h.w.Changes():
		t.Fatal("a write in the moved-away directory notified")
	default:
	}
	write(t, filepath.Join(dir, "a.yaml"), "c\n")
	h.expectChange(t, "the directory recreated")
}

// envoyproxy/ratelimit's layout: writing the next version beside the
// current one is not a change; the swap of "current" is.
func TestQuietWhileANewVersionIsStaged(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			rt := filepath.Join(t.TempDir(), "runtime_data")
			write(t, filepath.Join(rt, "v1", "ratelimit", "config", "a.yaml"), "domain: a\n")
			cur := filepath.Join(rt, "current")
			must(t, os.Symlink("v1", cur))
			h := start(t, []string{filepath.Join(cur, "ratelimit")}, m.opts)
			polls, ignored := h.polls(), h.ignored()
			write(t, filepath.Join(rt, "v2", "ratelimit", "config", "a.yaml"), "domain: b\n")
			if m.opts.noInotify {
				h.expectQuiet(t, "v2 staged", h.polls, polls+3)
			} else {
				h.expectQuiet(t, "v2 staged", h.ignored, ignored+1)
			}
			swapSymlink(t, "v2", cur)
			h.expectChange(t, "current swapped to v2")
		})
	}
}

// The loop's handling of what inotify reports, fed by hand: an overflow
// (events were lost) notifies; an unrelated event does not; another
// error is logged and changes nothing.
func TestLoopOverflowAndErrors(t *testing.T) {
	root := t.TempDir()
	f := filepath.Join(root, "a.yaml")
	write(t, f, "a\n")
	logs := &logbuf.Buffer{}
	w, err := New([]string{f}, Options{Debounce: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, PollInterval: -1},
		slog.New(slog.NewTextHandler(logs, nil)))
	must(t, err)
	events := make(chan fsnotify.Event)
	errs := make(chan error)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.loop(ctx, &run{w: w, armed: map[string]armedDir{}}, events, errs) }()
	defer func() { cancel(); <-done }()
	<-w.armed
	h := &harness{w: w, logs: logs}

	events <- fsnotify.Event{Name: filepath.Join(root, "other.yaml"), Op: fsnotify.Write}
	errs <- errors.New("some inotify trouble")
	time.Sleep(5 * w.opts.Debounce)
	if got := w.notified.Load(); got != 0 {
		t.Fatalf("notified %d times for an unrelated event and an error", got)
	}
	if !strings.Contains(logs.String(), "some inotify trouble") {
		t.Errorf("the error was not logged:\n%s", logs.String())
	}
	errs <- fsnotify.ErrEventOverflow
	h.expectChange(t, "an inotify queue overflow")
	errs <- fsnotify.ErrEventOverflow
	h.expectChange(t, "a second overflow")
	if n := countLines(logs.String(), "overflowed"); n != 2 {
		t.Errorf("overflow warnings: %d, want one per burst (2)", n)
	}
	events <- fsnotify.Event{Name: f, Op: fsnotify.Write}
	h.expectChange(t, "an event on the watched file")
}
