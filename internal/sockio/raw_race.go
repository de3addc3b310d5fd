//go:build linux && race

package sockio

import (
	"errors"
	"syscall"
)

// Under the race detector, reads and writes go through the syscall
// package, which tells the detector that what one goroutine wrote to a
// socket happens before another's read of it (as net's own reads and
// writes do); raw system calls would leave that edge out and report
// races that are not there. raw_norace.go is the build that ships.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if err != nil && !errors.As(err, &e) {
		return syscall.EIO
	}
	return e
}

// raceBuild: the race detector is on (tests of allocations judge the build that ships).
const raceBuild = true
