package proc

import "syscall"

// sysProcAttr: its own process group (a terminal's Ctrl-C reaches only the
// parent), and SIGKILL when the parent dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
