package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

const (
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
var repoRoot = sync.OnceValues(func() (string, error) { return binaries.ModuleRoot(".") })

func root(t *testing.T) string {
	t.Helper()
	r, err := repoRoot()
	if err != nil {
		t.Fatalf("repo root: %v", err)
	}
	return r
}

// installEnvoy runs scripts/install-envoy.sh once per test binary.
var installEnvoy = sync.OnceValues(func() (string, error) {
	r, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	return binaries.Envoy(ctx, r)
})

// envoyBinary returns the envoy to run: $E2E_ENVOY_BIN, or the pinned one
// from scripts/install-envoy.sh.
func envoyBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("E2E_ENVOY_BIN"); p != "" {
		if err := binaries.Executable(p); err != nil {
			t.Fatalf("E2E_ENVOY_BIN: %v", err)
		}
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
		if err := binaries.Executable(p); err != nil {
			t.Fatalf("E2E_SERVER_BIN: %v", err)
		}
		return p
	}
	out := filepath.Join(t.TempDir(), "ratelimit-authz")
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	if err := binaries.BuildServer(ctx, root(t), out); err != nil {
		unavailable(t, "%v", err)
	}
	return out
}

// serverConfigPath returns the server config the tests run with: the
// shipped one, or $E2E_SERVER_CONFIG (with $E2E_SERVER_BIN, to run the
// tests against another build and the configuration it understands).
func serverConfigPath(t *testing.T) string {
	t.Helper()
	p := filepath.Join(root(t), serverConfig)
	if c := os.Getenv("E2E_SERVER_CONFIG"); c != "" {
		p = c
	}
	if _, err := os.Stat(p); err != nil {
		unavailable(t, "server config: %v", err)
	}
	return p
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
			t.Logf("--- tail of %s ---\n%s", filepath.Base(f), proc.Tail(f, 40))
		}
	})
	return &logs{dir: dir}
}

// process is a child process whose output goes to <logdir>/<name>.log. It
// is stopped by PID in t.Cleanup: SIGTERM, then SIGKILL after stopGrace.
type process struct {
	*proc.Process
	reported sync.Once
}

func (l *logs) start(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	return l.startOwned(t, t, name, bin, args...)
}

// startOwned is start for a process that outlives the subtest t starting
// it: owner's cleanup stops it and its lifetime is owner's.
func (l *logs) startOwned(owner, t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	// The lifetime bounds the process even if cleanup never runs.
	p, err := proc.Start(context.Background(), proc.Config{
		Name: name, Path: bin, Args: args, LogDir: l.dir,
		Lifetime: processLifetime(owner), StopGrace: stopGrace,
	})
	if err != nil {
		t.Fatal(err)
	}
	pr := &process{Process: p}
	owner.Cleanup(func() { pr.stop(owner) })
	return pr
}

// processLifetime is the test's remaining time, less a margin for cleanup.
func processLifetime(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return max(time.Until(d)-30*time.Second, 30*time.Second)
	}
	return 10 * time.Minute
}

// stop stops the process (SIGTERM, SIGKILL after stopGrace) and waits for
// the exit; it may be called again. A process that died on its own, exits
// non-zero on SIGTERM or needs SIGKILL fails the test: each must shut down
// cleanly.
func (p *process) stop(t *testing.T) {
	t.Helper()
	err := p.Stop()
	p.reported.Do(func() {
		switch {
		case err == nil:
		case errors.Is(err, proc.ErrExited):
			if !t.Failed() { // else already reported
				t.Errorf("exited during the test: %v\n%s", err, p.Tail(20))
			}
		default:
			t.Errorf("%v, want exit status 0 after SIGTERM\n%s", err, p.Tail(20))
		}
	})
}

