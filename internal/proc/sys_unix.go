//go:build unix && !linux

package proc

import "syscall"

// sysProcAttr: its own process group (a terminal's Ctrl-C reaches only the
// parent). There is no parent-death signal here: a parent killed without
// cleanup leaves its children running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
