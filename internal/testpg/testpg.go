// Package testpg starts a real, throwaway PostgreSQL server for tests: a
// fresh cluster (initdb) in a temporary directory, listening on a free port
// of 127.0.0.1 with trust authentication, stopped and removed when the test
// ends.
//
// It uses Debian's server binaries (/usr/lib/postgresql/*/bin, the newest
// version found; PG_BIN overrides the directory). As root, initdb and
// pg_ctl run as the postgres user through runuser, since PostgreSQL refuses
// to run as root. When the binaries are missing the test is skipped, except
// under CI=true, where a missing PostgreSQL fails the test: CI must never
// go green by testing nothing. scripts/install-postgres.sh installs them.
//
// Every external command runs with a timeout, so a broken installation
// fails a test instead of hanging it.
package testpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
)

const (
	initdbTimeout = 2 * time.Minute
	startTimeout  = 30 * time.Second // pg_ctl -w -t
	stopTimeout   = 30 * time.Second
	cmdSlack      = 15 * time.Second // beyond pg_ctl's own -t
	superuser     = "postgres"
)

// Server is one running (or stopped) throwaway PostgreSQL cluster. Its
// methods take the test that uses it and fail it on error; they are safe
// for concurrent use.
type Server struct {
	bin     string // directory of initdb, pg_ctl, postgres
	base    string // temporary directory holding everything below
	data    string
	sock    string
	logFile string
	asUser  string // "postgres" when running as root, else ""
	port    int

	mu      sync.Mutex
	running bool
}

// unavailable skips, or under CI=true fails, a test that cannot get a
// PostgreSQL server.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("testpg: "+format+" (CI=true: a missing PostgreSQL is a failure; run scripts/install-postgres.sh)", args...)
	}
	t.Skipf("testpg: "+format+" (skipped; run scripts/install-postgres.sh, and under CI=true this fails)", args...)
}

// binDir finds the newest Debian PostgreSQL server binaries.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if d := os.Getenv("PG_BIN"); d != "" {
		dirs = []string{d}
	}
	// Newest major version first: 9.6 < 10 < 15 < 16, so compare numerically.
	major := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int {
		switch ma, mb := major(a), major(b); {
		case ma > mb:
			return -1
		case ma < mb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if d := os.Getenv("PG_BIN"); d != "" {
		return "", fmt.Errorf("PG_BIN=%s lacks the PostgreSQL server binaries initdb, pg_ctl and postgres", d)
	}
	return "", errors.New("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (Debian package postgresql)")
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Start initialises a new cluster and starts it. The server is stopped and
// its files removed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		unavailable(t, "%v", err)
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			unavailable(t, "running as root, but there is no postgres user to run the server as: %v", err)
		}
		if _, err := exec.LookPath("runuser"); err != nil {
			unavailable(t, "running as root, but runuser is missing: %v", err)
		}
		s.asUser = "postgres"
	}
	// Not t.TempDir: its parent is private to this user, and the server may
	// run as another one.
	s.base, err = os.MkdirTemp("", "testpg-")
	if err != nil {
		t.Fatalf("testpg: temp dir: %v", err)
	}
	t.Cleanup(func() {
		s.stop(t, "immediate")
		os.RemoveAll(s.base)
	})
	if err := os.Chmod(s.base, 0o755); err != nil {
		t.Fatalf("testpg: %v", err)
	}
	s.data = filepath.Join(s.base, "data")
	s.sock = filepath.Join(s.base, "sock")
	s.logFile = filepath.Join(s.base, "server.log")
	if s.asUser != "" {
		u, _ := user.Lookup(s.asUser)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(s.base, uid, gid); err != nil {
			t.Fatalf("testpg: chown %s: %v", s.base, err)
		}
	}
	if out, err := s.command(initdbTimeout, "initdb",
		"-D", s.data, "-U", superuser, "--auth=trust", "--no-sync",
		"--encoding=UTF8", "--locale=C", "--no-instructions",
	); err != nil {
		t.Fatalf("testpg: initdb: %v\n%s", err, out)
	}
	if out, err := s.command(10*time.Second, "", "mkdir", "-p", s.sock); err != nil {
		t.Fatalf("testpg: mkdir: %v\n%s", err, out)
	}
	// A free port can be taken between our probe and the server's bind:
	// try a few.
	var lastErr error
	for range 5 {
		if s.port, lastErr = freeport.Port(); lastErr != nil {
			continue
		}
		if lastErr = s.startServer(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("testpg: start: %v\n%s", lastErr, s.Log())
	return nil
}

// URL is the connection string of the server's postgres database, as the
// superuser, over TCP.
func (s *Server) URL() string { return s.DatabaseURL("postgres") }

// DatabaseURL is the connection string of database db on this server.
func (s *Server) DatabaseURL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable&connect_timeout=5",
	}
	return u.String()
}

