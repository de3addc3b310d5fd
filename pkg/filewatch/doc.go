// Package filewatch tells its owner that configuration files changed. It
// is the only package that knows about inotify.
//
// A Watcher is given paths, each a file or a directory, and reports on
// its Changes channel when anything under them may have changed:
// notifications are debounced (a burst of events gives one, after the
// burst is quiet for Options.Debounce, yet at least every
// Options.MaxDelay while it lasts) and coalescing (one value waits for a
// busy receiver, whatever the number of changes). A notification says
// only "read again"; the receiver re-reads and decides what changed.
// Spurious notifications are possible (an event on a watched directory
// that left the content as it was); missed ones are not meant to be.
//
// What is watched. Each path is resolved one component at a time,
// following symlinks: the directory holding each symlink met on the way
// and the directory holding the final name are watched for those names
// only, so a symlink swapped to a new target (Kubernetes ConfigMaps,
// envoyproxy/ratelimit's RUNTIME_ROOT "current -> v2"), a file renamed
// over, deleted or recreated are seen, while siblings are not. A path
// that does not exist yet is watched at its nearest existing directory
// until it appears. A path that resolves to a directory is watched with
// every directory below it (following symlinks to directories, each real
// directory once, so symlink loops end), at most Options.MaxDepth deep
// and Options.MaxDirs directories in all. Watches are re-armed after every
// burst and every poll: directories created, removed or swapped are
// picked up.
//
// The poll fallback. Every Options.PollInterval the watcher walks the
// same tree and computes a fingerprint of path, type, size, modification
// and change time, device and inode of every entry (following symlinks,
// at most Options.MaxEntries entries) and notifies when it differs, so a
// change inotify did not report (queue overflow, network filesystems, a
// bind mount replaced underneath) is caught anyway. Files are never
// opened: a FIFO or a device in the tree cannot block the watcher.
//
// Kubernetes. Mount a ConfigMap as a directory, never with subPath: the
// kubelet updates a ConfigMap volume by writing a new timestamped
// directory and swapping the "..data" symlink, but a subPath mount is a
// bind mount of the file as it was when the container started, which the
// kubelet never updates. No watcher can see a change that does not reach
// the container; restart the pod, or mount the directory.
//
// Failure mode: trouble with a path (unreadable, a symlink loop, a bound
// reached, a FIFO or device where a file is expected) is logged at warn,
// once per change of the set of problems, and watching goes on; without
// inotify the watcher polls. Log at debug says which event fired.
package filewatch
