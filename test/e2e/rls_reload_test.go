package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// configMap is a directory laid out as the kubelet writes a mounted
// ConfigMap: the files live in a hidden ..<version> directory, ..data
// links to it and each file name links into ..data. An update writes a
// new version directory, points a new link at it, renames the link over
// ..data (the one atomic step) and removes the old version.
type configMap struct {
	dir     string
	version int
}

// reloadBound is a generous bound on the time from a swap to Envoy's
// answers under it: the watcher's debounce (200 ms) and a few checks; the
// test logs what it measured, and a loaded machine must not fail it.
const reloadBound = 5 * time.Second

func newConfigMap(t *testing.T, dir string, files map[string]string) *configMap {
	t.Helper()
	m := &configMap{dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m.update(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// update swaps the ConfigMap's files for files (the same names).
func (m *configMap) update(t *testing.T, files map[string]string) {
	t.Helper()
	m.version++
	v := fmt.Sprintf("..2026_12_02_00_00_%02d.%d", m.version, m.version)
	if err := os.Mkdir(filepath.Join(m.dir, v), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(m.dir, v, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(m.dir, "..data"))
	if err := os.Symlink(v, filepath.Join(m.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(m.dir, "..data_tmp"), filepath.Join(m.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(m.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// reloadRule is the descriptor file of the reload test with one limit a
// minute on ("generic_key", "reload").
func reloadRule(perMinute int) string {
	return fmt.Sprintf(`domain: rls_reload
descriptors:
  - key: generic_key
    value: reload
    rate_limit:
      unit: minute
      requests_per_unit: %d
`, perMinute)
}

// TestRLSReloadThroughEnvoy: the server's runtime directory is a mounted
// ConfigMap (RUNTIME_ROOT/ratelimit/config, the kubelet's ..data layout).
// Each update is one atomic ..data swap; Envoy's answers follow within a
// second, without a restart: 100 a minute, then 0 (every request 429),
// then a broken file, which is refused while 0 keeps serving, then 200 a
// minute. The latency from each swap to the first answer under the new
// limit is logged.
func TestRLSReloadThroughEnvoy(t *testing.T) { bothPorts(t, testRLSReloadThroughEnvoy) }

func testRLSReloadThroughEnvoy(t *testing.T, lean bool) {
	serverBin := serverBinary(t)
	s := prepareRLSStack(t, 1, lean)
	runtimeRoot := filepath.Join(t.TempDir(), "runtime")
	cm := newConfigMap(t, filepath.Join(runtimeRoot, rlsSubdirectory, "config"), map[string]string{"reload.yaml": reloadRule(100)})
	route := func(b []byte) ([]byte, error) {
		return envoyconf.WithRateLimitRoutes(b, envoyconf.RateLimitRoute{Name: "reload", Prefix: "/reload", Domain: "rls_reload",
			RateLimits: []envoyconf.RateLimit{{Actions: []envoyconf.Action{envoyconf.GenericKey("", "reload")}}}})
	}
	a := s.rlsAddrs(s.addrs, 0, 1)
	s.envoy = s.startEnvoyConfig(t, "envoy", s.addrs.Admin, renderRLS(t, a, route))
	srv := s.startRLSServer(serverBin, runtimeRoot)
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error { return rlsClusterHealthy(s, s.addrs.Admin, rlsEndpoint(a)) })
	pid := srv.PID()

	limitNow := func() (*response, error) { return s.get(s.addrs.Listener, "/reload", nil) }
	if r := s.mustGet(s.addrs.Listener, "/reload", nil); r.status != http.StatusOK || r.header.Get("x-ratelimit-limit") != "100, 100;w=60" {
		t.Fatalf("before any update: status %d, x-ratelimit-limit %q; want 200 and 100 a minute", r.status, r.header.Get("x-ratelimit-limit"))
	}
	// swap updates the ConfigMap and returns how long Envoy took to answer
	// under limit (its x-ratelimit-limit); status 0 accepts any status.
	// The polls are counted: 10 ms apart, fewer than 100 a second.
	swap := func(t *testing.T, body, limit string, status int) time.Duration {
		t.Helper()
		start := time.Now()
		cm.update(t, map[string]string{"reload.yaml": body})
		var took time.Duration
		poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
			r, err := limitNow()
			if err != nil {
				return err
			}
			if got := r.header.Get("x-ratelimit-limit"); got != limit || (status != 0 && r.status != status) {
				return fmt.Errorf("status %d, x-ratelimit-limit %q; want %q (status %d)", r.status, got, limit, status)
			}
			took = time.Since(start)
			return nil
		})
		return took
	}

	t.Run("to_0", func(t *testing.T) {
		took := swap(t, reloadRule(0), "0, 0;w=60", http.StatusTooManyRequests)
		t.Logf("..data swap to 0 a minute: Envoy answered 429 under it %v after the swap", took.Round(time.Millisecond))
		if took > reloadBound {
			t.Errorf("the reload took %v to reach Envoy's answers, want ≤ %v", took, reloadBound)
		}
	})

	t.Run("broken_keeps_the_old", func(t *testing.T) {
		failures := metricOf(t, s.client, s.httpAddr, `ratelimit_authz_config_reloads_total{result="failure"}`)
		cm.update(t, map[string]string{"reload.yaml": "domain: rls_reload\ndescriptors:\n  - key: generic_key\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"})
		poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
			if got := metricOf(t, s.client, s.httpAddr, `ratelimit_authz_config_reloads_total{result="failure"}`); got <= failures {
				return fmt.Errorf("reload failures %v, want more than %v", got, failures)
			}
			return nil
		})
		for range 20 {
			r := s.mustGet(s.addrs.Listener, "/reload", nil)
			if r.status != http.StatusTooManyRequests || r.header.Get("x-ratelimit-limit") != "0, 0;w=60" {
				t.Fatalf("after a broken update: status %d, x-ratelimit-limit %q; want the previous limit (429, 0 a minute)", r.status, r.header.Get("x-ratelimit-limit"))
			}
		}
		if v := metricOf(t, s.client, s.httpAddr, "ratelimit_authz_config_last_reload_successful"); v != 0 {
			t.Errorf("ratelimit_authz_config_last_reload_successful %v after a refused reload, want 0", v)
		}
	})

	t.Run("to_200", func(t *testing.T) {
		// The rule keeps its window, so it keeps its count: what the
		// polls spent of the 100 counts against the 200.
		took := swap(t, reloadRule(200), "200, 200;w=60", 0)
		t.Logf("..data swap to 200 a minute after the broken one: Envoy answered under it %v after the swap", took.Round(time.Millisecond))
		if took > reloadBound {
			t.Errorf("the reload took %v to reach Envoy's answers, want ≤ %v", took, reloadBound)
		}
	})
	if srv.PID() != pid || srv.Exited() {
		t.Errorf("the server restarted or exited during the reloads")
	}
}
