// Package proc runs the helper processes of the end-to-end tests and the
// demo (Envoy, ratelimit-authz nodes): each writes its stdout and stderr to
// <LogDir>/<Name>.log, lives at most a bounded time, and is stopped by its
// PID — SIGTERM, then SIGKILL when it has not exited after a grace period.
//
// A child runs in its own process group, so a Ctrl-C at the terminal
// reaches only the parent, which then stops its children in the order it
// chooses. On Linux a child is also sent SIGKILL when the parent dies
// (PR_SET_PDEATHSIG), so a parent killed without cleanup leaves no Envoy
// holding ports. (That signal follows the OS thread that started the child;
// the Go runtime only retires threads of goroutines that exit while locked
// with runtime.LockOSThread, which the users of this package never do.)
//
// Unix only. Nothing here calls testing: errors are returned, and the
// callers decide whether they skip, fail or exit.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults for the zero fields of Config.
const (
	DefaultLifetime  = 10 * time.Minute
	DefaultStopGrace = 10 * time.Second
)

// Errors reported by Stop and WaitHTTP200, to be checked with errors.Is.
var (
	// ErrExited: the process had already exited (on its own, or because
	// its context or lifetime ended) when Stop or a readiness wait looked.
	ErrExited = errors.New("exited before it was stopped")
	// ErrKilled: the process ignored SIGTERM for the grace period and was
	// sent SIGKILL.
	ErrKilled = errors.New("ignored SIGTERM and was killed")
	// ErrLifetime is the cause recorded when Config.Lifetime ran out.
	ErrLifetime = errors.New("lifetime ended")
)

// Config describes one process. A zero duration means its default.
type Config struct {
	Name      string        // names the log file <LogDir>/<Name>.log; used in errors
	Path      string        // the program
	Args      []string      // arguments, without the program
	Dir       string        // working directory; "" is the caller's
	Env       []string      // environment; nil is the caller's
	LogDir    string        // existing folder for the log file (required)
	Lifetime  time.Duration // SIGTERM (then SIGKILL) once this has passed; default DefaultLifetime
	StopGrace time.Duration // SIGTERM → SIGKILL; default DefaultStopGrace
}

// Process is a started child process; Start returns one, the zero value
// is not usable. Its methods are safe for concurrent use.
type Process struct {
	name    string
	logPath string
	grace   time.Duration
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and been reaped
	err     error         // why it exited (nil: status 0); valid once done is closed

	stopOnce sync.Once
	stopErr  error
}

