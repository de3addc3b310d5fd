package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// The product's RLQS server through the real Envoy's quota filter, on the
// shipped bootstrap (envoy/ratelimit-quota.yaml) and the shipped
// configuration (config/ratelimit.yaml, its quota section): POST
// /api/activities lands in bucket id {name: activity_create, tenant: <x-tenant-id>},
// which the server counts in activity_create (100/s per tenant).

// quotaEnvoyAt renders the shipped quota bootstrap with the given admin and
// listener, the stack's app and the nodes as RLQS endpoints, and starts it.
func (s *stack) quotaEnvoyAt(owner *testing.T, name, admin, listener string, nodes []string) *process {
	s.t.Helper()
	src, err := os.ReadFile(filepath.Join(root(s.t), envoyconf.QuotaPath))
	if err != nil {
		s.t.Fatal(err)
	}
	cfg, err := envoyconf.Render(src, envoyconf.Addrs{Admin: admin, Listener: listener, App: s.addrs.App, Authz: nodes})
	if err != nil {
		s.t.Fatal(err)
	}
	return s.startEnvoyConfig(owner, name, admin, cfg)
}

// via is a copy of the stack whose requests (and loads) go to listener.
func (s *stack) via(listener string) *stack {
	c := *s
	c.addrs.Listener = listener
	return &c
}

// quotaWindows measures n windows of what the app admitted of tenant from
// the loads together, after from.
func quotaWindows(t *testing.T, up *upstream, ls []*load, tenant string, from time.Time, n int) ([]window, []int) {
	t.Helper()
	to := from.Add(time.Duration(n) * time.Second)
	time.Sleep(time.Until(to))
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, l := range ls {
			if err := l.settled(to); err != nil {
				return err
			}
		}
		return nil
	})
	ws := up.perWindow(activitiesPath, tenant, from, to)
	offered := make([]int, len(ws))
	for _, l := range ls {
		for i, o := range l.offered(tenant, ws) {
			offered[i] += o
		}
	}
	return ws, offered
}

// quotaBound is the bound of one window's admissions through Envoy's quota
// filter, once the tenant's bucket ids have their assignments (docs/rlqs.md,
// Accuracy): each window's shares add
// up to at most the limit and each Envoy spends at most its share, so a
// window admits at most the limit, plus 10% for requests admitted at the
// very end of a window that reach the app in the next one. It undershoots
// while more than the limit is offered: each window's shares arrive a few
// milliseconds into it, and a window in which a report (every 5 s) counts
// usage that happened in earlier windows hands out less; so at least 60%
// in any window, and at least 85% over the windows measured.
func quotaBound(limit int) func(offered int) (lo, hi int) {
	return func(offered int) (lo, hi int) { return min(offered, limit*3/5), limit + limit/10 }
}

// checkQuotaWindows fails t unless every window admitted what quotaBound
// allows for what was offered in it, and the windows together at least
// 85% of the limit each (or of what was offered, when less).
func checkQuotaWindows(t *testing.T, what string, ws []window, offered []int, limit int) {
	t.Helper()
	t.Logf("%s: admitted/offered per window (second=admitted/offered): %s; admitted %s", what, windowsLine(ws, offered), distribution(ws))
	admitted, floor := 0, 0
	for i, w := range ws {
		if lo, hi := quotaBound(limit)(offered[i]); w.admitted < lo || w.admitted > hi {
			t.Errorf("%s: window %s admitted %d (offered %d), want %d…%d", what, w.start.Format("15:04:05"), w.admitted, offered[i], lo, hi)
		}
		admitted += w.admitted
		floor += min(offered[i], limit) * 85 / 100
	}
	if admitted < floor {
		t.Errorf("%s: %d admitted over %d windows, want at least %d (85%% of the limit a window)", what, admitted, len(ws), floor)
	}
}

