package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	modulePath   = "github.com/ratelimit-authz/ratelimit-authz"
	envoyConfig  = "envoy/ratelimit-authz.yaml"
	serverConfig = "config/ratelimit.yaml"

	installTimeout = 5 * time.Minute // cold Envoy install or go build
	readyTimeout   = 30 * time.Second
	stopGrace      = 10 * time.Second // SIGTERM → SIGKILL
)

// unavailable skips the test when a prerequisite is missing, except under
// CI=true, where a missing prerequisite is a broken build and fails it.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (skipped; fails under CI=true)", args...)
}

// repoRoot finds the module root by walking up from the test's directory.
var repoRoot = sync.OnceValues(func() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", modulePath)
		}
		dir = parent
	}
})

func root(t *testing.T) string {
	t.Helper()
	r, err := repoRoot()
	if err != nil {
		t.Fatalf("repo root: %v", err)
	}
	return r
}

// installEnvoy runs scripts/install-envoy.sh once per test binary; the
// script prints the envoy path as its last line.
var installEnvoy = sync.OnceValues(func() (string, error) {
	r, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(r, "scripts", "install-envoy.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/install-envoy.sh: %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	path := strings.TrimSpace(lines[len(lines)-1])
	if fi, err := os.Stat(path); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("scripts/install-envoy.sh printed %q, which is not an executable", path)
	}
	return path, nil
})

// envoyBinary returns the envoy to run: $E2E_ENVOY_BIN, or the pinned one
// from scripts/install-envoy.sh.
func envoyBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("E2E_ENVOY_BIN"); p != "" {
		return p
	}
	p, err := installEnvoy()
	if err != nil {
		unavailable(t, "envoy not available: %v", err)
	}
	return p
}

// serverBinary returns $E2E_SERVER_BIN, or builds ./cmd/ratelimit-authz
// into a temporary folder of the test.
func serverBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("E2E_SERVER_BIN"); p != "" {
		return p
	}
	out := filepath.Join(t.TempDir(), "ratelimit-authz")
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/ratelimit-authz")
	cmd.Dir = root(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		unavailable(t, "go build ./cmd/ratelimit-authz: %v\n%s", err, b)
	}
	return out
}

// serverConfigPath returns the shipped server config the tests run with.
func serverConfigPath(t *testing.T) string {
	t.Helper()
	p := filepath.Join(root(t), serverConfig)
	if _, err := os.Stat(p); err != nil {
		unavailable(t, "server config: %v", err)
	}
	return p
}

// freeAddr returns a loopback address whose port was free a moment ago.
// The port is released before use, so another process could take it in
// between; on a test machine that is rare enough.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("release %s: %v", addr, err)
	}
	return addr
}

// checkFor calls fn every step until it returns nil, and fails the test
// with fn's last error after timeout. fn runs on the test goroutine, so it
// may itself call t.Fatal to stop early.
func checkFor(t *testing.T, timeout, step time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", timeout, err)
		}
		time.Sleep(step)
	}
}

// logs is a test's folder of process logs. It is removed when the test
// passes and kept, with its path and the tail of every log printed, when
// it fails.
type logs struct{ dir string }

func newLogs(t *testing.T) *logs {
	t.Helper()
	base := os.Getenv("E2E_LOG_DIR")
	if base != "" {
		if err := os.MkdirAll(base, 0o755); err != nil {
			t.Fatalf("log folder: %v", err)
		}
	}
	name := regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(t.Name(), "_")
	dir, err := os.MkdirTemp(base, "ratelimit-authz-e2e-"+name+"-")
	if err != nil {
		t.Fatalf("log folder: %v", err)
	}
	// Registered before any process starts, so it runs after they stopped.
	t.Cleanup(func() {
		if !t.Failed() {
			if os.Getenv("E2E_KEEP_LOGS") != "" {
				t.Logf("process logs kept in %s", dir)
			} else {
				os.RemoveAll(dir)
			}
			return
		}
		t.Logf("process logs kept in %s", dir)
		files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		for _, f := range files {
			t.Logf("--- tail of %s ---\n%s", filepath.Base(f), tail(f, 40))
		}
	})
	return &logs{dir: dir}
}