// kill sends SIGKILL to the process's PID, as a crash or the OOM killer
// would, and waits for it to exit; the stop at cleanup then has nothing
// to report.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if p.Exited() {
		t.Fatalf("%s exited before it was to be killed: %v\n%s", p.Name(), p.Err(), p.Tail(20))
	}
	// proc reaps the child only in its own Wait, which then closes Done:
	// the PID of a child that Exited reports running is still its own.
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s (pid %d): %v", p.Name(), p.PID(), err)
	}
	select {
	case <-p.Done():
	case <-time.After(stopGrace):
		t.Fatalf("%s (pid %d) still running %v after SIGKILL", p.Name(), p.PID(), stopGrace)
	}
	p.reported.Do(func() {})
}

// waitHTTP200 polls url until it answers 200 while p keeps running.
func waitHTTP200(t *testing.T, p *process, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := p.WaitHTTP200(ctx, url); err != nil {
		t.Fatalf("%v\n%s", err, p.Tail(30))
	}
}

// upstream is the application behind Envoy (exampleapp): 200, or 401 on
// a login without the right password; it counts the requests that reached
// it, per path, and records when each arrived and for which tenant.
type upstream struct {
	app  *exampleapp.App
	addr string

	mu   sync.Mutex
	hits []hit
}

// hit is one request that reached the app.
type hit struct {
	at     time.Time
	path   string
	tenant string // x-tenant-id
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{app: exampleapp.New()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := hit{at: time.Now(), path: r.URL.Path, tenant: r.Header.Get("x-tenant-id")}
		u.mu.Lock()
		u.hits = append(u.hits, h)
		u.mu.Unlock()
		u.app.ServeHTTP(w, r)
	})) // listens on 127.0.0.1:0
	t.Cleanup(srv.Close)
	u.addr = srv.Listener.Addr().String()
	return u
}

func (u *upstream) count(path string) int { return u.app.Hits(path) }

func (u *upstream) reset() {
	u.app.Reset()
	u.mu.Lock()
	u.hits = nil
	u.mu.Unlock()
}

// perWindow counts the requests of tenant to path that reached the app,
// per wall-clock second (the server's fixed windows of 1 s), for the whole
// seconds in [from, to).
func (u *upstream) perWindow(path, tenant string, from, to time.Time) []window {
	first := from.Truncate(time.Second)
	if first.Before(from) {
		first = first.Add(time.Second)
	}
	n := int(to.Truncate(time.Second).Sub(first) / time.Second)
	if n <= 0 {
		return nil
	}
	ws := make([]window, n)
	for i := range ws {
		ws[i].start = first.Add(time.Duration(i) * time.Second)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, h := range u.hits {
		if h.path != path || h.tenant != tenant || h.at.Before(first) {
			continue
		}
		if i := int(h.at.Sub(first) / time.Second); i < n {
			ws[i].admitted++
		}
	}
	return ws
}

// window is what one wall-clock second let through to the app.
type window struct {
	start    time.Time
	admitted int
}

// stack is one test's Envoy, server and upstream.
type stack struct {
	t        *testing.T
	envoyBin string
	logs     *logs
	addrs    envoyconf.Addrs
	// check are the nodes' lean Check listeners (serve --check-addr):
	// startEnvoy renders them as the endpoints of the ratelimit_authz_check
	// cluster, which the ext_authz filter calls, as shipped. Nil: Envoy's
	// checks go to the gRPC ports (s.addrs.Authz) and no node opens the
	// lean listener.
	check    []string
	httpAddr string // the server's HTTP (readyz, metrics) address
	// spare are addresses picked with the others, for a cluster's NATS
	// server and its nodes' HTTP ports.
	spare  []string
	up     *upstream
	envoy  *process
	server *process
	client *http.Client
	// envoyEdit, when set, changes the rendered bootstrap before Envoy
	// starts (e.g. envoyconf.WithTrustedHops).
	envoyEdit func([]byte) ([]byte, error)
}

// newStack starts the upstream and Envoy, but not the server; Envoy is
// ready when it returns. Prerequisites are resolved first, so a missing
// Envoy or binary skips before anything starts.
func newStack(t *testing.T) *stack {
	t.Helper()
	s := prepareStack(t, 1)
	s.startEnvoy()
	return s
}

// prepareStack resolves Envoy, starts the upstream and picks the addresses
// of Envoy and of nodes ratelimit-authz nodes (their gRPC ports, the
// endpoints of Envoy's ratelimit_authz cluster, s.addrs.Authz, and their
// lean Check listeners, those of ratelimit_authz_check, s.check), but
// starts neither Envoy nor a node.
func prepareStack(t *testing.T, nodes int) *stack {
	t.Helper()
	s := &stack{t: t, envoyBin: envoyBinary(t), logs: newLogs(t)}
	s.up = startUpstream(t)
	// One call, so that no two of the stack's addresses share a port.
	addrs := freeport.TestAddrs(t, 3+2*nodes+1+nodes)
	s.addrs = envoyconf.Addrs{Admin: addrs[0], Listener: addrs[1], App: s.up.addr, Authz: addrs[3 : 3+nodes]}
	s.check = addrs[3+nodes : 3+2*nodes]
	s.httpAddr = addrs[2]
	s.spare = addrs[3+2*nodes:]
	s.client = &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16},
	}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

