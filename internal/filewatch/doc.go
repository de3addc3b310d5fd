// Package filewatch tells its owner that configuration files changed. It
// is the only package that knows about inotify.
//
// A Watcher is given paths, each a file or a directory, and reports on
// its Changes channel when anything under them may have changed.
// Notifications are debounced: a burst of events gives one, once the
// burst has been quiet for Options.Debounce (200 ms), yet at least one
// every Options.MaxDelay (1 s) while it lasts. They coalesce: one value
// waits for a busy receiver, whatever the number of changes. A
// notification says only "read again"; the receiver re-reads and decides
// what changed. A notification without a change is possible (an event
// that left the content as it was); a change without one is not meant to
// be.
//
// What is watched. Each path is resolved one component at a time,
// following symlinks as the kernel does (at most 40). The directory
// holding each symlink met on the way, and the directory holding the
// final name (or the first missing one), are watched for those names
// only. So a symlink swapped to a new target (a Kubernetes ConfigMap's
// "..data", envoyproxy/ratelimit's RUNTIME_ROOT "current -> v2"), a file
// written in place, renamed over, deleted or recreated, and a path that
// appears later are all seen, while changes to the siblings of a watched
// file are not. A path that resolves to a directory is watched with every
// directory below it, following symlinks to directories and walking each
// real directory once, so symlink cycles end. The watches are recomputed
// after every burst and every poll, so directories created, removed or
// swapped are picked up; a directory whose device and inode changed under
// the same path is watched anew.
//
// The poll fallback. Every Options.PollInterval (2 s) the watcher walks
// the same tree and sums a fingerprint of path, type, size, modification
// and change time, device and inode of every entry it meets, and
// notifies when the sum moved: a change inotify did not report (queue
// overflow, network filesystems, a bind mount replaced underneath) is
// seen within one interval. An inotify queue overflow itself counts as a
// change.
//
// Bounds. At most Options.MaxDepth (16) levels below a watched directory,
// Options.MaxDirs (1024) watched and walked directories, and
// Options.MaxEntries (10000) directory entries per walk; directories are
// read 256 entries at a time. Past a bound the rest is left to inotify
// (entries past MaxEntries are in a watched directory) or not watched
// (past MaxDepth and MaxDirs), and a warning names the bound. Files are
// never opened, and directories are opened with O_DIRECTORY|O_NONBLOCK:
// a FIFO or a device in the tree, or swapped in for a directory, cannot
// block the watcher.
//
// Kubernetes. Mount a ConfigMap as a directory, never with subPath: the
// kubelet updates a ConfigMap volume by writing a new timestamped
// directory and renaming a "..data_tmp" symlink over "..data", but a
// subPath mount is a bind mount of the file (its inode) as it was when
// the container started, which the kubelet never updates. No watcher can
// see a change that does not reach the container: mount the directory,
// or roll the pods.
//
// Failure mode: trouble with a path (missing, unreadable, a symlink loop,
// a bound reached, a FIFO or device where a file is expected, no inotify
// watch left) is logged at warn when the set of problems changes, not at
// every poll, and watching goes on; without inotify the watcher polls.
// At debug, one line per notification says what started the burst and
// how many changes it held.
package filewatch
