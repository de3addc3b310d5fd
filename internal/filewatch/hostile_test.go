package filewatch

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hugeDirEntries is the size of the directory in TestHugeDirectory.
const hugeDirEntries = 100_000

// within runs fn and fails the test if it does not return in time: the
// hostile cases must never hang the watcher.
func within(t testing.TB, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(notifyTimeout):
		t.Fatalf("%s did not return within %v", what, notifyTimeout)
	}
}

func countLines(logs, substr string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// Symlink loops: a path that is a loop, and links inside a watched
// directory to itself, its parent and each other. Each real directory is
// walked once, the loops are warned about once, the fingerprint is stable
// and the watcher still sees changes.
func TestSymlinkLoops(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	must(t, os.Symlink("b", a))
	must(t, os.Symlink("a", b))
	dir := filepath.Join(root, "conf")
	write(t, filepath.Join(dir, "x.yaml"), "x\n")
	must(t, os.Symlink(".", filepath.Join(dir, "self")))
	must(t, os.Symlink("..", filepath.Join(dir, "up")))
	must(t, os.Symlink(dir, filepath.Join(dir, "abs")))
	must(t, os.Symlink("c2", filepath.Join(dir, "c1")))
	must(t, os.Symlink("c1", filepath.Join(dir, "c2")))

	res := scan([]string{a, dir}, limits{maxDepth: DefaultMaxDepth, maxDirs: DefaultMaxDirs, maxEntries: DefaultMaxEntries})
	// conf, and root through "up" (root holds a, b and conf: walked once).
	if len(res.watches) != 2 {
		t.Errorf("watches: %d, want 2 (root and conf): %v", len(res.watches), keys(res.watches))
	}
	if got := strings.Count(res.problemText(), errLinkLoop.Error()); got != 4 {
		t.Errorf("loops reported: %d, want 4 (a, once though met twice; b, c1, c2 met through the walk): %s", got, res.problemText())
	}

	opts := Options{Debounce: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond, PollInterval: 5 * time.Millisecond}
	var h *harness
	within(t, "New and the first scan", func() { h = start(t, []string{a, dir}, opts) })
	h.expectQuiet(t, "polls over symlink loops", h.polls, h.polls()+3)
	if n := countLines(h.logs.String(), "too many levels of symbolic links"); n != 1 {
		t.Errorf("warnings about the loops: %d lines, want 1 (once, not every poll):\n%s", n, h.logs.String())
	}
	writeInPlace(t, filepath.Join(dir, "x.yaml"), "y\n")
	h.expectChange(t, "a file beside the loops")
	must(t, os.Remove(a))
	write(t, a, "now a file\n")
	h.expectChange(t, "the looping path replaced by a file")
}

func keys(m map[string]*dirWatch) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A directory of 100k entries: one scan looks at MaxEntries of them and
// says so once; inotify still sees a new file among them; polls over it
// stay quiet.
func TestHugeDirectory(t *testing.T) {
	dir := hugeDir(t)
	var res scanResult
	within(t, "a scan of the huge directory", func() {
		res = scan([]string{dir}, limits{maxDepth: DefaultMaxDepth, maxDirs: DefaultMaxDirs, maxEntries: DefaultMaxEntries})
	})
	if res.entries != DefaultMaxEntries {
		t.Errorf("entries looked at: %d, want the bound %d", res.entries, DefaultMaxEntries)
	}
	if !strings.Contains(res.problemText(), fmt.Sprintf("more than %d entries", DefaultMaxEntries)) {
		t.Errorf("problems: %q, want the entry bound named", res.problemText())
	}

	h := start(t, []string{dir}, Options{Debounce: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	h.expectQuiet(t, "polls of the huge directory", h.polls, h.polls()+3)
	if n := countLines(h.logs.String(), "more than 10000 entries"); n != 1 {
		t.Errorf("warnings about the bound: %d lines, want 1", n)
	}
	write(t, filepath.Join(dir, "zzz-new.yaml"), "x\n")
	h.expectChange(t, "a new file among 100k")
}

// hugeDir makes a directory of hugeDirEntries FIFOs (the cheapest entry to
// make), on tmpfs when the machine has one: the test is about the
// watcher's bounds, not the disk's speed.
func hugeDir(t testing.TB) string {
	t.Helper()
	return fifoDir(t, hugeDirEntries)
}

// fifoDir makes a directory of n FIFOs.
func fifoDir(t testing.TB, n int) string {
	t.Helper()
	base := ""
	var st syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	if syscall.Statfs("/dev/shm", &st) == nil && st.Type == tmpfsMagic {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "filewatch-huge-")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := []byte(dir + "/f000000")
	for i := range n {
		v := i
		for j := len(b) - 1; j >= len(b)-6; j-- {
			b[j] = byte('0' + v%10)
			v /= 10
		}
		if err := syscall.Mknod(string(b), syscall.S_IFIFO|0o644, 0); err != nil {
			t.Fatalf("mknod %s: %v", b, err)
		}
	}
	return dir
}

// A watched path that is a FIFO or a device: never opened, so the
// watcher cannot block on it; warned about; replacing it notifies.
func TestFIFOAndDevicePaths(t *testing.T) {
	root := t.TempDir()
	fifo := filepath.Join(root, "ratelimit.yaml")
	must(t, syscall.Mkfifo(fifo, 0o644))
	dir := filepath.Join(root, "conf")
	write(t, filepath.Join(dir, "a.yaml"), "a\n")
	must(t, syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644))
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var h *harness
			within(t, "New and the first scan", func() { h = start(t, []string{fifo, dir, "/dev/null"}, m.opts) })
			logs := h.logs.String()
			for _, p := range []string{fifo, "/dev/null"} {
				if !strings.Contains(logs, p+" is not a regular file or a directory") {
					t.Errorf("no warning naming %s:\n%s", p, logs)
				}
			}
			if strings.Contains(logs, "pipe.yaml") {
				t.Errorf("a FIFO inside a watched directory is an entry like any other, not a warning:\n%s", logs)
			}
			writeInPlace(t, filepath.Join(dir, "a.yaml"), "b\n")
			h.expectChange(t, "a file beside a FIFO")
		})
	}
	h := start(t, []string{fifo}, modes[0].opts)
	must(t, os.Remove(fifo))
	write(t, fifo, "limit: 1\n")
	h.expectChange(t, "the FIFO replaced by a file")
}

