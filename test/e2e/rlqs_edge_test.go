package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// The edges of the product's RLQS server through the real Envoy: a budget's
// first window when its participants join on several nodes at once, and an
// Envoy left with its last assignment when the server is killed.

// quotaCluster starts three nodes over NATS (and Postgres, as a cluster
// node runs) on the shipped configuration, and waits until each is ready.
func quotaCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{owner: t, serverBin: serverBinary(t), config: serverConfigPath(t), natsBin: testnats.Binary(t)}
	c.stack = prepareStack(t, 3)
	c.pg = testpg.Start(t)
	c.db = c.pg.URL()
	c.cli(t, "migrate")
	c.natsAddr = c.spare[0]
	c.startNATS(t)
	for i := range 3 {
		nd := &node{name: fmt.Sprintf("node-%d", i+1), grpcAddr: c.addrs.Authz[i], httpAddr: c.spare[1+i]}
		c.nodes = append(c.nodes, nd)
		c.startNode(t, nd)
	}
	for _, nd := range c.nodes {
		waitHTTP200(t, nd.proc, "http://"+nd.httpAddr+"/readyz")
	}
	return c
}

// TestQuotaFirstWindowAcrossNodes: two Envoys, each with its stream to a
// different node of three; a tenant no node has seen is offered 3× its
// 100/s budget from the start of a window, half through each Envoy. Both
// participants join before either node can know of the other's, so each
// node counts every live node as a possible participant: the first window
// holds the steady bound too, not a whole budget per node.
func TestQuotaFirstWindowAcrossNodes(t *testing.T) {
	c := quotaCluster(t)
	second := freeport.TestAddrs(t, 2)
	c.quotaEnvoyAt(t, "envoy-1", c.addrs.Admin, c.addrs.Listener, c.addrs.Authz[:1])
	c.quotaEnvoyAt(t, "envoy-2", second[0], second[1], c.addrs.Authz[1:2])

	limit := activityLimit
	tenant := "quota-first-window"
	// The second window begins a participants window (5 s, the server's
	// count of participants per key): the count of the first, read when
	// each node had only its own, must not pass for the cluster's.
	start := nextWindow()
	for (start.Unix()+1)%5 != 0 {
		start = nextWindow()
	}
	l1 := c.startLoad(tenant, 3*limit/2)
	defer l1.stop()
	l2 := c.via(second[1]).startLoad(tenant, 3*limit/2)
	defer l2.stop()
	ws, off := quotaWindows(t, c.up, []*load{l1, l2}, tenant, start, 5)
	t.Logf("two Envoys on two of three nodes, %d/s each, from the tenant's first request: %s", 3*limit/2, windowsLine(ws, off))
	checkQuotaWindows(t, "a new tenant at 3× across two nodes, from its first window", ws, off, limit)
	l1.checkNoFailures(t, "envoy-1", start, start.Add(5*time.Second))
	l2.checkNoFailures(t, "envoy-2", start, start.Add(5*time.Second))
	for i, nd := range c.nodes[:2] {
		if n := nd.metric(t, "ratelimit_authz_rlqs_streams"); n != 1 {
			t.Errorf("%s holds %v RLQS streams, want 1 (envoy-%d's)", nd.name, n, i+1)
		}
	}
}

// TestQuotaServerKilled: a tenant under its limit (half of it) through one
// Envoy; the server is killed (SIGKILL). Envoy keeps the last assignment
// until its TTL (quota.assignment_ttl, 5 s), then the bootstrap's expired
// behaviour (ALLOW_ALL): in every window the tenant goes on being admitted
// what it offers, as while the server was up, instead of spending what
// was left of one window's share and then being denied until the TTL.
func TestQuotaServerKilled(t *testing.T) {
	s := prepareStack(t, 1)
	s.startServer(serverBinary(t), serverConfigPath(t))
	s.envoy = s.quotaEnvoyAt(t, "envoy", s.addrs.Admin, s.addrs.Listener, s.addrs.Authz)
	limit := activityLimit
	tenant := "quota-killed"
	l := s.startLoad(tenant, limit/2)
	defer l.stop()
	// Long enough for a usage report of Envoy's (every 5 s) to show the
	// server that the tenant is under its share.
	from := nextWindow()
	for range 7 {
		nextWindow()
	}
	killed := nextWindow()
	s.server.kill(t)
	ws, off := quotaWindows(t, s.up, []*load{l}, tenant, killed, 6)
	before, offBefore := quotaWindows(t, s.up, []*load{l}, tenant, from, 8)
	t.Logf("server up: %s", windowsLine(before, offBefore))
	t.Logf("server killed at %s: %s", killed.Format("15:04:05.000"), windowsLine(ws, off))
	l.checkNoFailures(t, "server killed", killed, killed.Add(6*time.Second))
	for i, w := range ws {
		if lo := off[i] * 9 / 10; w.admitted < lo {
			t.Errorf("window %d after the kill (%s) admitted %d of %d offered, want at least %d: an Envoy that lost its server must go on admitting a tenant under its limit",
				i, w.start.Format("15:04:05"), w.admitted, off[i], lo)
		}
	}
}
