package filewatch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzScanSymlinks: symlink targets are read from the filesystem, so
// whoever can write the watched tree chooses them. Whatever they are
// (loops, "..", absolute, very long, through files), a scan ends, keeps
// its bounds, and gives the same fingerprint twice for an unchanged tree.
func FuzzScanSymlinks(f *testing.F) {
	for _, s := range [][2]string{
		{"d", "d/f"},
		{"l2", "l1"},
		{"..", "."},
		{"/", "/d"},
		{"../../../..", "d/../d/./f"},
		{"d/f/x", "missing/x"},
		{strings.Repeat("a/", 200), ""},
		{"l1/l1/l1", "l2/.."},
		{"d/l1", "//"},
		{"..data/name", "..2026_12_02_00_00_00.123"},
	} {
		f.Add(s[0], s[1])
	}
	// One tree per fuzzing process; each input only replaces the links.
	root := f.TempDir()
	write(f, filepath.Join(root, "d", "f"), "x\n")
	write(f, filepath.Join(root, "..2026_12_02_00_00_00.123", "name"), "x\n")
	lim := limits{maxDepth: 3, maxDirs: 8, maxEntries: 64}
	f.Fuzz(func(t *testing.T, t1, t2 string) {
		links := [2]string{filepath.Join(root, "l1"), filepath.Join(root, "l2")}
		for i, target := range [2]string{t1, t2} {
			_ = os.Remove(links[i])
			if filepath.IsAbs(target) {
				target = root + target // keep absolute targets inside the tree
			}
			if os.Symlink(target, links[i]) != nil {
				return // not a name the kernel takes (NUL, too long)
			}
		}
		paths := []string{links[0], filepath.Join(links[1], "x"), filepath.Join(root, "..data")}
		a := scan(paths, lim)
		if len(a.watches) > lim.maxDirs {
			t.Fatalf("watches: %d, bound %d", len(a.watches), lim.maxDirs)
		}
		if a.entries > lim.maxEntries {
			t.Fatalf("entries: %d, bound %d", a.entries, lim.maxEntries)
		}
		if len(a.problems) > maxProblems {
			t.Fatalf("problems kept: %d", len(a.problems))
		}
		for dir := range a.watches {
			if dir != root && !strings.HasPrefix(dir, root+"/") {
				return // ".." led out of the tree, where others write
			}
		}
		if b := scan(paths, lim); a.fp != b.fp {
			t.Fatalf("fingerprint of an unchanged tree moved: %v, then %v", a.fp, b.fp)
		}
	})
}
