package rlsconfig_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

func domainYAML(d string) string {
	return "domain: " + d + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// load runs Load with a deadline, so that a read that blocks (a named
// pipe) fails the test instead of hanging it.
func load(t *testing.T, l rlsconfig.Layout) (*rlsconfig.Config, error) {
	t.Helper()
	type result struct {
		c   *rlsconfig.Config
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := rlsconfig.Load(l, rlsconfig.Options{})
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.c, r.err
	case <-time.After(20 * time.Second):
		t.Fatalf("Load(%+v) did not return", l)
		return nil, nil
	}
}

func loadProblems(t *testing.T, l rlsconfig.Layout) []string {
	t.Helper()
	c, err := load(t, l)
	if err == nil {
		t.Fatalf("Load accepted it: domains %v", c.Domains())
	}
	ps, ok := problem.As(err)
	if !ok {
		t.Fatalf("Load: %v is not problem.List", err)
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func TestLoadWatchRootLayout(t *testing.T) {
	dir := t.TempDir()
	// The runtime layout: current → v1, swapped atomically on deploy.
	v1 := filepath.Join(dir, "v1")
	write(t, filepath.Join(v1, "ratelimit", "config", "basic.yaml"), domainYAML("basic"))
	write(t, filepath.Join(v1, "ratelimit", "config", "nested", "more.yaml"), domainYAML("nested"))
	write(t, filepath.Join(v1, "ratelimit", "config.top.yaml"), domainYAML("top"))    // key config.top.yaml: a config file
	write(t, filepath.Join(v1, "ratelimit", "reload.yaml"), "not: a config")          // key reload.yaml: ignored
	write(t, filepath.Join(v1, "ratelimit", "configx", "a.yaml"), "ignored: too")     // key configx.a.yaml: ignored
	write(t, filepath.Join(v1, "ratelimit", "other", "config.yaml"), "ignored: also") // key other.config.yaml
	if err := syscall.Mkfifo(filepath.Join(v1, "ratelimit", "pipe"), 0o644); err != nil {
		t.Fatal(err) // outside the configuration keys: never opened
	}
	symlink(t, "..", filepath.Join(v1, "ratelimit", "other", "loop")) // never read: no configuration key below
	symlink(t, "v1", filepath.Join(dir, "current"))
	l := rlsconfig.Layout{Root: filepath.Join(dir, "current"), Subdirectory: "ratelimit", WatchRoot: true}
	c, err := load(t, l)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"basic", "nested", "top"}) {
		t.Errorf("domains %v", got)
	}
	i, _, _ := c.Match("basic", entries("k", "v"), nil)
	if r := c.Rules()[i]; r.File != filepath.Join(l.Root, "ratelimit", "config", "basic.yaml") || r.Line != 3 {
		t.Errorf("basic's rule is at %s:%d", r.File, r.Line)
	}
	if got := l.ConfigDir(); got != filepath.Join(dir, "current", "ratelimit") {
		t.Errorf("ConfigDir %s", got)
	}
	if got := l.WatchPaths(); !slices.Equal(got, []string{filepath.Join(dir, "current", "ratelimit")}) {
		t.Errorf("WatchPaths %v (ConfigDir through the Root symlink; the watcher follows it)", got)
	}
	// AppDirectory chooses the prefix.
	l.AppDirectory = "nested"
	if _, err := load(t, l); err != nil {
		t.Errorf("AppDirectory nested: %v", err)
	}
}

func TestLoadDirectoryLayout(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "srv", "ratelimit", "config")
	write(t, filepath.Join(app, "basic.yaml"), domainYAML("basic"))
	write(t, filepath.Join(app, "no-suffix"), domainYAML("nosuffix")) // every file counts, as upstream
	write(t, filepath.Join(app, "sub", "deeper.yaml"), domainYAML("deeper"))
	write(t, filepath.Join(app, ".hidden.yaml"), domainYAML("hidden"))
	l := rlsconfig.Layout{Root: filepath.Join(dir, "srv"), Subdirectory: "ratelimit"}
	c, err := load(t, l)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"basic", "deeper", "hidden", "nosuffix"}) {
		t.Errorf("domains %v", got)
	}
	l.IgnoreDotfiles = true
	c, err = load(t, l)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"basic", "deeper", "nosuffix"}) {
		t.Errorf("IgnoreDotfiles: domains %v", got)
	}
	if got := l.WatchPaths(); !slices.Equal(got, []string{app}) || l.ConfigDir() != app {
		t.Errorf("WatchPaths %v, ConfigDir %s", got, l.ConfigDir())
	}
}