func TestQuotaThroughEnvoy(t *testing.T) {
	s := prepareStack(t, 1)
	s.startServer(serverBinary(t), serverConfigPath(t))
	s.envoy = s.quotaEnvoyAt(t, "envoy", s.addrs.Admin, s.addrs.Listener, s.addrs.Authz)
	limit := activityLimit

	for _, c := range []struct {
		name   string
		tenant string
		rate   int
	}{{"2x", "quota-2x", 2 * limit}, {"10x", "quota-10x", 10 * limit}} {
		t.Run(c.name, func(t *testing.T) {
			l := s.startLoad(c.tenant, c.rate)
			defer l.stop()
			start := nextWindow()
			// The first windows: the first request reported at once, the
			// assignment one round trip later.
			ws, off := quotaWindows(t, s.up, []*load{l}, c.tenant, start, 6)
			t.Logf("%s: the first 6 windows of the tenant's load: %s", c.name, windowsLine(ws, off))
			checkQuotaWindows(t, c.name+" at "+fmt.Sprint(c.rate)+"/s, from the second window", ws[1:], off[1:], limit)
			l.checkNoFailures(t, c.name, start, start.Add(6*time.Second))
		})
	}

	t.Run("server goes away", func(t *testing.T) {
		tenant := "quota-gone"
		l := s.startLoad(tenant, 2*limit)
		defer l.stop()
		nextWindow()
		nextWindow()
		stopped := nextWindow()
		s.server.stop(t)
		ws, off := quotaWindows(t, s.up, []*load{l}, tenant, stopped, 9)
		t.Logf("server stopped at %s: per window %s", stopped.Format("15:04:05"), windowsLine(ws, off))
		l.checkNoFailures(t, "server gone", stopped, stopped.Add(9*time.Second))
		// While the last assignment lives (quota.assignment_ttl), the
		// tenant stays limited; once it expired, the bootstrap's expired
		// behaviour (ALLOW_ALL) lets everything through.
		if _, hi := quotaBound(limit)(off[0]); ws[0].admitted > hi {
			t.Errorf("the window the server stopped in admitted %d, want the assignment still held (≤ %d)", ws[0].admitted, hi)
		}
		last := ws[len(ws)-1]
		if lo := off[len(off)-1] * 9 / 10; last.admitted < lo {
			t.Errorf("9 s after the server went away a window admitted %d of %d offered; the expired assignment should fail open", last.admitted, off[len(off)-1])
		}
	})
}

// TestQuotaClusterTwoEnvoys: three nodes over NATS, two Envoys each with a
// stream to one of them; one tenant offered 2× its 100/s budget, half
// through each Envoy: the budget holds across both.
func TestQuotaClusterTwoEnvoys(t *testing.T) {
	c := quotaCluster(t)
	second := freeport.TestAddrs(t, 2)
	c.quotaEnvoyAt(t, "envoy-1", c.addrs.Admin, c.addrs.Listener, c.addrs.Authz)
	c.quotaEnvoyAt(t, "envoy-2", second[0], second[1], c.addrs.Authz)

	limit := activityLimit
	tenant := "quota-shared"
	l1 := c.startLoad(tenant, limit)
	defer l1.stop()
	l2 := c.via(second[1]).startLoad(tenant, limit)
	defer l2.stop()
	start := nextWindow()
	ws, off := quotaWindows(t, c.up, []*load{l1, l2}, tenant, start, 8)
	t.Logf("two Envoys, 3 nodes, %d/s each: %s", limit, windowsLine(ws, off))
	checkQuotaWindows(t, "one 100/s budget across two Envoys and three nodes, from the third window", ws[2:], off[2:], limit)
	l1.checkNoFailures(t, "envoy-1", start, start.Add(8*time.Second))
	l2.checkNoFailures(t, "envoy-2", start, start.Add(8*time.Second))
	// Each Envoy holds one stream, to whichever node it picked; the nodes
	// share the counts over NATS.
	streams, perNode := 0.0, ""
	for _, nd := range c.nodes {
		n := nd.metric(t, "ratelimit_authz_rlqs_streams")
		streams += n
		perNode += fmt.Sprintf(" %s=%v", nd.name, n)
	}
	t.Logf("RLQS streams per node:%s", perNode)
	if streams != 2 {
		t.Errorf("%v RLQS streams over the nodes, want 2 (one per Envoy)", streams)
	}
}
