// Package testnats runs real NATS servers for tests: in-process (fast, for
// most tests) or as a separate nats-server process (for tests that stop
// and restart NATS under load). Every server binds 127.0.0.1 on a port of
// its own and is stopped when the test ends.
package testnats

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natstest "github.com/nats-io/nats-server/v2/test"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
)

const (
	installTimeout = 5 * time.Minute // a cold `go install` of nats-server
	startTimeout   = 15 * time.Second
	stopTimeout    = 10 * time.Second // SIGTERM → SIGKILL
)

// Run starts an in-process NATS server on a random loopback port and shuts
// it down when the test ends. Its ClientURL is the address to connect to.
func Run(t testing.TB) *server.Server {
	t.Helper()
	opts := natstest.DefaultTestOptions
	opts.Host = "127.0.0.1"
	opts.Port = -1
	s := natstest.RunServer(&opts)
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// RunCluster starts n in-process NATS servers routed into one cluster,
// each on random loopback ports, waits until every server has a route to
// every other, and shuts them down when the test ends.
func RunCluster(t testing.TB, n int) []*server.Server {
	t.Helper()
	opts := func() server.Options {
		o := natstest.DefaultTestOptions
		o.Host, o.Port = "127.0.0.1", -1
		o.Cluster = server.ClusterOpts{Name: "test", Host: "127.0.0.1", Port: -1}
		return o
	}
	first := opts()
	srvs := []*server.Server{natstest.RunServer(&first)}
	seed := server.RoutesFromStr("nats://" + srvs[0].ClusterAddr().String())
	for range n - 1 {
		o := opts()
		o.Routes = seed
		srvs = append(srvs, natstest.RunServer(&o))
	}
	t.Cleanup(func() {
		for _, s := range srvs {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	deadline := time.Now().Add(startTimeout)
	for _, s := range srvs {
		for s.NumRoutes() < n-1 {
			if time.Now().After(deadline) {
				t.Fatalf("NATS cluster: a server has %d routes after %v, want %d", s.NumRoutes(), startTimeout, n-1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return srvs
}

// Unavailable skips the test when a prerequisite is missing, except under
// CI=true, where a missing prerequisite is a broken build and fails it.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (skipped; fails under CI=true)", args...)
}

// repoRoot finds the module root by walking up from the working directory.
var repoRoot = sync.OnceValues(func() (string, error) { return binaries.ModuleRoot(".") })

// install runs scripts/install-nats.sh once per test binary; the script
// prints the binary's path as its last line.
var install = sync.OnceValues(func() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "install-nats.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/install-nats.sh: %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	path := strings.TrimSpace(lines[len(lines)-1])
	if fi, err := os.Stat(path); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("scripts/install-nats.sh printed %q, which is not an executable", path)
	}
	return path, nil
})

// Binary returns the nats-server to run as a process: $NATS_SERVER_BIN, or
// the pinned one installed by scripts/install-nats.sh.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("NATS_SERVER_BIN"); p != "" {
		return p
	}
	p, err := install()
	if err != nil {
		Unavailable(t, "nats-server not available: %v", err)
	}
	return p
}

// Process is a nats-server running as a child process, on one loopback
// port for its whole life, so that clients reconnect to it after Restart.
// It is not safe for concurrent use.
type Process struct {
	t    testing.TB
	bin  string
	addr string
	dir  string
	conf string   // -c file, if any
	env  []string // added to the server's environment
	cmd  *exec.Cmd
	done chan struct{}
	n    int // starts, for log file names
}

// StartProcess starts nats-server on a free loopback port and stops it
// when the test ends.
func StartProcess(t testing.TB) *Process {
	t.Helper()
	p := &Process{t: t, bin: Binary(t), addr: freeport.TestAddr(t), dir: t.TempDir()}
	t.Cleanup(p.Stop)
	p.Start()
	return p
}

// StartProcessConfig starts nats-server with the configuration file conf
// (its listen address replaced by a free loopback port) and env added to
// its environment (the variables conf refers to), and stops it when the
// test ends.
func StartProcessConfig(t testing.TB, conf string, env ...string) *Process {
	t.Helper()
	p := &Process{t: t, bin: Binary(t), addr: freeport.TestAddr(t), dir: t.TempDir(), conf: conf, env: env}
	t.Cleanup(p.Stop)
	p.Start()
	return p
}

// Log returns what the server has logged in its latest start.
func (p *Process) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "nats-server-"+strconv.Itoa(p.n)+".log"))
	return string(b)
}

// URL is the server's client URL (valid across restarts).
func (p *Process) URL() string { return "nats://" + p.addr }

// Addr is the server's host:port.
func (p *Process) Addr() string { return p.addr }

// Running reports whether the process is running.
func (p *Process) Running() bool { return p.cmd != nil }

// Start starts the server if it is stopped, and waits until it accepts
// connections.
func (p *Process) Start() {
	p.t.Helper()
	if p.cmd != nil {
		return
	}
	host, port, _ := net.SplitHostPort(p.addr)
	p.n++
	logf, err := os.Create(filepath.Join(p.dir, "nats-server-"+strconv.Itoa(p.n)+".log"))
	if err != nil {
		p.t.Fatalf("nats-server log: %v", err)
	}
	args := []string{"-a", host, "-p", port, "-n", "testnats"}
	if p.conf != "" {
		args = append([]string{"-c", p.conf}, args...) // flags override the file
	}
	cmd := exec.Command(p.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.t.Fatalf("start nats-server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	deadline := time.Now().Add(startTimeout)
	for {
		if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			p.cmd = nil
			p.t.Fatalf("nats-server exited at start; see %s", logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			p.Stop()
			p.t.Fatalf("nats-server not accepting connections on %s after %v", p.addr, startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server by its PID: SIGTERM, then SIGKILL after a
// timeout. It is a no-op when the server is not running.
func (p *Process) Stop() {
	if p.cmd == nil {
		return
	}
	cmd, done := p.cmd, p.done
	p.cmd = nil
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Logf("SIGTERM nats-server (pid %d): %v", cmd.Process.Pid, err)
	}
	select {
	case <-done:
		return
	case <-time.After(stopTimeout):
	}
	p.t.Logf("nats-server (pid %d) still running %v after SIGTERM; killing it", cmd.Process.Pid, stopTimeout)
	cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		p.t.Errorf("nats-server (pid %d) did not exit after SIGKILL", cmd.Process.Pid)
	}
}

// Restart stops and starts the server on the same port.
func (p *Process) Restart() {
	p.t.Helper()
	p.Stop()
	p.Start()
}