// A directory swapped for a FIFO between its stat and its open: opening
// it fails at once instead of waiting for a writer.
func TestWalkOpensNoFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "was-a-dir")
	must(t, syscall.Mkfifo(fifo, 0o644))
	s := &scanner{lim: limits{maxDepth: 1, maxDirs: 4, maxEntries: 4}, res: scanResult{watches: map[string]*dirWatch{}}, walked: map[string]bool{}}
	within(t, "walk of a FIFO", func() { s.walk(fifo, nil, 0) })
	if !strings.Contains(s.res.problemText(), "not a directory") {
		t.Fatalf("problems: %q, want the open refused as not a directory", s.res.problemText())
	}
}

// Depth and directory bounds hold, and are named.
func TestBounds(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "deep")
	p := deep
	for i := range 30 {
		p = filepath.Join(p, fmt.Sprintf("d%d", i))
	}
	must(t, os.MkdirAll(p, 0o755))
	wide := filepath.Join(root, "wide")
	for i := range 40 {
		must(t, os.MkdirAll(filepath.Join(wide, fmt.Sprintf("d%02d", i)), 0o755))
	}
	res := scan([]string{deep}, limits{maxDepth: 4, maxDirs: 100, maxEntries: 1000})
	if len(res.watches) != 6 { // root (for "deep") + deep and 4 levels below it
		t.Errorf("watches of a 30-deep tree with MaxDepth 4: %d, want 6", len(res.watches))
	}
	if !strings.Contains(res.problemText(), "deeper than 4 levels") {
		t.Errorf("problems: %q", res.problemText())
	}
	res = scan([]string{wide}, limits{maxDepth: 4, maxDirs: 8, maxEntries: 1000})
	if len(res.watches) != 8 {
		t.Errorf("watches of 40 directories with MaxDirs 8: %d, want 8", len(res.watches))
	}
	if !strings.Contains(res.problemText(), "more than 8 directories") {
		t.Errorf("problems: %q", res.problemText())
	}
	if res.dropped == 0 || len(res.problems) != maxProblems {
		t.Errorf("problems kept: %d (dropped %d), want %d kept and the rest counted", len(res.problems), res.dropped, maxProblems)
	}
}

// A path through a file ("file/x") is a clear problem, and watched: the
// file turning into a directory notifies.
func TestPathThroughAFile(t *testing.T) {
	root := t.TempDir()
	f := filepath.Join(root, "conf")
	write(t, f, "x\n")
	res := scan([]string{filepath.Join(f, "x.yaml")}, limits{maxDepth: 4, maxDirs: 8, maxEntries: 100})
	if !strings.Contains(res.problemText(), "not a directory") {
		t.Fatalf("problems: %q", res.problemText())
	}
	h := start(t, []string{filepath.Join(f, "x.yaml")}, modes[0].opts)
	must(t, os.Remove(f))
	write(t, filepath.Join(f, "x.yaml"), "y\n")
	h.expectChange(t, "the file replaced by a directory holding the path")
}
