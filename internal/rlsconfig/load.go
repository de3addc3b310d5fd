package rlsconfig

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

// ErrNoSubdirectory is returned by Load, with an empty Config, for
// RUNTIME_WATCH_ROOT=true and an empty RUNTIME_SUBDIRECTORY: upstream
// loads nothing then (no rule applies), and so does Load; the caller
// decides whether to serve that and should say so loudly.
var ErrNoSubdirectory = errors.New("rlsconfig: RUNTIME_SUBDIRECTORY is empty while RUNTIME_WATCH_ROOT is true, so no configuration is loaded (as envoyproxy/ratelimit); set RUNTIME_SUBDIRECTORY, or RUNTIME_WATCH_ROOT=false")

// Bounds on what Load reads, besides Parse's own.
const (
	// MaxFiles bounds the configuration files read.
	MaxFiles = 1000
	// MaxEntries bounds the directory entries looked at.
	MaxEntries = 10_000
	// MaxDirDepth bounds how deep Load descends below ConfigDir.
	MaxDirDepth = 16
	// MaxTotalBytes bounds the bytes of all files read.
	MaxTotalBytes = 16 << 20
)

func (l Layout) appDir() string {
	if l.AppDirectory == "" {
		return "config"
	}
	return l.AppDirectory
}

// ConfigDir is the directory Load walks: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY
// with WatchRoot (where files whose key starts with AppDirectory + "." are
// the configuration), RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
// without (where every file is).
func (l Layout) ConfigDir() string {
	if l.WatchRoot {
		return filepath.Join(l.Root, l.Subdirectory)
	}
	return filepath.Join(l.Root, l.Subdirectory, l.appDir())
}

// WatchPaths lists the paths a watcher must watch to see every change
// Load would read: ConfigDir alone. With WatchRoot, Root is the symlink
// that is swapped to a new version; a watcher that follows the links along
// the path (package filewatch does) sees the swap by the name in Root's
// parent without walking the versions staged beside it, so a staged version
// is not a change.
func (l Layout) WatchPaths() []string { return []string{l.ConfigDir()} }

// Load reads the configuration files of the layout and parses them; the
// files are named by their paths in problems.
//
// Which files: with WatchRoot, every regular file below ConfigDir whose
// goruntime key (its path below ConfigDir, '/' replaced by '.') starts
// with AppDirectory + "." (directories that cannot hold such a key are not
// read at all); without, every regular file below ConfigDir.
// Entries whose name starts with ".." are always skipped: they are a
// Kubernetes ConfigMap's internals (the ..data link and the ..<timestamp>
// directory it points to), whose copies of the files would otherwise be
// loaded a second time (envoyproxy/ratelimit's "duplicate domain" trap
// without RUNTIME_IGNOREDOTFILES). IgnoreDotfiles also skips every other
// name starting with ".". Symbolic links are followed (a ConfigMap's files
// are links into ..data); a directory that contains itself is a problem.
// A file that is neither regular nor a directory (a named pipe, a device)
// is a problem, never opened for reading blocking. Sizes, counts and depth
// are bounded (MaxFiles, MaxEntries, MaxDirDepth, MaxTotalBytes,
// MaxFileBytes), each a problem when exceeded.
func Load(l Layout, opts Options) (*Config, error) {
	if l.WatchRoot && l.Subdirectory == "" {
		cfg, err := Parse(nil, opts)
		if err != nil {
			return nil, err
		}
		return cfg, ErrNoSubdirectory
	}
	return load(l, l.ConfigDir(), opts)
}

// LoadDir reads every regular file below dir, as Load does with
// WatchRoot false and dir as its ConfigDir (upstream's config_check
// -config_dir, which reads the same files).
func LoadDir(dir string, ignoreDotfiles bool, opts Options) (*Config, error) {
	cfg, err := load(Layout{IgnoreDotfiles: ignoreDotfiles}, dir, opts)
	if ps, ok := problem.As(err); ok {
		// Given the runtime directory instead of its config directory:
		// say where the descriptor files are.
		if fi, serr := os.Stat(filepath.Join(dir, "config")); serr == nil && fi.IsDir() {
			sub := filepath.Join(dir, "config")
			ps = append(ps, problem.Problem{File: dir, Msg: fmt.Sprintf("holds a config directory, as envoyproxy/ratelimit's runtime layout has it: its descriptor files are read from %s (--rls-config-dir %s), and every file below %s is read as one", sub, sub, dir)})
			return nil, ps
		}
	}
	return cfg, err
}

