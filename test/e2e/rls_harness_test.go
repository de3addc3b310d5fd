package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

// The RLS tests run Envoy's own rate limit filter (envoy/ratelimit-rls.yaml,
// rendered by internal/envoyconf) against ratelimit-authz serving
// ShouldRateLimit from a runtime directory laid out as envoyproxy/ratelimit
// reads it: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml, given to the
// server by the same environment variables.

// rlsSubdirectory is RUNTIME_SUBDIRECTORY of the tests' runtime
// directories, as envoyproxy/ratelimit's own examples name it.
const rlsSubdirectory = "ratelimit"

// rlsExamples returns the shipped descriptor files, config/rls/config/*,
// by file name.
func rlsExamples(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root(t), "config", "rls", "config", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no descriptor files in config/rls/config: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = string(b)
	}
	return out
}

// writeRLSRuntime writes files into a new runtime directory's
// RUNTIME_SUBDIRECTORY/config and returns RUNTIME_ROOT.
func writeRLSRuntime(t *testing.T, files map[string]string) string {
	t.Helper()
	rootDir := filepath.Join(t.TempDir(), "runtime")
	dir := filepath.Join(rootDir, rlsSubdirectory, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return rootDir
}

// rlsEnv is the environment of a server serving the runtime directory
// at runtimeRoot: the test's own plus envoyproxy/ratelimit's settings.
func rlsEnv(runtimeRoot string, extra ...string) []string {
	env := append(os.Environ(), "RUNTIME_ROOT="+runtimeRoot, "RUNTIME_SUBDIRECTORY="+rlsSubdirectory)
	return append(env, extra...)
}

// startEnv is logs.startOwned with an environment.
func (l *logs) startEnv(owner, t *testing.T, name string, env []string, bin string, args ...string) *process {
	t.Helper()
	p, err := proc.Start(context.Background(), proc.Config{
		Name: name, Path: bin, Args: args, Env: env, LogDir: l.dir,
		Lifetime: processLifetime(owner), StopGrace: stopGrace,
	})
	if err != nil {
		t.Fatal(err)
	}
	pr := &process{Process: p}
	owner.Cleanup(func() { pr.stop(owner) })
	return pr
}

// bothPorts runs f once per port Envoy's filters may call: the lean
// listener (lean: serve --check-addr, as the shipped bootstraps have it)
// and the gRPC port (a node without a lean listener).
func bothPorts(t *testing.T, f func(t *testing.T, lean bool)) {
	for _, lean := range []bool{true, false} {
		name := "grpc-port"
		if lean {
			name = "lean-listener"
		}
		t.Run(name, func(t *testing.T) { f(t, lean) })
	}
}

// prepareRLSStack is prepareStack for the RLS tests: without lean, the
// nodes open no lean listener and Envoy calls their gRPC ports.
func prepareRLSStack(t *testing.T, nodes int, lean bool) *stack {
	t.Helper()
	s := prepareStack(t, nodes)
	if !lean {
		s.check = nil
	}
	return s
}

// startRLSExamples starts one node serving the shipped descriptor files
// and one Envoy with the shipped ratelimit-filter bootstrap in front of
// the upstream at app, and waits until Envoy sees the node healthy.
func startRLSExamples(t *testing.T, lean bool, app string) *stack {
	t.Helper()
	return startRLSFiles(t, lean, app, rlsExamples(t))
}

// startRLSFiles is startRLSExamples serving files (by name) instead.
func startRLSFiles(t *testing.T, lean bool, app string, files map[string]string) *stack {
	t.Helper()
	serverBin := serverBinary(t)
	s := prepareRLSStack(t, 1, lean)
	runtimeRoot := writeRLSRuntime(t, files)
	a := s.rlsAddrs(s.addrs, 0, 1)
	a.App = app
	s.envoy = s.startEnvoyConfig(t, "envoy", s.addrs.Admin, renderRLS(t, a))
	s.startRLSServer(serverBin, runtimeRoot)
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error {
		return rlsClusterHealthy(s, s.addrs.Admin, rlsEndpoint(a))
	})
	return s
}

