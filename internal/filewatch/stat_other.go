//go:build !linux

package filewatch

import "io/fs"

// openDirFlags: elsewhere than Linux, directories are opened plainly.
const openDirFlags = 0

// statID is unknown elsewhere than Linux; size and times still count.
func statID(fs.FileInfo) (dev, ino uint64, ctime int64) { return 0, 0, 0 }
