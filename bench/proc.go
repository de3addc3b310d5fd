package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
	iproc "github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

// stopGrace is how long a process has between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// proc is a long-lived child process (a server, Envoy, NATS), run by
// internal/proc: its output goes to <logs>/<name>.log, it lives at most
// its lifetime in its own process group (SIGKILL if the runner dies), and
// stop ends it by PID: SIGTERM, then SIGKILL.
type proc struct {
	*iproc.Process
	logPath string
}

// start runs bin with args for at most lifetime. env entries are added to
// the runner's environment.
func (r *runner) start(name string, lifetime time.Duration, env []string, bin string, args ...string) (*proc, error) {
	p, err := iproc.Start(context.Background(), iproc.Config{
		Name: name, Path: bin, Args: args, Env: append(os.Environ(), env...),
		LogDir: r.logDir, Lifetime: lifetime, StopGrace: stopGrace,
	})
	if err != nil {
		return nil, err
	}
	pr := &proc{Process: p, logPath: p.LogPath()}
	r.mu.Lock()
	r.procs = append(r.procs, pr)
	r.mu.Unlock()
	return pr, nil
}

func (p *proc) pid() int { return p.PID() }

// cpuTime is the CPU time the process used so far.
func (p *proc) cpuTime() (time.Duration, error) { return cpuTimeOf(p.pid()) }

// cpuUser is what a load run's CPU is charged to: a process, or a server
// with the processes that go with it.
type cpuUser interface {
	pid() int
	cpuTime() (time.Duration, error)
}

func (p *proc) exited() bool { return p.Exited() }

// stop ends the process (SIGTERM by PID, SIGKILL after stopGrace) and
// waits for it; it may be called again. How it ended is in its log.
func (p *proc) stop() { p.Stop() }

// stopAll stops every process still running, newest first.
func (r *runner) stopAll() {
	r.mu.Lock()
	procs := r.procs
	r.procs = nil
	r.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop()
	}
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}

// waitHTTP200 polls url until it answers 200, while p keeps running.
func waitHTTP200(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := p.WaitHTTP200(ctx, url); err != nil {
		return fmt.Errorf("%w\n%s", err, p.Tail(20))
	}
	return nil
}

// procStatus reads VmRSS and VmHWM (bytes) of pid.
func procStatus(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	return rss, hwm, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux configuration Go supports (sysconf needs cgo).
const clockTicks = 100

// cpuTimeOf returns the CPU time (user + system, all threads) pid has used.
func cpuTimeOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after its ")"
	// start at field 3 (state): utime is field 14, stime field 15.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// loadavg reads the 1, 5 and 15 minute load averages.
func loadavg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// runTool runs a command to completion within timeout and returns its
// stdout; stderr goes to the named log.
func (r *runner) runTool(ctx context.Context, name string, timeout time.Duration, env []string, dir, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logPath := filepath.Join(r.logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "[bench] %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = f
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	err = cmd.Run()
	out := stdout.Bytes()
	if err != nil {
		f.Sync()
		return out, fmt.Errorf("%s: %w\n%s", name, err, iproc.Tail(logPath, 15))
	}
	return out, nil
}

// loadRun is one run of the load tool: its result, and what the runner
// measured around it.
type loadRun struct {
	loadresult.Result
	// ServerCPUUS is the server's CPU per check over the run (µs), measured
	// by the runner from /proc; 0 when not measured.
	ServerCPUUS float64
	// ServerWaitShare is the time the server's threads spent waiting for a
	// CPU over the run, as a share of the run (floor scenario only).
	ServerWaitShare float64
}

// load runs ratelimit-bench with args (a check or http run) and returns
// its results. The run is bounded by its own --duration; the timeout here
// is a backstop.
func (r *runner) load(ctx context.Context, name string, budget time.Duration, args ...string) (*loadRun, error) {
	return r.loadOn(ctx, -1, name, budget, args...)
}

// rotate calls fn for each round and each of n targets, the targets in a
// rotating order within each round (round k starts with target k mod n),
// so that a change in the machine's load hits all of them alike.
func (r *runner) rotate(n int, fn func(round, target int) error) error {
	for round := range r.opt.rounds {
		for i := range n {
			if err := fn(round, (i+round)%n); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadCPU runs one load of the options' run and warm-up, the load tool
// bound to cpu (< 0: unbound), and notes srv's CPU per request and,
// pinned, the share of the run its threads waited for their CPU.
func (r *runner) loadCPU(ctx context.Context, cpu int, name string, srv cpuUser, args ...string) (*loadRun, error) {
	c0, err0 := srv.cpuTime()
	w0, werr0 := runqueueWait(srv.pid())
	start := time.Now()
	res, err := r.loadOn(ctx, cpu, name, r.opt.run+r.opt.warmup, args...)
	if err != nil {
		return nil, err
	}
	c1, err1 := srv.cpuTime()
	w1, werr1 := runqueueWait(srv.pid())
	if err0 == nil && err1 == nil && res.Sent > 0 {
		res.ServerCPUUS = float64((c1 - c0).Microseconds()) / float64(res.Sent+1) // +1: the tool's probe
	}
	if cpu >= 0 && werr0 == nil && werr1 == nil {
		res.ServerWaitShare = round(max(w1-w0, 0).Seconds()/time.Since(start).Seconds(), 3)
	}
	r.printf("  server CPU %.1fµs/request, waited %.1f%%\n", res.ServerCPUUS, 100*res.ServerWaitShare)
	return res, nil
}

// loadOn is load with the load tool bound to cpu (< 0: unbound).
func (r *runner) loadOn(ctx context.Context, cpu int, name string, budget time.Duration, args ...string) (*loadRun, error) {
	path := filepath.Join(r.runsDir, name+".json")
	args = append(args, "--json", path, "--quiet")
	bin, args := onCPU(cpu, r.bins.bench, args...)
	if _, err := r.runTool(ctx, "load-"+name, budget+30*time.Second, nil, "", bin, args...); err != nil {
		return nil, err
	}
	res, err := loadresult.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r.printf("%-28s %8.0f/s  p50 %s  p99 %s  p99.9 %s  denied %.1f%%  errors %d  tool CPU %.1fµs\n", name, res.RPS,
		loadresult.Micros(res.Latency.P50), loadresult.Micros(res.Latency.P99), loadresult.Micros(res.Latency.P999),
		100*res.DeniedShare(), res.Errors, res.ClientCPUUS())
	return &loadRun{Result: *res}, nil
}

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