// rlsAddrs is a with the lean listeners of the stack's nodes lo to hi
// (none without them) as the rate limit cluster's endpoints.
func (s *stack) rlsAddrs(a envoyconf.Addrs, lo, hi int) envoyconf.Addrs {
	a.Check = nil
	if s.check != nil {
		a.Check = s.check[lo:hi]
	}
	return a
}

// rlsEndpoint is the first endpoint of the rate limit cluster rendered
// with a: the lean listener's when there is one, else the gRPC port's.
func rlsEndpoint(a envoyconf.Addrs) string {
	if len(a.Check) > 0 {
		return a.Check[0]
	}
	return a.Authz[0]
}

// startRLSServer starts ratelimit-authz on the stack's gRPC, lean (if
// any) and HTTP addresses, serving the runtime directory at runtimeRoot
// beside the shipped ext_authz configuration, and waits for /readyz.
func (s *stack) startRLSServer(bin, runtimeRoot string, env ...string) *process {
	s.t.Helper()
	args := []string{"serve",
		"--config", serverConfigPath(s.t),
		"--grpc-addr", s.addrs.Authz[0],
		"--http-addr", s.httpAddr,
		"--log-level", "debug",
	}
	args = append(args, "--check-addr", s.checkAddr(), "--admin-addr", "off")
	s.server = s.logs.startEnv(s.t, s.t, "ratelimit-authz", rlsEnv(runtimeRoot, env...), bin, args...)
	waitHTTP200(s.t, s.server, "http://"+s.httpAddr+"/readyz")
	return s.server
}

// renderRLS renders envoy/ratelimit-rls.yaml with a's addresses, then
// applies edits in order.
func renderRLS(t *testing.T, a envoyconf.Addrs, edits ...func([]byte) ([]byte, error)) []byte {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root(t), envoyconf.RLSPath))
	if err != nil {
		t.Fatal(err)
	}
	out, err := envoyconf.Render(src, a)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edits {
		if out, err = e(out); err != nil {
			t.Fatalf("edit the RLS bootstrap: %v", err)
		}
	}
	return out
}

// startEnvoyConfig starts an Envoy named name (its log <name>.log) on the
// bootstrap cfg, owned by owner, and waits until its admin at admin is
// ready.
func (s *stack) startEnvoyConfig(owner *testing.T, name, admin string, cfg []byte) *process {
	t := s.t
	t.Helper()
	path := filepath.Join(s.logs.dir, name+".yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	p := s.logs.startOwned(owner, t, name, s.envoyBin,
		"-c", path,
		"--concurrency", "1",
		"--disable-hot-restart",
		"--log-level", "warn",
		"--component-log-level", "config:info,upstream:info",
	)
	waitHTTP200(t, p, "http://"+admin+"/ready")
	return p
}

// get sends GET path to an Envoy listener with the headers (x-forwarded-for
// included, for Envoys that trust one hop). Transport errors are
// returned, not fatal.
func (s *stack) get(listener, path string, hdr map[string]string) (*response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+listener+path, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s%s: %w", listener, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s%s: read body: %w", listener, path, err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

func (s *stack) mustGet(listener, path string, hdr map[string]string) *response {
	s.t.Helper()
	r, err := s.get(listener, path, hdr)
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// statuses is the sequence of statuses of rs, for messages.
func statuses(rs []*response) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(r.status))
	}
	return b.String()
}

// inOneSecond sends n requests made by req one after the other, starting
// 10 ms into a fresh wall-clock second; when they straddle a second
// boundary (a slow machine) it tries once more, a second later. It
// returns the answers and whether they all fell into one second.
func inOneSecond(t *testing.T, n int, req func(i int) *response) ([]*response, bool) {
	t.Helper()
	for attempt := 0; attempt < 2; attempt++ {
		next := time.Now().Truncate(time.Second).Add(time.Duration(1+attempt)*time.Second + 10*time.Millisecond)
		time.Sleep(time.Until(next))
		start := time.Now()
		out := make([]*response, n)
		for i := range n {
			out[i] = req(i)
		}
		if time.Now().Truncate(time.Second).Equal(start.Truncate(time.Second)) {
			return out, true
		}
		t.Logf("%d requests took %v and crossed a second boundary; again", n, time.Since(start))
	}
	return nil, false
}