// Port is the TCP port the server listens on, the same across restarts.
func (s *Server) Port() int { return s.port }

// Log returns the server's log so far, for failure messages.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logFile)
	return string(b)
}

// Stop stops the server ("fast" shutdown: clients are disconnected at
// once). Start brings it back on the same port with the same data.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop(t, "fast"); err != nil {
		t.Fatalf("testpg: stop: %v\n%s", err, s.Log())
	}
}

// Start starts a stopped server again, on the same port.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	running := s.running
	s.mu.Unlock()
	if running {
		return
	}
	if err := s.startServer(); err != nil {
		t.Fatalf("testpg: restart: %v\n%s", err, s.Log())
	}
}

// CreateDatabase creates a new, empty database and returns its URL.
func (s *Server) CreateDatabase(t testing.TB, name string) string {
	t.Helper()
	if out, err := s.command(30*time.Second, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-d", s.URL(), "-c", `CREATE DATABASE "`+strings.ReplaceAll(name, `"`, `""`)+`"`); err != nil {
		t.Fatalf("testpg: create database %s: %v\n%s", name, err, out)
	}
	return s.DatabaseURL(name)
}

func (s *Server) startServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	opts := strings.Join([]string{
		"-p", strconv.Itoa(s.port),
		"-k", s.sock,
		"-c", "listen_addresses=127.0.0.1",
		// A throwaway cluster: durability buys nothing.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=50",
	}, " ")
	out, err := s.command(startTimeout+cmdSlack, "pg_ctl",
		"-D", s.data, "-l", s.logFile, "-o", opts,
		"-w", "-t", strconv.Itoa(int(startTimeout/time.Second)), "start")
	if err != nil {
		// pg_ctl may have started a postmaster it then gave up on.
		s.kill()
		return fmt.Errorf("pg_ctl start on port %d: %w\n%s", s.port, err, out)
	}
	s.running = true
	return nil
}

// stop stops the server if it runs; mode is a pg_ctl shutdown mode. When
// pg_ctl fails, the postmaster is killed by its PID.
func (s *Server) stop(t testing.TB, mode string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	s.running = false
	out, err := s.command(stopTimeout+cmdSlack, "pg_ctl",
		"-D", s.data, "-m", mode, "-w", "-t", strconv.Itoa(int(stopTimeout/time.Second)), "stop")
	if err != nil {
		if !s.kill() {
			t.Logf("testpg: pg_ctl stop failed and no postmaster PID to kill: %v\n%s", err, out)
		}
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// kill sends SIGKILL to the postmaster named in postmaster.pid, if any, and
// waits briefly for it to go; it reports whether there was one. Its
// children exit when they notice the postmaster is gone.
func (s *Server) kill() bool {
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return false
	}
	if syscall.Kill(pid, syscall.SIGKILL) != nil {
		return false
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// command runs one of the server binaries (or, with tool "", the plain
// command args[0]), as the postgres user when we are root.
func (s *Server) command(timeout time.Duration, tool string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	name := ""
	if tool != "" {
		name = filepath.Join(s.bin, tool)
	} else {
		name, args = args[0], args[1:]
	}
	if s.asUser != "" {
		args = append([]string{"-u", s.asUser, "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = s.base
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// pg_ctl leaves the postmaster running with our pipes unless its log
	// goes to a file (it does, -l); WaitDelay bounds the wait regardless.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out after %v: %w", filepath.Base(name), timeout, err)
	}
	return out.Bytes(), err
}

// Connect opens a connection to url for the test and closes it when the
// test ends; it fails the test when no connection comes within 30 s.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testpg: connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(ctx) // fails harmlessly once the server was stopped
	})
	return conn
}

// DB is a running throwaway server with the schema applied, a connection
// to it and a context that bounds the test's queries. Its methods fail the
// test on error.
type DB struct {
	Server *Server
	URL    string
	Conn   *pgx.Conn
	Ctx    context.Context
}

// StartDB starts a server, connects and applies migrate (the product's
// schema) within two minutes.
func StartDB(t testing.TB, migrate func(context.Context, *pgx.Conn) error) *DB {
	t.Helper()
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	d := &DB{Server: s, URL: s.URL(), Ctx: ctx}
	d.Conn = d.Connect(t)
	if err := migrate(ctx, d.Conn); err != nil {
		t.Fatalf("testpg: migrate: %v", err)
	}
	return d
}

// Connect opens another connection (see Connect).
func (d *DB) Connect(t testing.TB) *pgx.Conn {
	t.Helper()
	return Connect(t, d.URL)
}

// Exec runs sql on Conn.
func (d *DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := d.Conn.Exec(d.Ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// Count runs sql, a query of one integer, on Conn.
func (d *DB) Count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := d.Conn.QueryRow(d.Ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