// Start starts the process. It runs until Stop, until ctx ends, or until
// its lifetime has passed, whichever comes first; in the last two cases it
// gets SIGTERM, then SIGKILL after the grace period. The log file starts
// with the command line and ends with the exit status.
func Start(ctx context.Context, cfg Config) (*Process, error) {
	switch {
	case cfg.Name == "" || strings.ContainsAny(cfg.Name, `/\`):
		return nil, fmt.Errorf("proc: name %q: want a plain file name", cfg.Name)
	case cfg.Path == "":
		return nil, fmt.Errorf("proc: %s: no program", cfg.Name)
	case cfg.LogDir == "":
		return nil, fmt.Errorf("proc: %s: no log folder", cfg.Name)
	case cfg.Lifetime < 0 || cfg.StopGrace < 0:
		return nil, fmt.Errorf("proc: %s: negative lifetime or grace", cfg.Name)
	}
	lifetime := orDefault(cfg.Lifetime, DefaultLifetime)
	p := &Process{
		name:    cfg.Name,
		logPath: filepath.Join(cfg.LogDir, cfg.Name+".log"),
		grace:   orDefault(cfg.StopGrace, DefaultStopGrace),
		done:    make(chan struct{}),
	}
	f, err := os.Create(p.logPath)
	if err != nil {
		return nil, fmt.Errorf("proc: %s: log: %w", cfg.Name, err)
	}
	fmt.Fprintf(f, "[proc] %s %s\n", cfg.Path, strings.Join(cfg.Args, " "))

	life, cancel := context.WithTimeoutCause(ctx, lifetime, fmt.Errorf("%w (%v)", ErrLifetime, lifetime))
	p.cmd = exec.CommandContext(life, cfg.Path, cfg.Args...)
	p.cmd.Dir, p.cmd.Env = cfg.Dir, cfg.Env
	p.cmd.Stdout, p.cmd.Stderr = f, f // *os.File: the child writes it directly, no copying goroutine
	p.cmd.SysProcAttr = sysProcAttr()
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	p.cmd.WaitDelay = p.grace // then exec sends SIGKILL
	if err := p.cmd.Start(); err != nil {
		cancel()
		f.Close()
		return nil, fmt.Errorf("proc: start %s: %w", cfg.Name, err)
	}
	fmt.Fprintf(f, "[proc] pid %d\n", p.cmd.Process.Pid)
	go func() {
		err := p.cmd.Wait()
		if life.Err() != nil { // ctx or lifetime ended: say which
			if err == nil {
				err = errors.New("exit status 0")
			}
			err = fmt.Errorf("stopped because %w: %v", context.Cause(life), err)
		}
		p.err = err
		fmt.Fprintf(f, "[proc] %s exited: %v\n", cfg.Name, status(err))
		f.Close()
		cancel()
		close(p.done)
	}()
	return p, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func status(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Name returns Config.Name.
func (p *Process) Name() string { return p.name }

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// LogPath returns the path of the process's log file.
func (p *Process) LogPath() string { return p.logPath }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns why the process exited (nil for exit status 0), or nil
// while it runs.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Stop sends SIGTERM to the process's PID and waits for it to exit; after
// the grace period it sends SIGKILL and waits again. It returns nil when
// the process exited with status 0 after SIGTERM; an error wrapping
// ErrExited when it had exited before Stop was called; ErrKilled when it
// had to be killed; otherwise the exit error. Later calls return the
// first call's result.
func (p *Process) Stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.stop() })
	return p.stopErr
}

func (p *Process) stop() error {
	pid := p.PID()
	if p.Exited() {
		return fmt.Errorf("proc: %s (pid %d) %w: %s", p.name, pid, ErrExited, status(p.err))
	}
	// os.Process.Signal signals this PID, and knows (pidfd on Linux) when
	// the process is gone, so a reused PID is never hit.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("proc: SIGTERM %s (pid %d): %w", p.name, pid, err)
	}
	t := time.NewTimer(p.grace)
	defer t.Stop()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("proc: %s (pid %d) after SIGTERM: %w", p.name, pid, p.err)
		}
		return nil
	case <-t.C:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("proc: SIGKILL %s (pid %d): %w", p.name, pid, err)
	}
	<-p.done
	return fmt.Errorf("proc: %s (pid %d) %w after %v", p.name, pid, ErrKilled, p.grace)
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return Tail(p.logPath, n) }

// Tail returns the last n lines of a file, or the error reading it.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitHTTP200 polls url until it answers 200 while the process runs. It
// returns an error wrapping ErrExited as soon as the process has exited,
// and ctx's error, with the last answer, when ctx ends first.
func (p *Process) WaitHTTP200(ctx context.Context, url string) error {
	err := waitHTTP200(ctx, url, p.done)
	if errors.Is(err, ErrExited) {
		return fmt.Errorf("proc: %s (pid %d) %w before %s answered 200: %s", p.name, p.PID(), ErrExited, url, status(p.err))
	}
	return err
}

// WaitHTTP200 polls url until it answers 200; it returns ctx's error, with
// the last answer, when ctx ends first.
func WaitHTTP200(ctx context.Context, url string) error { return waitHTTP200(ctx, url, nil) }

const pollEvery = 50 * time.Millisecond

func waitHTTP200(ctx context.Context, url string, exited <-chan struct{}) error {
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	c := &http.Client{Timeout: time.Second, Transport: tr}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var last error
	for {
		last = get200(ctx, c, url)
		if last == nil {
			return nil
		}
		select {
		case <-exited: // nil: never
			return ErrExited
		case <-ctx.Done():
			return fmt.Errorf("proc: waiting for 200 from %s: %w (last: %v)", url, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func get200(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, bytes.TrimSpace(body))
	}
	return nil
}