// A ConfigMap volume: the files are links into ..data, which links to a
// ..<timestamp> directory. Without IgnoreDotfiles upstream loads the
// timestamped copies too (duplicate domain); Load always skips them.
func TestLoadConfigMapWithoutIgnoreDotfiles(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "ratelimit", "config")
	ts := "..2026_12_02_00_00_00.123456789"
	write(t, filepath.Join(app, ts, "basic.yaml"), domainYAML("basic"))
	write(t, filepath.Join(app, ts, "another.yaml"), domainYAML("another"))
	symlink(t, ts, filepath.Join(app, "..data"))
	symlink(t, filepath.Join("..data", "basic.yaml"), filepath.Join(app, "basic.yaml"))
	symlink(t, filepath.Join("..data", "another.yaml"), filepath.Join(app, "another.yaml"))
	c, err := load(t, rlsconfig.Layout{Root: dir, Subdirectory: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"another", "basic"}) {
		t.Errorf("domains %v", got)
	}
	// WatchRoot with the ConfigMap mounted at the app directory.
	c, err = load(t, rlsconfig.Layout{Root: dir, Subdirectory: "ratelimit", WatchRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"another", "basic"}) {
		t.Errorf("WatchRoot: domains %v", got)
	}
}

func TestLoadEmptySubdirectoryWithWatchRoot(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config", "basic.yaml"), domainYAML("basic"))
	c, err := load(t, rlsconfig.Layout{Root: dir, WatchRoot: true})
	if !errors.Is(err, rlsconfig.ErrNoSubdirectory) {
		t.Fatalf("err %v, want ErrNoSubdirectory", err)
	}
	if c == nil || len(c.Domains()) != 0 || len(c.Rules()) != 0 {
		t.Fatalf("config %+v, want an empty one", c)
	}
	if _, _, found := c.Match("basic", entries("k", "v"), nil); found {
		t.Error("the empty config knows a domain")
	}
}

