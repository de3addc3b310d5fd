package filewatch

import (
	"io/fs"
	"syscall"
)

// openDirFlags make opening a directory fail at once, never block, when
// the name was swapped for a FIFO or a device since it was looked at.
const openDirFlags = syscall.O_DIRECTORY | syscall.O_NONBLOCK

// statID returns the device, inode and change time of fi, or zeros.
func statID(fi fs.FileInfo) (dev, ino uint64, ctime int64) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, 0
	}
	return st.Dev, st.Ino, st.Ctim.Nano()
}
