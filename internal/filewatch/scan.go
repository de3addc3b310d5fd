package filewatch

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// maxLinks bounds the symlinks followed while resolving one path, as the
// kernel's own limit (40) does; more is reported as a loop.
const maxLinks = 40

// readDirChunk is how many entries a directory read returns at a time, so
// a huge directory is never held in memory whole.
const readDirChunk = 256

// maxProblems bounds the problems one scan keeps for the log.
const maxProblems = 8

// errLinkLoop is a path whose symlinks do not resolve within maxLinks.
var errLinkLoop = errors.New("too many levels of symbolic links")

// dirWatch is what one watched directory is watched for: every entry
// (all) or only the named ones.
type dirWatch struct {
	dev, ino uint64 // identity of the directory when scanned
	all      bool
	names    map[string]struct{}
}

// relevant reports whether an event naming entry name of the directory
// concerns the watched paths.
func (d *dirWatch) relevant(name string) bool {
	if d.all {
		return true
	}
	_, ok := d.names[name]
	return ok
}

// fingerprint summarises the metadata of every entry a scan saw. It is an
// order-independent sum, so a directory's read order does not matter.
type fingerprint struct {
	sum uint64
	n   int
}

// scanResult is one walk of the watched paths: the directories to watch,
// the fingerprint, and what could not be watched.
type scanResult struct {
	watches  map[string]*dirWatch
	fp       fingerprint
	entries  int      // directory entries looked at
	problems []string // at most maxProblems
	dropped  int      // problems past maxProblems
}

// problemText is the problems as one stable string, for comparing scans.
func (r *scanResult) problemText() string {
	s := strings.Join(r.problems, "; ")
	if r.dropped > 0 {
		s += fmt.Sprintf("; and %d more", r.dropped)
	}
	return s
}

// scanner walks the watched paths once. It never opens anything but
// directories (with O_DIRECTORY), so a FIFO or device cannot block it,
// and it is bounded by limits in directories, entries and depth.
type scanner struct {
	lim     limits
	res     scanResult
	walked  map[string]bool // real directories already walked
	entries int
}

type limits struct {
	maxDepth, maxDirs, maxEntries int
}

func scan(paths []string, lim limits) scanResult {
	s := &scanner{
		lim:    lim,
		res:    scanResult{watches: make(map[string]*dirWatch)},
		walked: make(map[string]bool),
	}
	for _, p := range paths {
		s.path(p)
	}
	s.res.entries = s.entries
	return s.res
}

func (s *scanner) problem(format string, args ...any) {
	s.res.addProblem(fmt.Sprintf(format, args...))
}

// addProblem notes what could not be watched; a repeat (a looping path
// met again through a walk) is noted once.
func (r *scanResult) addProblem(p string) {
	if slices.Contains(r.problems, p) {
		return
	}
	if len(r.problems) < maxProblems {
		r.problems = append(r.problems, p)
		return
	}
	r.dropped++
}

// path scans one of the watched paths.
func (s *scanner) path(p string) {
	real, fi, err := s.resolve(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.problem("%s does not exist (yet): watching for it", p)
		s.record(p, nil)
		return
	case err != nil:
		s.problem("%s: %v", p, err)
		s.record(p, nil)
		return
	}
	s.record(real, fi)
	switch {
	case fi.IsDir():
		s.walk(real, fi, 0)
	case !fi.Mode().IsRegular():
		s.problem("%s is not a regular file or a directory (%v): its metadata is watched, it is never read", p, fi.Mode().Type())
	}
}

// resolve follows p one component at a time, as the kernel would, and
// returns its real path and the FileInfo of what it names (never a
// symlink). On the way it asks for a watch on the directory holding each
// symlink (for that name) and on the directory holding the final name, or
// the first missing one: exactly the entries whose change changes what p
// names. Each symlink met is recorded in the fingerprint.
func (s *scanner) resolve(p string) (string, fs.FileInfo, error) {
	return s.follow("/", nil, strings.Split(p, "/"))
}

// follow resolves the components rest from the real directory cur (whose
// FileInfo is curFI, when known: the identity of its watch), as resolve.
func (s *scanner) follow(cur string, curFI fs.FileInfo, rest []string) (string, fs.FileInfo, error) {
	links := 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur, curFI = filepath.Dir(cur), nil // cur holds no symlink, so this is exact
			continue
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			s.watch(cur, curFI, name)
			return next, nil, err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			s.watch(cur, curFI, name)
			s.record(next, fi)
			if links++; links > maxLinks {
				return next, nil, errLinkLoop
			}
			target, err := os.Readlink(next)
			if err != nil {
				return next, nil, err
			}
			if filepath.IsAbs(target) {
				cur, curFI = "/", nil
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		last := onlyDots(rest)
		if last || !fi.IsDir() {
			// The final name, or a file where a directory is needed: a
			// change to this entry changes what p names.
			s.watch(cur, curFI, name)
		}
		if !last && !fi.IsDir() {
			return next, nil, syscall.ENOTDIR
		}
		cur, curFI = next, fi
	}
	fi, err := os.Lstat(cur)
	return cur, fi, err
}