func TestLoadHostileDirectories(t *testing.T) {
	layout := func(dir string) rlsconfig.Layout {
		return rlsconfig.Layout{Root: dir, Subdirectory: "rl"}
	}
	app := func(dir string) string { return filepath.Join(dir, "rl", "config") }
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string // a problem containing this
	}{
		{"missing directory", func(t *testing.T, dir string) {}, "cannot read the configuration directory"},
		{"directory is a FIFO", func(t *testing.T, dir string) {
			if err := os.MkdirAll(filepath.Join(dir, "rl"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(app(dir), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "config: is not a directory (a named pipe)"},
		{"file is a FIFO", func(t *testing.T, dir string) {
			write(t, filepath.Join(app(dir), "ok.yaml"), domainYAML("ok"))
			if err := syscall.Mkfifo(filepath.Join(app(dir), "pipe.yaml"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "pipe.yaml: is not a regular file (a named pipe)"},
		{"link to a device", func(t *testing.T, dir string) {
			symlink(t, "/dev/zero", filepath.Join(app(dir), "zero.yaml"))
		}, "zero.yaml: is not a regular file (a device)"},
		{"symlink loop of directories", func(t *testing.T, dir string) {
			write(t, filepath.Join(app(dir), "ok.yaml"), domainYAML("ok"))
			symlink(t, "..", filepath.Join(app(dir), "sub", "up"))
		}, "a symbolic link loop: this directory contains itself"},
		{"symlink to itself", func(t *testing.T, dir string) {
			symlink(t, "self.yaml", filepath.Join(app(dir), "self.yaml"))
		}, "self.yaml: cannot read: stat"},
		{"dangling symlink", func(t *testing.T, dir string) {
			symlink(t, "gone.yaml", filepath.Join(app(dir), "dangling.yaml"))
		}, "no such file or directory"},
		{"100 MB file", func(t *testing.T, dir string) {
			write(t, filepath.Join(app(dir), "big.yaml"), "")
			if err := os.Truncate(filepath.Join(app(dir), "big.yaml"), 100<<20); err != nil {
				t.Fatal(err)
			}
		}, fmt.Sprintf("big.yaml: error loading config file: larger than the %d bytes a file may have", rlsconfig.MaxFileBytes)},
		{"too many files", func(t *testing.T, dir string) {
			for i := range rlsconfig.MaxFiles + 1 {
				write(t, filepath.Join(app(dir), fmt.Sprintf("f%05d.yaml", i)), domainYAML(fmt.Sprintf("d%d", i)))
			}
		}, fmt.Sprintf("more than %d configuration files", rlsconfig.MaxFiles)},
		{"too many entries", func(t *testing.T, dir string) {
			if err := os.MkdirAll(app(dir), 0o755); err != nil {
				t.Fatal(err)
			}
			for i := range rlsconfig.MaxEntries + 1 {
				if err := os.Mkdir(filepath.Join(app(dir), fmt.Sprintf("..%05d", i)), 0o755); err != nil {
					t.Fatal(err)
				}
			}
		}, fmt.Sprintf("more than %d directory entries", rlsconfig.MaxEntries)},
		{"too deep", func(t *testing.T, dir string) {
			p := app(dir)
			for range rlsconfig.MaxDirDepth + 1 {
				p = filepath.Join(p, "d")
			}
			write(t, filepath.Join(p, "x.yaml"), domainYAML("deep"))
		}, fmt.Sprintf("directories nest deeper than %d levels", rlsconfig.MaxDirDepth)},
		{"too many bytes together", func(t *testing.T, dir string) {
			for i := range rlsconfig.MaxTotalBytes/rlsconfig.MaxFileBytes + 1 {
				p := filepath.Join(app(dir), fmt.Sprintf("f%d.yaml", i))
				write(t, p, "")
				if err := os.Truncate(p, rlsconfig.MaxFileBytes); err != nil { // sparse: cheap to make
					t.Fatal(err)
				}
			}
		}, fmt.Sprintf("the configuration files hold more than %d bytes together", rlsconfig.MaxTotalBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			got := loadProblems(t, layout(dir))
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("problems %q, want one containing %q", got, tc.want)
			}
		})
	}
}

func TestLoadUnreadableFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rl", "config", "secret.yaml")
	write(t, p, domainYAML("secret"))
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, rlsconfig.Layout{Root: dir, Subdirectory: "rl"})
	if os.Getuid() == 0 {
		// root reads it regardless of mode.
		if err != nil || !slices.Equal(c.Domains(), []string{"secret"}) {
			t.Errorf("as root: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "secret.yaml: cannot read:") || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("err %v", err)
	}
}

// Problems of the files themselves come from Parse, named by path.
func TestLoadParseProblemsNamePaths(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rl", "config", "a.yaml"), domainYAML("d"))
	write(t, filepath.Join(dir, "rl", "config", "b.yaml"), domainYAML("d"))
	got := loadProblems(t, rlsconfig.Layout{Root: dir, Subdirectory: "rl"})
	want := filepath.Join(dir, "rl", "config", "b.yaml") + ":1:1: duplicate domain 'd' in config file"
	if len(got) != 1 || got[0] != want {
		t.Errorf("problems %q, want %q", got, want)
	}
}

// LoadDir given envoyproxy/ratelimit's runtime directory instead of its
// config directory says where the descriptor files are.
func TestLoadDirPointsAtTheConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "README.md"), []byte("# examples\n\n| a | b |\n|---|---|\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "config", "a.yaml"), []byte("domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"), 0o644)
	_, err := rlsconfig.LoadDir(dir, false, rlsconfig.Options{})
	if err == nil || !strings.Contains(err.Error(), "its descriptor files are read from "+filepath.Join(dir, "config")) {
		t.Fatalf("LoadDir of the runtime directory: %v", err)
	}
	if _, err := rlsconfig.LoadDir(filepath.Join(dir, "config"), false, rlsconfig.Options{}); err != nil {
		t.Fatalf("LoadDir of its config directory: %v", err)
	}
}
