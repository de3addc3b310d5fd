package main

import (
	"bytes"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"
)

func TestCgroupCPULimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  float64
	}{
		{"none", nil, 0},
		{"v2 limit", map[string]string{"sys/fs/cgroup/cpu.max": "150000 100000\n"}, 1.5},
		{"v2 unlimited", map[string]string{"sys/fs/cgroup/cpu.max": "max 100000\n"}, 0},
		{"v2 garbage", map[string]string{"sys/fs/cgroup/cpu.max": "\x00\xff"}, 0},
		{"v2 zero period", map[string]string{"sys/fs/cgroup/cpu.max": "100000 0"}, 0},
		{"v2 huge", map[string]string{"sys/fs/cgroup/cpu.max": "9223372036854775807 1"}, 0},
		{"v2 period past the kernel's 1 s", map[string]string{"sys/fs/cgroup/cpu.max": "1 1000000000001"}, 0},
		{"v2 the least the kernel holds", map[string]string{"sys/fs/cgroup/cpu.max": "1000 1000000"}, 0.001},
		{"v1 limit", map[string]string{"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "50000\n", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 0.5},
		{"v1 cpu,cpuacct", map[string]string{"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000", "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"}, 2},
		{"v1 unlimited", map[string]string{"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, 0},
		{"v1 half", map[string]string{"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "50000"}, 0},
	} {
		fsys := fstest.MapFS{}
		for name, body := range tc.files {
			fsys[name] = &fstest.MapFile{Data: []byte(body)}
		}
		if got := cgroupCPULimit(fsys); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestChooseRuntime(t *testing.T) {
	limit := func(body string) fstest.MapFS {
		return fstest.MapFS{"sys/fs/cgroup/cpu.max": &fstest.MapFile{Data: []byte(body)}}
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name             string
		gomaxprocs, cpus int
		getenv           func(string) string
		root             fstest.MapFS
		want             string
	}{
		{"all CPUs", 8, 8, env(), fstest.MapFS{}, "cpus"},
		{"cgroup 3.5 of 8", 4, 8, env(), limit("350000 100000"), "cgroup"},
		{"cgroup 0.5 rounds up to 2", 2, 8, env(), limit("50000 100000"), "cgroup"},
		{"cgroup above the CPUs", 4, 4, env(), limit("800000 100000"), "cpus"},
		{"environment", 3, 8, env("GOMAXPROCS", "3"), limit("350000 100000"), "GOMAXPROCS"},
	} {
		if got := chooseRuntime(tc.gomaxprocs, tc.cpus, tc.getenv, tc.root); got.from != tc.want {
			t.Errorf("%s: from %q, want %q", tc.name, got.from, tc.want)
		}
	}
}

func TestLogRuntime(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	logRuntime(log, func(string) string { return "" }, fstest.MapFS{"sys/fs/cgroup/cpu.max": &fstest.MapFile{Data: []byte("10000 100000")}})
	out := buf.String()
	for _, want := range []string{"msg=runtime", "gomaxprocs=", "gomaxprocs_from=", "cgroup_cpu_limit=0.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	// A limit of 0.1 CPU: the runtime's default is at least 2, so only a
	// GOMAXPROCS above 2 is warned about.
	if warned := strings.Contains(out, "above the container's CPU limit"); warned != (runtimeGOMAXPROCS() > 2) {
		t.Errorf("warning %v with GOMAXPROCS %d: %s", warned, runtimeGOMAXPROCS(), out)
	}
}

func runtimeGOMAXPROCS() int { return runtime.GOMAXPROCS(0) }

// TestStreamWorkersFlag: 0 on the command line turns the workers off (the
// server's own zero would mean its default).
func TestStreamWorkersFlag(t *testing.T) {
	for _, tc := range []struct{ flag, want int }{{0, -1}, {1, 1}, {64, 64}} {
		c := serveConfig{grpcMaxStreams: 1}
		c.node.Bounds.MaxConnections, c.node.Bounds.MaxRecvMsgBytes, c.node.Bounds.KeepaliveMinTime = 1, 1, 1
		c.node.StreamWorkers = tc.flag
		if err := c.limits(); err != nil {
			t.Fatalf("--grpc-stream-workers %d: %v", tc.flag, err)
		}
		if c.node.StreamWorkers != tc.want {
			t.Errorf("--grpc-stream-workers %d: server gets %d, want %d", tc.flag, c.node.StreamWorkers, tc.want)
		}
	}
}

// FuzzCgroupCPULimit: whatever cpu.max holds, the limit read back is 0
// (none) or a positive, finite count of CPUs within the bound, and never
// a panic.
func FuzzCgroupCPULimit(f *testing.F) {
	for _, s := range []string{"max 100000\n", "150000 100000", "1 1", "0 0", "-1 100000", "9223372036854775807 1", " ", "100000", "1e9 1", "50000 100000 extra", "1 1000000000001", "1000 1000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got := cgroupCPULimit(fstest.MapFS{"sys/fs/cgroup/cpu.max": &fstest.MapFile{Data: []byte(body)}})
		if got < 0 || got > maxCgroupCPUs || math.IsNaN(got) || (got > 0 && got < 0.001) {
			t.Fatalf("cpu.max %q: limit %v", body, got)
		}
	})
}
