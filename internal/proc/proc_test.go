package proc

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// start runs sh -c script with a short lifetime and grace, and stops it
// when the test ends.
func start(t *testing.T, script string, mod func(*Config)) *Process {
	t.Helper()
	cfg := Config{
		Name:      "sh",
		Path:      "/bin/sh",
		Args:      []string{"-c", script},
		LogDir:    t.TempDir(),
		Lifetime:  30 * time.Second,
		StopGrace: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	return p
}

func waitDone(t *testing.T, p *Process, within time.Duration) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(within):
		t.Fatalf("%s (pid %d) still running after %v", p.Name(), p.PID(), within)
	}
}

// A process that exits 0 on SIGTERM stops cleanly; Stop is idempotent.
func TestStopGraceful(t *testing.T) {
	// The trap kills the sleep too, so nothing outlives the test.
	p := start(t, `trap 'kill $!; exit 0' TERM; echo started; sleep 30 & wait`, nil)
	if err := waitLog(t, p, "started"); err != nil {
		t.Fatal(err)
	}
	if p.Exited() || p.Err() != nil {
		t.Fatalf("exited early: %v", p.Err())
	}
	if pgid, err := syscall.Getpgid(p.PID()); err != nil || pgid != p.PID() {
		t.Errorf("process group %d (%v), want its own (%d)", pgid, err, p.PID())
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !p.Exited() {
		t.Fatal("not exited after Stop")
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	log := p.Tail(10)
	for _, want := range []string{"[proc] /bin/sh -c", "started", "exited: exit status 0"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

// waitLog polls the log until one of its lines is s (the
// command line in the log's first line contains s too).
func waitLog(t *testing.T, p *Process, s string) error {
	t.Helper()
	return poll.Wait(10*time.Second, 10*time.Millisecond, func() error {
		if !slices.Contains(strings.Split(p.Tail(100), "\n"), s) {
			return errors.New("log never showed " + s + ":\n" + p.Tail(20))
		}
		return nil
	})
}

// sleep dies of SIGTERM: Stop reports the exit status, neither ErrExited
// nor ErrKilled.
func TestStopSignalExit(t *testing.T) {
	p := start(t, "exec sleep 30", nil)
	err := p.Stop()
	if err == nil || errors.Is(err, ErrExited) || errors.Is(err, ErrKilled) {
		t.Fatalf("Stop: %v, want the exit status", err)
	}
	var ee interface{ ExitCode() int }
	if !errors.As(err, &ee) {
		t.Errorf("Stop: %v, want an *exec.ExitError inside", err)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	p := start(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`, func(c *Config) { c.StopGrace = grace })
	if err := waitLog(t, p, "ready"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err := p.Stop()
	if !errors.Is(err, ErrKilled) {
		t.Fatalf("Stop: %v, want ErrKilled", err)
	}
	if d := time.Since(began); d < grace {
		t.Errorf("killed after %v, before the grace of %v", d, grace)
	}
}

func TestExitedOnItsOwn(t *testing.T) {
	for _, tc := range []struct{ script, status string }{
		{"exit 0", "exit status 0"},
		{"exit 3", "exit status 3"},
	} {
		p := start(t, tc.script, nil)
		waitDone(t, p, 10*time.Second)
		err := p.Stop()
		if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), tc.status) {
			t.Errorf("%s: Stop: %v, want ErrExited with %q", tc.script, err, tc.status)
		}
	}
}

func TestLifetime(t *testing.T) {
	p := start(t, "exec sleep 30", func(c *Config) { c.Lifetime = 200 * time.Millisecond })
	waitDone(t, p, 10*time.Second)
	if !errors.Is(p.Err(), ErrLifetime) {
		t.Errorf("Err: %v, want ErrLifetime", p.Err())
	}
	if err := p.Stop(); !errors.Is(err, ErrExited) {
		t.Errorf("Stop: %v, want ErrExited", err)
	}
	if log := p.Tail(5); !strings.Contains(log, "lifetime ended") {
		t.Errorf("log does not say why:\n%s", log)
	}
}

// The lifetime SIGKILLs a process that ignores its SIGTERM.
func TestLifetimeKills(t *testing.T) {
	p := start(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`, func(c *Config) {
		c.Lifetime, c.StopGrace = 300*time.Millisecond, 200*time.Millisecond
	})
	waitDone(t, p, 10*time.Second)
	if !errors.Is(p.Err(), ErrLifetime) {
		t.Errorf("Err: %v, want ErrLifetime", p.Err())
	}
}

func TestContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p, err := Start(ctx, Config{Name: "sleep", Path: "sleep", Args: []string{"30"}, LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	cancel()
	waitDone(t, p, 10*time.Second)
	if !errors.Is(p.Err(), context.Canceled) {
		t.Errorf("Err: %v, want context.Canceled", p.Err())
	}
}

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]Config{
		"no name":        {Path: "sleep", LogDir: dir},
		"name with /":    {Name: "a/b", Path: "sleep", LogDir: dir},
		"no program":     {Name: "x", LogDir: dir},
		"no log folder":  {Name: "x", Path: "sleep"},
		"missing folder": {Name: "x", Path: "sleep", LogDir: dir + "/nope"},
		"missing binary": {Name: "x", Path: dir + "/no-such-program", LogDir: dir},
		"negative grace": {Name: "x", Path: "sleep", LogDir: dir, StopGrace: -1},
	} {
		if p, err := Start(context.Background(), cfg); err == nil {
			p.Stop()
			t.Errorf("%s: Start succeeded", name)
		}
	}
}

func TestWaitHTTP200(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	p := start(t, "exec sleep 30", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.WaitHTTP200(ctx, srv.URL); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("%d calls, want 4", n)
	}

	// Nothing listens, and the process dies: ErrExited, without waiting
	// for ctx.
	addr := freeport.TestAddr(t)
	dead := start(t, "exit 1", nil)
	began := time.Now()
	err := dead.WaitHTTP200(ctx, "http://"+addr+"/")
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("WaitHTTP200 of a dead process: %v, want ErrExited", err)
	}
	if time.Since(began) > 5*time.Second {
		t.Errorf("took %v to notice the exit", time.Since(began))
	}

	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := WaitHTTP200(short, "http://"+addr+"/"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitHTTP200 with nothing listening: %v, want DeadlineExceeded", err)
	}
}

func TestTail(t *testing.T) {
	path := t.TempDir() + "/f.log"
	if err := os.WriteFile(path, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Tail(path, 2); got != "b\nc" {
		t.Errorf("Tail = %q", got)
	}
	if got := Tail(path, 10); got != "a\nb\nc" {
		t.Errorf("Tail = %q", got)
	}
}
