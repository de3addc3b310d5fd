package rlsconfig

import "path/filepath"

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

// WatchPaths lists the directories a watcher must watch to see every
// change Load would read: ConfigDir, and with WatchRoot also the parent
// of Root, where the Root symlink is swapped.
func (l Layout) WatchPaths() []string {
	if l.WatchRoot {
		return []string{l.ConfigDir(), filepath.Dir(filepath.Clean(l.Root))}
	}
	return []string{l.ConfigDir()}
}

// Load reads the configuration files of the layout (bounded in size,
// number and depth) and parses them.
func Load(l Layout, opts Options) (*Config, error) {
	panic("todo")
}