func tail(path string, n int) string {
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

// proc is a child process whose output goes to <logdir>/<name>.log. It is
// stopped by PID in t.Cleanup: SIGTERM, then SIGKILL after stopGrace.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // Wait's result, valid once done is closed
	stopped sync.Once
}

func (l *logs) start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, logPath: filepath.Join(l.dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.logPath)
	if err != nil {
		t.Fatalf("%s log: %v", name, err)
	}
	fmt.Fprintf(f, "[e2e] %s %s\n", bin, strings.Join(args, " "))

	// The context bounds the process's life even if cleanup never runs.
	ctx, cancel := context.WithTimeout(context.Background(), processLifetime(t))
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	p.cmd.WaitDelay = stopGrace
	p.cmd.Stdout, p.cmd.Stderr = f, f // *os.File: no copying goroutines
	if err := p.cmd.Start(); err != nil {
		cancel()
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		fmt.Fprintf(f, "[e2e] %s exited: %v\n", name, p.err)
		f.Close()
		cancel()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// processLifetime is the test's remaining time, less a margin for cleanup.
func processLifetime(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return max(time.Until(d)-30*time.Second, 30*time.Second)
	}
	return 10 * time.Minute
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process's PID, then SIGKILL if it has not
// exited within stopGrace. It waits for the exit and may be called again.
// A process that died on its own, or exits non-zero on SIGTERM, fails the
// test: both must shut down cleanly.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.stopped.Do(func() {
		if p.exited() {
			if !t.Failed() { // else already reported
				t.Errorf("%s exited during the test: %v\n%s", p.name, p.err, tail(p.logPath, 20))
			}
			return
		}
		pid := p.cmd.Process.Pid
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("SIGTERM %s (pid %d): %v", p.name, pid, err)
		}
		select {
		case <-p.done:
			if p.err != nil {
				t.Errorf("%s (pid %d) after SIGTERM: %v, want exit status 0", p.name, pid, p.err)
			}
			return
		case <-time.After(stopGrace):
		}
		t.Errorf("%s (pid %d) ignored SIGTERM for %v; sending SIGKILL", p.name, pid, stopGrace)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("SIGKILL %s (pid %d): %v", p.name, pid, err)
		}
		<-p.done
	})
}

// fatalIfExited stops a readiness wait early when the process died.
func (p *proc) fatalIfExited(t *testing.T) {
	t.Helper()
	if p.exited() {
		t.Fatalf("%s exited before it was ready: %v\n%s", p.name, p.err, tail(p.logPath, 30))
	}
}

// waitHTTP200 polls url until it answers 200 while p keeps running.
func waitHTTP200(t *testing.T, p *proc, url string) {
	t.Helper()
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	checkFor(t, readyTimeout, 50*time.Millisecond, func() error {
		p.fatalIfExited(t)
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, bytes.TrimSpace(body))
		}
		return nil
	})
}

// envoyAddrs are the four addresses of envoy/ratelimit-authz.yaml.
type envoyAddrs struct {
	Admin    string // 127.0.0.1:9901 in the shipped file
	Listener string // 127.0.0.1:10000
	Authz    string // 127.0.0.1:9001, cluster ratelimit_authz
	App      string // 127.0.0.1:8080, cluster app
}

// renderEnvoyConfig writes a copy of the shipped bootstrap with the test's
// addresses. Each shipped address must occur exactly once, so a changed
// bootstrap fails here instead of silently keeping a fixed port.
func renderEnvoyConfig(t *testing.T, dir string, a envoyAddrs) string {
	t.Helper()
	src := filepath.Join(root(t), envoyConfig)
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("read %s: %v", envoyConfig, err)
	}
	cfg := string(b)
	for _, r := range []struct{ port, addr string }{
		{"9901", a.Admin}, {"10000", a.Listener}, {"9001", a.Authz}, {"8080", a.App},
	} {
		host, port, err := net.SplitHostPort(r.addr)
		if err != nil {
			t.Fatalf("address %q: %v", r.addr, err)
		}
		old := "address: 127.0.0.1, port_value: " + r.port + " }"
		if n := strings.Count(cfg, old); n != 1 {
			t.Fatalf("%s: %q occurs %d times, want 1", envoyConfig, old, n)
		}
		cfg = strings.Replace(cfg, old, "address: "+host+", port_value: "+port+" }", 1)
	}
	out := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(out, []byte(cfg), 0o644); err != nil {
		t.Fatalf("write envoy config: %v", err)
	}
	return out
}

