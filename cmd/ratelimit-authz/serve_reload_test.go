package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// activityRules is a configuration with activity_create at limit per hour.
func activityRules(limit int) string {
	return fmt.Sprintf(`keys:
  tenant_header: x-tenant-id
buckets:
  activity_create: {limit: %d, per: 1h, key: tenant}
  upload: {limit: 10, per: 1s, key: tenant}
routes:
  - {method: POST, path: /api/activities, buckets: [activity_create]}
  - {method: POST, path: /api/uploads, buckets: [upload]}
`, limit)
}

func checkAllowed(t *testing.T, c authv3.AuthorizationClient, tenant string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, activity(tenant))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return resp.GetStatus().GetCode() == int32(codes.OK)
}

// spendTo takes checks of tenant until one is denied, and returns how many
// were allowed (at most 100).
func spendTo(t *testing.T, c authv3.AuthorizationClient, tenant string) int {
	t.Helper()
	for n := range 100 {
		if !checkAllowed(t, c, tenant) {
			return n
		}
	}
	t.Fatal("100 checks allowed")
	return 0
}

// untilAllowed polls a check of tenant (a denied one counts nothing)
// until one is allowed, and returns how long that took from since.
func untilAllowed(t *testing.T, c authv3.AuthorizationClient, tenant string, since time.Time) time.Duration {
	t.Helper()
	var took time.Duration
	poll.Until(t, 5*time.Second, 2*time.Millisecond, func() error {
		if !checkAllowed(t, c, tenant) {
			return fmt.Errorf("still denied")
		}
		took = time.Since(since)
		return nil
	})
	return took
}

func metricOf(t *testing.T, n *servedNode, series string) float64 {
	t.Helper()
	_, page := scrape.Page(t, "http://"+n.http+"/metrics")
	m, err := scrape.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m.Get(series)
	if !ok {
		t.Fatalf("no %s", series)
	}
	return v
}

// A running serve follows its configuration file: an edit written in
// place, a file renamed over it, and a Kubernetes ConfigMap's ..data
// swap each apply within a bound; a broken edit is refused, counted, and
// checks go on under the last good configuration; counts survive.
func TestServeReloadsOnFileChange(t *testing.T) {
	cases := []struct {
		name   string
		layout func(t *testing.T, dir string) (path string, update func(text string))
	}{
		{"write in place", func(t *testing.T, dir string) (string, func(string)) {
			p := filepath.Join(dir, "ratelimit.yaml")
			return p, func(text string) { writeFile(t, p, text) }
		}},
		{"rename over", func(t *testing.T, dir string) (string, func(string)) {
			p := filepath.Join(dir, "ratelimit.yaml")
			return p, func(text string) {
				tmp := p + ".tmp"
				writeFile(t, tmp, text)
				if err := os.Rename(tmp, p); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"ConfigMap ..data swap", func(t *testing.T, dir string) (string, func(string)) {
			// The kubelet's layout: the file is a symlink through ..data to
			// a timestamped directory; an update writes a new directory and
			// renames a new ..data symlink over the old one.
			gen := 0
			swap := func(text string) {
				gen++
				ts := filepath.Join(dir, fmt.Sprintf("..2026_12_02_00_00_%02d.000", gen))
				if err := os.Mkdir(ts, 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(ts, "ratelimit.yaml"), text)
				tmp := filepath.Join(dir, "..data_tmp")
				if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
				if gen > 1 {
					os.RemoveAll(filepath.Join(dir, fmt.Sprintf("..2026_12_02_00_00_%02d.000", gen-1)))
				}
			}
			return filepath.Join(dir, "ratelimit.yaml"), func(text string) {
				if gen == 0 {
					swap(text)
					if err := os.Symlink("..data/ratelimit.yaml", filepath.Join(dir, "ratelimit.yaml")); err != nil {
						t.Fatal(err)
					}
					return
				}
				swap(text)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path, update := tc.layout(t, t.TempDir())
			update(activityRules(3))
			n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_CONFIG": path})
			if got := spendTo(t, n.client, "acme"); got != 3 {
				t.Fatalf("allowed %d under limit 3", got)
			}
			// The limit rises to 5: acme's 3 counted stay, 2 more pass.
			start := time.Now()
			update(activityRules(5))
			took := untilAllowed(t, n.client, "acme", start)
			t.Logf("%s: the first check decided by the new limit came %v after the edit", tc.name, took)
			if got := spendTo(t, n.client, "acme"); got != 1 {
				t.Fatalf("after the reload %d more allowed, want 1 (3 + the probe + 1 = 5)", got)
			}
			// A broken edit: refused, logged with its place, counted.
			update(activityRules(5) + "  - {method: GET, path: /x, buckets: [nope]}\n")
			poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
				if v := metricOf(t, n, `ratelimit_authz_config_reloads_total{result="failure"}`); v != 1 {
					return fmt.Errorf("failures %v", v)
				}
				return nil
			})
			if v := metricOf(t, n, "ratelimit_authz_config_last_reload_successful"); v != 0 {
				t.Errorf("last_reload_successful %v after a refused edit", v)
			}
			logs := n.logs.String()
			if !strings.Contains(logs, "configuration reload refused") || !strings.Contains(logs, `ratelimit.yaml:9:`) {
				t.Errorf("the refusal is not logged with its place:\n%s", logs)
			}
			if checkAllowed(t, n.client, "acme") {
				t.Fatal("acme allowed past 5 after a refused edit")
			}
			if !checkAllowed(t, n.client, "other") {
				t.Fatal("checks stopped after a refused edit")
			}
			update(activityRules(6))
			untilAllowed(t, n.client, "acme", time.Now())
			// The reload is counted just after its rules take effect.
			poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
				if v := metricOf(t, n, `ratelimit_authz_config_reloads_total{result="success"}`); v != 2 {
					return fmt.Errorf("successes %v, want 2", v)
				}
				return nil
			})
		})
	}
}

// SIGHUP reloads even with the watch off; a setting only a restart
// applies is refused by name.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeFile(t, path, activityRules(1))
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_CONFIG": path, "RATELIMIT_AUTHZ_WATCH_CONFIG": "false"})
	if got := spendTo(t, n.client, "acme"); got != 1 {
		t.Fatalf("allowed %d under limit 1", got)
	}
	writeFile(t, path, activityRules(2))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	untilAllowed(t, n.client, "acme", time.Now())
	if !strings.Contains(n.logs.String(), "trigger=SIGHUP") {
		t.Errorf("no SIGHUP reload in the log:\n%s", n.logs)
	}
	writeFile(t, path, activityRules(9)+"counter:\n  max_keys: 5000\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if !strings.Contains(n.logs.String(), "counter.max_keys only changes with a restart") {
			return fmt.Errorf("no refusal naming counter.max_keys")
		}
		return nil
	})
	if checkAllowed(t, n.client, "acme") {
		t.Fatal("a refused reload applied its limit")
	}
}
