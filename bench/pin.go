package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// onCPU is the command that runs bin with args bound to cpu alone, as
// taskset runs it: the process has that CPU mask from its first
// instruction, so a Go child sizes GOMAXPROCS from it. cpu < 0: unbound.
func onCPU(cpu int, bin string, args ...string) (string, []string) {
	if cpu < 0 {
		return bin, args
	}
	return "taskset", append([]string{"-c", strconv.Itoa(cpu), bin}, args...)
}

// allowedCPUs are the CPUs this process may run on, in order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// runqueueWait sums, over pid's threads, the time each spent runnable
// but waiting for a CPU (/proc/PID/task/TID/schedstat, second field):
// how much other work on the server's CPU held it back.
func runqueueWait(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("/proc/%d/task: no schedstat", pid)
	}
	var total int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return 0, fmt.Errorf("%s: unexpected format %q", t, b)
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		total += ns
	}
	return time.Duration(total), nil
}

// cpusAllowed reads the Cpus_allowed_list of pid ("0", "0-1").
func cpusAllowed(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == "Cpus_allowed_list" {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/%d/status: no Cpus_allowed_list", pid)
}
