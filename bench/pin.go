package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pinner starts child processes bound to one CPU each, as taskset would:
// a process forked from an OS thread inherits that thread's CPU mask from
// its first instruction, so a Go child sizes GOMAXPROCS from it. Each CPU
// has a launcher goroutine locked to its own OS thread with that mask, and
// only launchers fork pinned children. The threads stay alive until close
// (which restores their masks before returning them to the runtime),
// because internal/proc sets Pdeathsig: a child is killed when the thread
// that forked it ends.
type pinner struct {
	launch map[int]chan func()
	done   chan struct{}
	wg     sync.WaitGroup
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

// newPinner starts one launcher for each of cpus.
func newPinner(cpus ...int) (*pinner, error) {
	p := &pinner{launch: map[int]chan func(){}, done: make(chan struct{})}
	for _, cpu := range cpus {
		ch := make(chan func())
		ready := make(chan error, 1)
		p.wg.Add(1)
		go p.launcher(cpu, ch, ready)
		if err := <-ready; err != nil {
			p.close()
			return nil, err
		}
		p.launch[cpu] = ch
	}
	return p, nil
}

func (p *pinner) launcher(cpu int, ch chan func(), ready chan<- error) {
	defer p.wg.Done()
	runtime.LockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		ready <- fmt.Errorf("sched_getaffinity: %w", err)
		return
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		ready <- fmt.Errorf("pin a thread to CPU %d: %w", cpu, err)
		return
	}
	ready <- nil
	for {
		select {
		case fn := <-ch:
			fn()
		case <-p.done:
			// Back to the runner's mask before the thread serves any other
			// goroutine; should that fail, the thread ends with the goroutine.
			if unix.SchedSetaffinity(0, &old) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
	}
}

// on runs start (which forks a child) on cpu's launcher thread.
func (p *pinner) on(cpu int, start func() error) error {
	ch, ok := p.launch[cpu]
	if !ok {
		return fmt.Errorf("no launcher for CPU %d", cpu)
	}
	errc := make(chan error, 1)
	select {
	case ch <- func() { errc <- start() }:
	case <-p.done:
		return errors.New("pinner closed")
	}
	return <-errc
}

// close ends the launchers and waits until their threads are unbound;
// the children they started keep running.
func (p *pinner) close() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.wg.Wait()
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
