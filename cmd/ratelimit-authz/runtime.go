package main

import (
	"io/fs"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
)

// The Go runtime's own defaults fit a container and serve keeps them:
// GOMAXPROCS is the CPUs the process may run on (its affinity), lowered
// to the container's CPU limit rounded up (at least 2), and follows a
// limit that changes (Go 1.25 and later; GOMAXPROCS in the environment
// overrides it). What was chosen is logged at start, since CPU per
// check depends on it (docs/performance.md).

// maxStreamWorkers bounds --grpc-stream-workers (as internal/server does):
// each worker is a goroutine held for the server's life.
const maxStreamWorkers = 1 << 12

// runtimeChoice is what the runtime chose and why.
type runtimeChoice struct {
	gomaxprocs int
	from       string  // "GOMAXPROCS", "cgroup" or "cpus"
	cpus       int     // CPUs the process may run on
	cgroupCPUs float64 // the container's CPU limit; 0: none found
}

// chooseRuntime reads the choice back: gomaxprocs and cpus as the
// runtime reports them, the environment, and the cgroup CPU limit from
// root (the file system at /).
func chooseRuntime(gomaxprocs, cpus int, getenv func(string) string, root fs.FS) runtimeChoice {
	c := runtimeChoice{gomaxprocs: gomaxprocs, from: "cpus", cpus: cpus, cgroupCPUs: cgroupCPULimit(root)}
	switch {
	case getenv("GOMAXPROCS") != "":
		c.from = "GOMAXPROCS"
	case c.cgroupCPUs > 0 && gomaxprocs < cpus && gomaxprocs == max(2, int(math.Ceil(c.cgroupCPUs))):
		c.from = "cgroup"
	}
	return c
}

// logRuntime logs the choice, and warns when GOMAXPROCS exceeds the
// container's CPU limit: the runtime then runs more threads than the
// kernel lets run, and they are throttled mid-check.
func logRuntime(log *slog.Logger, getenv func(string) string, root fs.FS) {
	c := chooseRuntime(runtime.GOMAXPROCS(0), runtime.NumCPU(), getenv, root)
	attrs := []any{"gomaxprocs", c.gomaxprocs, "gomaxprocs_from", c.from, "cpus", c.cpus, "go", runtime.Version()}
	if c.cgroupCPUs > 0 {
		attrs = append(attrs, "cgroup_cpu_limit", c.cgroupCPUs)
	}
	log.Info("runtime", attrs...)
	if c.cgroupCPUs > 0 && float64(c.gomaxprocs) > max(2, math.Ceil(c.cgroupCPUs)) {
		log.Warn("GOMAXPROCS is above the container's CPU limit: its threads are throttled; unset GOMAXPROCS to follow the limit",
			"gomaxprocs", c.gomaxprocs, "cgroup_cpu_limit", c.cgroupCPUs)
	}
}

// maxCgroupCPUs bounds a limit read back; a larger one is no limit.
const maxCgroupCPUs = 1 << 16

// cgroupCPULimit is the CPU limit (quota/period) of the cgroup mounted
// at root's sys/fs/cgroup, as a container sees its own: cgroup v2's
// cpu.max, or v1's cpu.cfs_quota_us and cpu.cfs_period_us; 0 when there
// is none or the files cannot be read or parsed. It is for the log
// line only: the runtime reads the limit itself.
func cgroupCPULimit(root fs.FS) float64 {
	if b, err := fs.ReadFile(root, "sys/fs/cgroup/cpu.max"); err == nil {
		quota, period, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
		if !ok {
			return 0
		}
		return cpuRatio(quota, period)
	}
	for _, dir := range []string{"sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct"} {
		q, err1 := fs.ReadFile(root, dir+"/cpu.cfs_quota_us")
		p, err2 := fs.ReadFile(root, dir+"/cpu.cfs_period_us")
		if err1 == nil && err2 == nil {
			return cpuRatio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
		}
	}
	return 0
}

// cpuRatio is quota/period in CPUs; 0 for "max", -1 (v1: none) or
// anything the kernel would not hold: it keeps the period within 1 ms…1 s
// and the quota at 1 ms at least (microseconds).
func cpuRatio(quota, period string) float64 {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q < 1000 || p < 1000 || p > 1_000_000 {
		return 0
	}
	if r := float64(q) / float64(p); r <= maxCgroupCPUs {
		return r
	}
	return 0
}