func load(l Layout, dir string, opts Options) (*Config, error) {
	r := &reader{layout: l, root: dir}
	r.walk(r.root, "", nil)
	if len(r.problems) > 0 {
		return nil, r.problems
	}
	return Parse(r.files, opts)
}

type reader struct {
	layout   Layout
	root     string
	files    []File
	bytes    int
	entries  int
	problems problem.List
	stop     bool // a bound was reached and reported
}

func (r *reader) problem(path, format string, args ...any) {
	r.problems = append(r.problems, problem.Problem{File: path, Msg: fmt.Sprintf(format, args...)})
}

// walk reads directory dir (rel below the root); ancestors are the
// directories above it, for loop detection.
func (r *reader) walk(dir, rel string, ancestors []os.FileInfo) {
	fi, err := os.Stat(dir)
	if err != nil {
		r.problem(dir, "cannot read the configuration directory: %v", err)
		return
	}
	if !fi.IsDir() {
		r.problem(dir, "is not a directory (%s)", fileType(fi))
		return
	}
	for _, a := range ancestors {
		if os.SameFile(a, fi) {
			r.problem(dir, "a symbolic link loop: this directory contains itself")
			return
		}
	}
	if len(ancestors) >= MaxDirDepth {
		r.problem(dir, "directories nest deeper than %d levels below %s", MaxDirDepth, r.root)
		return
	}
	ancestors = append(ancestors, fi)
	names, ok := r.readNames(dir)
	if !ok {
		return
	}
	for _, name := range names {
		if r.stop {
			return
		}
		if strings.HasPrefix(name, "..") || r.layout.IgnoreDotfiles && strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		key := name
		if rel != "" {
			key = rel + "." + name
		}
		fi, err := os.Stat(path)
		if err != nil {
			r.problem(path, "cannot read: %v", err)
			continue
		}
		if fi.IsDir() {
			if r.mayHold(key) {
				r.walk(path, key, ancestors)
			}
			continue
		}
		if r.layout.WatchRoot && !strings.HasPrefix(key, r.layout.appDir()+".") {
			continue // not a configuration file: upstream's runtime keeps it, unused
		}
		if !fi.Mode().IsRegular() {
			r.problem(path, "is not a regular file (%s)", fileType(fi))
			continue
		}
		r.read(path)
	}
}

// mayHold reports whether the directory with this key can hold a
// configuration file: without WatchRoot every one can; with it, only the
// directories on the way to AppDirectory and those below it, so the rest
// of the runtime tree costs nothing.
func (r *reader) mayHold(key string) bool {
	if !r.layout.WatchRoot {
		return true
	}
	p := r.layout.appDir() + "."
	return strings.HasPrefix(key+".", p) || strings.HasPrefix(p, key+".")
}

// readNames lists a directory's names, sorted, at most MaxEntries over the walk.
func (r *reader) readNames(dir string) ([]string, bool) {
	f, err := os.Open(dir)
	if err != nil {
		r.problem(dir, "cannot read the directory: %v", err)
		return nil, false
	}
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(256)
		r.entries += len(batch)
		if r.entries > MaxEntries {
			r.stop = true
			r.problem(dir, "more than %d directory entries below %s", MaxEntries, r.root)
			return nil, false
		}
		names = append(names, batch...)
		if errors.Is(err, io.EOF) || len(batch) == 0 && err == nil {
			break
		}
		if err != nil {
			r.problem(dir, "cannot read the directory: %v", err)
			return nil, false
		}
	}
	slices.Sort(names)
	return names, true
}

func (r *reader) read(path string) {
	if len(r.files) >= MaxFiles {
		r.stop = true
		r.problem(path, "more than %d configuration files below %s", MaxFiles, r.root)
		return
	}
	// O_NONBLOCK: should the file have become a named pipe since Stat,
	// opening it does not wait for a writer; the Stat below refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		r.problem(path, "cannot read: %v", err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		r.problem(path, "cannot read: %v", err)
		return
	}
	if !fi.Mode().IsRegular() {
		r.problem(path, "is not a regular file (%s)", fileType(fi))
		return
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		r.problem(path, "cannot read: %v", err)
		return
	}
	if len(data) > MaxFileBytes {
		r.problem(path, "error loading config file: larger than the %d bytes a file may have", MaxFileBytes)
		return
	}
	r.bytes += len(data)
	if r.bytes > MaxTotalBytes {
		r.stop = true
		r.problem(path, "the configuration files hold more than %d bytes together", MaxTotalBytes)
		return
	}
	r.files = append(r.files, File{Name: path, Data: data})
}

func fileType(fi os.FileInfo) string {
	m := fi.Mode()
	switch {
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}
