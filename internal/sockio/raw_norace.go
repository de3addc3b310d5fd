//go:build linux && !race

package sockio

import (
	"syscall"
	"unsafe"
)

// sysRead and sysWrite are read(2) and write(2) on a non-blocking socket,
// p not empty, without the scheduler's entersyscall/exitsyscall.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// raceBuild: the race detector is on (tests of allocations judge the build that ships).
const raceBuild = false
