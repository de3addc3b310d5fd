// Package filewatch tells its owner that configuration files changed. It
// is the only package that knows about inotify.
//
// A [Watcher] is given paths, each a file or a directory, and reports on
// its Changes channel when anything under them may have changed.
//
// Invariants:
//
//   - A notification says only "read again"; the receiver re-reads and
//     decides what changed. One without a change is possible; a change
//     without one is not meant to be.
//   - Notifications are debounced (once a burst has been quiet for
//     Options.Debounce, yet at least one every Options.MaxDelay while it
//     lasts) and coalesce: one value waits for a busy receiver.
//   - Each path is resolved as the kernel resolves it and the directories
//     on the way are watched, so a symlink swapped to a new target (a
//     Kubernetes ConfigMap's "..data"), a file written in place, renamed
//     over, deleted or recreated, and a path that appears later are all
//     seen. A poll every Options.PollInterval catches what inotify misses.
//   - What the watcher walks is bounded (Options.MaxDepth, MaxDirs,
//     MaxEntries), files are never opened, and directories are opened
//     non-blocking: a FIFO or device in the tree cannot block it.
//
// Failure mode: trouble with a path (missing, unreadable, a symlink loop, a
// bound reached, a FIFO or device where a file is expected, no inotify
// watch left) is logged at warn when the set of problems changes, and
// watching goes on; without inotify the watcher polls. A change that never
// reaches the container (a ConfigMap mounted with subPath) cannot be seen.
//
// The design (what is watched, the poll fallback, bounds, Kubernetes) is in
// docs/design/config-watching.md.
package filewatch
