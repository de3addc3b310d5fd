package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
	iproc "github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

// stopGrace is how long a process has between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// proc is a long-lived child process (a server, Envoy, NATS), run by
// internal/proc: its output goes to <logs>/<name>.log, it lives at most
// its lifetime in its own process group (SIGKILL if the runner dies), and
// stop ends it by PID: SIGTERM, then SIGKILL (after stopGrace), and waits
// for it; it may be called again. How it ended is in its log.
type proc struct{ *iproc.Process }

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
	pr := &proc{p}
	r.mu.Lock()
	r.procs = append(r.procs, pr)
	r.mu.Unlock()
	return pr, nil
}

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

// status reads /proc/PID/status: VmRSS and VmHWM in bytes,
// CpusAllowedList. A process that is exiting has no VmRSS: an error.
func status(pid int) (procfs.ProcStatus, error) {
	p, err := procfs.NewProc(pid)
	var st procfs.ProcStatus
	if err == nil {
		st, err = p.NewStatus()
	}
	if err == nil && st.VmRSS == 0 {
		err = errors.New("no VmRSS")
	}
	if err != nil {
		return st, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return st, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux configuration Go supports.
const clockTicks = 100

// cpuTime is the CPU time (user + system, all threads) the processes
// used so far.
func cpuTime(pids ...int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		p, err := procfs.NewProc(pid)
		var st procfs.ProcStat
		if err == nil {
			st, err = p.Stat()
		}
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		sum += time.Duration(st.UTime+st.STime) * time.Second / clockTicks
	}
	return sum, nil
}

// runqueueWait sums, over pid's threads, the time each spent runnable
// but waiting for a CPU: how much other work on the server's CPU held it
// back.
func runqueueWait(pid int) (time.Duration, error) {
	threads, err := procfs.AllThreads(pid)
	if err != nil {
		return 0, fmt.Errorf("threads of %d: %w", pid, err)
	}
	var total time.Duration
	for _, t := range threads {
		st, err := t.Schedstat()
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ESRCH): // the thread ended
		case err != nil:
			return 0, fmt.Errorf("schedstat of thread %d of %d: %w", t.PID, pid, err)
		default:
			total += time.Duration(st.WaitingNanoseconds)
		}
	}
	return total, nil
}

// loadavg reads the 1, 5 and 15 minute load averages.
func loadavg() [3]float64 {
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if l, err := fs.LoadAvg(); err == nil {
			return [3]float64{l.Load1, l.Load5, l.Load15}
		}
	}
	return [3]float64{}
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
func (r *runner) loadCPU(ctx context.Context, cpu int, name string, srv *server, args ...string) (*loadRun, error) {
	c0, err0 := cpuTime(srv.pids()...)
	w0, werr0 := runqueueWait(srv.PID())
	start := time.Now()
	res, err := r.loadOn(ctx, cpu, name, r.opt.run+r.opt.warmup, args...)
	if err != nil {
		return nil, err
	}
	c1, err1 := cpuTime(srv.pids()...)
	w1, werr1 := runqueueWait(srv.PID())
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

// cpusAllowed is the CPUs pid may run on, in order.
func cpusAllowed(pid int) ([]uint64, error) {
	st, err := status(pid)
	return st.CpusAllowedList, err
}