// startEnvoy renders the shipped bootstrap with the stack's addresses,
// starts Envoy and waits until it is ready.
func (s *stack) startEnvoy() {
	t := s.t
	t.Helper()
	cfg := filepath.Join(s.logs.dir, "envoy.yaml")
	a := s.addrs
	a.Check = s.check
	if err := envoyconf.RenderFile(filepath.Join(root(t), envoyconf.Path), cfg, a); err != nil {
		t.Fatal(err)
	}
	if s.envoyEdit != nil {
		b, err := os.ReadFile(cfg)
		if err == nil {
			b, err = s.envoyEdit(b)
		}
		if err == nil {
			err = os.WriteFile(cfg, b, 0o644)
		}
		if err != nil {
			t.Fatalf("edit the bootstrap: %v", err)
		}
	}
	s.envoy = s.logs.start(t, "envoy", s.envoyBin,
		"-c", cfg,
		"--concurrency", "1",
		"--disable-hot-restart",
		"--log-level", "warn",
		// Startup, cluster and per-check lines; not the extension list.
		"--component-log-level", "config:info,upstream:info,ext_authz:debug",
	)
	waitHTTP200(t, s.envoy, "http://"+s.addrs.Admin+"/ready")
}

// startServer starts ratelimit-authz on the stack's gRPC, lean Check (if
// any) and HTTP addresses with the shipped config, and extra flags, and
// waits for /readyz.
func (s *stack) startServer(bin, config string, extra ...string) *process {
	s.t.Helper()
	args := []string{"serve",
		"--config", config,
		"--grpc-addr", s.addrs.Authz[0],
		"--http-addr", s.httpAddr,
		"--log-level", "debug",
	}
	args = append(args, "--check-addr", s.checkAddr(), "--admin-addr", "off") // extra may name an admin listener
	args = append(args, extra...)
	s.server = s.logs.start(s.t, "ratelimit-authz", bin, args...)
	waitHTTP200(s.t, s.server, "http://"+s.httpAddr+"/readyz")
	return s.server
}

// checkAddr is the --check-addr of the stack's first node: its lean
// listener, or off when Envoy calls the gRPC port.
func (s *stack) checkAddr() string {
	if len(s.check) > 0 {
		return s.check[0]
	}
	return "off"
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
	return s.postBody(path, header, `{}`)
}

// postBody is post with body.
func (s *stack) postBody(path string, header map[string]string, body string) (*response, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+s.addrs.Listener+path, strings.NewReader(body))
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
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("POST %s: read body: %w", path, err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: got}, nil
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
	return s.statsOf(s.t, filter)
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