// onlyDots reports whether the components left change nothing ("", ".").
func onlyDots(rest []string) bool {
	for _, c := range rest {
		if c != "" && c != "." {
			return false
		}
	}
	return true
}

// watch asks for an inotify watch on dir (whose FileInfo is fi, when
// known) for entry name, or for every entry when name is "". It reports
// false when the bound on directories refuses a new one.
func (s *scanner) watch(dir string, fi fs.FileInfo, name string) bool {
	w, ok := s.res.watches[dir]
	if !ok {
		if len(s.res.watches) >= s.lim.maxDirs {
			s.problem("more than %d directories to watch: %s and what is below it are not watched", s.lim.maxDirs, dir)
			return false
		}
		w = &dirWatch{}
		s.res.watches[dir] = w
	}
	if fi != nil {
		w.dev, w.ino, _ = statID(fi)
	}
	if name == "" {
		w.all, w.names = true, nil
		return true
	}
	if w.all {
		return true
	}
	if w.names == nil {
		w.names = make(map[string]struct{}, 1)
	}
	w.names[name] = struct{}{}
	return true
}

// walk watches dir and everything below it, depth levels below a
// watched path. Each real directory is walked once, which ends symlink
// cycles (a link to an ancestor) and counts shared targets once.
func (s *scanner) walk(dir string, fi fs.FileInfo, depth int) {
	if s.walked[dir] {
		return
	}
	if depth > s.lim.maxDepth {
		s.problem("%s is deeper than %d levels: not watched", dir, s.lim.maxDepth)
		return
	}
	s.walked[dir] = true
	if !s.watch(dir, fi, "") {
		return
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|openDirFlags, 0)
	if err != nil {
		s.problem("read directory %s: %v", dir, err)
		return
	}
	defer f.Close()
	for {
		ents, err := f.ReadDir(readDirChunk)
		for _, e := range ents {
			if s.entries >= s.lim.maxEntries {
				s.problem("more than %d entries: the rest of %s is left to inotify", s.lim.maxEntries, dir)
				return
			}
			s.entries++
			s.entry(dir, fi, e, depth)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.problem("read directory %s: %v", dir, err)
			}
			return
		}
	}
}

// entry records one entry of the real directory dir (whose FileInfo is
// dirFI) and descends into directories, following symlinks.
func (s *scanner) entry(dir string, dirFI fs.FileInfo, e fs.DirEntry, depth int) {
	p := filepath.Join(dir, e.Name())
	if e.Type()&fs.ModeSymlink != 0 {
		real, fi, err := s.follow(dir, dirFI, []string{e.Name()})
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.problem("%s: %v", p, err)
			}
			return // the link itself is recorded by resolve
		}
		s.record(real, fi)
		if fi.IsDir() {
			s.walk(real, fi, depth+1)
		}
		return
	}
	fi, err := e.Info()
	if err != nil {
		s.record(p, nil) // removed since the directory was read
		return
	}
	s.record(p, fi)
	if fi.IsDir() {
		s.walk(p, fi, depth+1)
	}
}

// record adds one entry to the fingerprint; fi nil records its absence.
func (s *scanner) record(p string, fi fs.FileInfo) {
	h := uint64(fnvOffset)
	for i := 0; i < len(p); i++ {
		h = (h ^ uint64(p[i])) * fnvPrime
	}
	h *= fnvPrime // a NUL byte, which no path holds, ends the path
	if fi != nil {
		dev, ino, ctime := statID(fi)
		for _, v := range [...]uint64{uint64(fi.Mode()), uint64(fi.Size()), uint64(fi.ModTime().UnixNano()), uint64(ctime), dev, ino} {
			for j := 0; j < 64; j += 8 {
				h = (h ^ (v>>j)&0xff) * fnvPrime
			}
		}
	}
	s.res.fp.sum += h
	s.res.fp.n++
}

// FNV-1a, 64 bits: the fingerprint only has to change when metadata
// does, within one process; nothing here is an adversary's collision
// target worth more than the poll interval (inotify still reports).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)
