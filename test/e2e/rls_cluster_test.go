package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// rlsRate is the offered load of the RLS cluster test through each of
// its two Envoys, requests per second: together 4× the 100/s budget.
const rlsRate = 200

// rlsShared is the descriptor file of the cluster test: one tenant's
// budget, the same 100 a second as the ext_authz cluster test's.
const rlsShared = `domain: rls_cluster
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 100
`

// TestRLSClusterThroughEnvoy: three ratelimit-authz nodes on one
// nats-server (sync every 100 ms), and two Envoys with the rate limit
// filter, each sending its calls to a different node (A to node-1, B to
// node-2; node-3 only replicates). Under rlsRate requests a second for one
// tenant through each Envoy, the tenant's 100 a second is one budget for
// the cluster: every window admits what shared allows for two nodes
// taking the load (at least 95 of the 100, at most the limit plus the
// replication overshoot), and each Envoy admits a part of it.
func TestRLSClusterThroughEnvoy(t *testing.T) { bothPorts(t, testRLSClusterThroughEnvoy) }

func testRLSClusterThroughEnvoy(t *testing.T, lean bool) {
	serverBin := serverBinary(t)
	s := prepareRLSStack(t, 3, lean)
	c := &cluster{stack: s, owner: t, natsBin: testnats.Binary(t), natsAddr: s.spare[0]}
	c.startNATS(t)
	runtimeRoot := writeRLSRuntime(t, map[string]string{"cluster.yaml": rlsShared})
	for i := range 3 {
		nd := &node{name: fmt.Sprintf("node-%d", i+1), grpcAddr: s.addrs.Authz[i], httpAddr: s.spare[1+i], starts: 1}
		c.nodes = append(c.nodes, nd)
		args := []string{"serve",
			"--config", serverConfigPath(t),
			"--grpc-addr", nd.grpcAddr,
			"--http-addr", nd.httpAddr,
			"--node-id", nd.name,
			"--nats-url", "nats://" + c.natsAddr,
			"--sync-interval", syncInterval,
			"--drain-delay", "100ms",
			"--log-level", "info",
		}
		if lean {
			nd.checkAddr = s.check[i]
		}
		args = append(args, "--check-addr", cmp.Or(nd.checkAddr, "off"), "--admin-addr", "off")
		nd.proc = s.logs.startEnv(t, t, nd.name, rlsEnv(runtimeRoot), serverBin, args...)
	}
	for _, nd := range c.nodes {
		waitHTTP200(t, nd.proc, "http://"+nd.httpAddr+"/readyz")
	}

	route := func(b []byte) ([]byte, error) {
		return envoyconf.WithRateLimitRoutes(b, envoyconf.RateLimitRoute{Name: "shared", Prefix: activitiesPath, Domain: "rls_cluster",
			RateLimits: []envoyconf.RateLimit{{Actions: []envoyconf.Action{envoyconf.RequestHeader("x-tenant-id", "tenant")}}}})
	}
	more := freeport.TestAddrs(t, 2)
	envoys := []struct {
		name string
		a    envoyconf.Addrs
	}{
		{"envoy-a", s.rlsAddrs(envoyconf.Addrs{Admin: s.addrs.Admin, Listener: s.addrs.Listener, App: s.addrs.App, Authz: s.addrs.Authz[:1]}, 0, 1)},
		{"envoy-b", s.rlsAddrs(envoyconf.Addrs{Admin: more[0], Listener: more[1], App: s.addrs.App, Authz: s.addrs.Authz[1:2]}, 1, 2)},
	}
	var loads []*load
	for _, e := range envoys {
		s.startEnvoyConfig(t, e.name, e.a.Admin, renderRLS(t, e.a, route))
		poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error { return rlsClusterHealthy(s, e.a.Admin, rlsEndpoint(e.a)) })
		// Each load is a stack whose listener is that Envoy's.
		sv := *s
		sv.addrs = e.a
		loads = append(loads, sv.startLoad(acme, rlsRate))
	}
	defer func() { // before the processes stop (t.Cleanup)
		for _, l := range loads {
			l.stop()
		}
	}()

	allowed := func() []int {
		out := make([]int, len(c.nodes))
		for i, nd := range c.nodes {
			for series, v := range rlsDescriptorMetrics(t, nd.httpAddr) {
				if strings.Contains(series, `decision="allowed"`) {
					out[i] += int(v)
				}
			}
		}
		return out
	}
	nextWindow() // the loads' first window is not a full one
	from := nextWindow()
	before := allowed()
	const n = 4
	offered := 2 * rlsRate
	var ws []window
	var off []int
	for attempt := 1; ; attempt++ {
		to := from.Add(n * time.Second)
		time.Sleep(time.Until(to))
		for _, l := range loads {
			poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error { return l.settled(to) })
		}
		ws = s.up.perWindow(activitiesPath, acme, from, to)
		off = make([]int, len(ws))
		for _, l := range loads {
			for i, o := range l.offered(acme, ws) {
				off[i] += o
			}
		}
		if attempt == 3 || slices.Min(off) >= 3*offered/4 {
			break
		}
		t.Logf("windows from %s were offered %v, fewer than %d: the load generator fell behind; measuring again", from.Format("15:04:05"), off, 3*offered/4)
		from = nextWindow()
		before = allowed()
	}
	checkWindows(t, "two Envoys on two of three nodes sharing 100/s", ws, off, shared(activityLimit, 2))
	checkOffered(t, off, 3*offered/4)
	perNode := diff(allowed(), before)
	var admitted int
	for _, w := range ws {
		admitted += w.admitted
	}
	t.Logf("admitted per node over those windows (RLS descriptors allowed): %v (node-3 takes no calls); the app saw %d", perNode, admitted)
	if perNode[0] == 0 || perNode[1] == 0 || perNode[2] != 0 {
		t.Errorf("admitted per node %v: want both loaded nodes admitting a part, node-3 none", perNode)
	}
	for i, l := range loads {
		l.checkNoFailures(t, envoys[i].name, from, from.Add(n*time.Second))
	}
}