// upstream is the application behind Envoy: it answers 200 (401 on a
// login without the right password) and counts the requests that reached
// it, per path.
type upstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{hits: map[string]int{}}
	// httptest listens on 127.0.0.1:0.
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		u.mu.Lock()
		u.hits[r.URL.Path]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		// The login routes check a password: only "right" is.
		if strings.HasSuffix(r.URL.Path, "/login") && !strings.Contains(string(body), `"password":"right"`) {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"bad credentials"}`)
			return
		}
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) addr() string { return u.srv.Listener.Addr().String() }

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

func (u *upstream) reset() {
	u.mu.Lock()
	defer u.mu.Unlock()
	clear(u.hits)
}

// stack is one test's Envoy, server and upstream.
type stack struct {
	t        *testing.T
	logs     *logs
	addrs    envoyAddrs
	httpAddr string // the server's HTTP (readyz, metrics) address
	up       *upstream
	envoy    *proc
	server   *proc
	client   *http.Client
}

// newStack starts the upstream and Envoy, but not the server; Envoy is
// ready when it returns. Prerequisites are resolved first, so a missing
// Envoy or binary skips before anything starts.
func newStack(t *testing.T) *stack {
	t.Helper()
	envoyBin := envoyBinary(t)
	s := &stack{t: t, logs: newLogs(t)}
	s.up = startUpstream(t)
	s.addrs = envoyAddrs{Admin: freeAddr(t), Listener: freeAddr(t), Authz: freeAddr(t), App: s.up.addr()}
	s.httpAddr = freeAddr(t)
	s.client = &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16},
	}
	t.Cleanup(s.client.CloseIdleConnections)

	cfg := renderEnvoyConfig(t, s.logs.dir, s.addrs)
	s.envoy = s.logs.start(t, "envoy", envoyBin,
		"-c", cfg,
		"--concurrency", "1",
		"--disable-hot-restart",
		"--log-level", "warn",
		// Startup, cluster and per-check lines; not the extension list.
		"--component-log-level", "config:info,upstream:info,ext_authz:debug",
	)
	waitHTTP200(t, s.envoy, "http://"+s.addrs.Admin+"/ready")
	return s
}

// startServer starts ratelimit-authz on the stack's gRPC and HTTP
// addresses with the shipped config and waits for /readyz.
func (s *stack) startServer(bin, config string) *proc {
	s.t.Helper()
	s.server = s.logs.start(s.t, "ratelimit-authz", bin, "serve",
		"--config", config,
		"--grpc-addr", s.addrs.Authz,
		"--http-addr", s.httpAddr,
		"--log-level", "debug",
	)
	waitHTTP200(s.t, s.server, "http://"+s.httpAddr+"/readyz")
	return s.server
}

// response is a finished HTTP exchange through Envoy.
type response struct {
	status int
	header http.Header
	body   []byte
}

// post sends POST path through Envoy's listener. It is safe for
// concurrent use and returns transport errors rather than failing.
func (s *stack) post(path string, header map[string]string) (*response, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+s.addrs.Listener+path, strings.NewReader(`{}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("POST %s: read body: %w", path, err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

func (s *stack) mustPost(path string, header map[string]string) *response {
	s.t.Helper()
	r, err := s.post(path, header)
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// envoyStats returns Envoy's integer stats whose names match the regex.
func (s *stack) envoyStats(filter string) map[string]int64 {
	s.t.Helper()
	resp, err := s.client.Get("http://" + s.addrs.Admin + "/stats?filter=" + filter)
	if err != nil {
		s.t.Fatalf("envoy stats: %v", err)
	}
	defer resp.Body.Close()
	stats := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(val, 10, 64); err == nil { // skips histograms
			stats[name] = n
		}
	}
	if err := sc.Err(); err != nil {
		s.t.Fatalf("envoy stats: %v", err)
	}
	return stats
}

func formatStats(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %d", k, m[k])
	}
	return b.String()
}
