package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// TestTopClusterThroughEnvoy: three nodes behind one Envoy, each with an
// admin listener; one tenant floods activities among ten thousand calm
// ones, its checks spread over the nodes. One node's ?cluster=1 names it
// first in the denied top with every 429 Envoy answered it, whichever
// node denied them, and no node missing.
func TestTopClusterThroughEnvoy(t *testing.T) {
	c := newCluster(t, 3)
	admins := freeport.TestAddrs(t, len(c.nodes))
	for i, nd := range c.nodes { // restarted with an admin listener each
		nd.proc.stop(t)
		nd.adminAddr = admins[i]
		c.startNode(t, nd)
	}
	for _, nd := range c.nodes {
		waitHTTP200(t, nd.proc, "http://"+nd.httpAddr+"/readyz")
	}
	poll.Until(t, 20*time.Second, 50*time.Millisecond, func() error {
		for _, nd := range c.nodes {
			if h := c.checkHealth(t)[nd.checkAddr]; h != "healthy" {
				return fmt.Errorf("envoy: %s health %q", nd.name, h)
			}
		}
		return nil
	})

	httpAddrs := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		httpAddrs[i] = nd.httpAddr
	}
	denied := flood(t, c.stack, httpAddrs...)
	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		r, err := readTop(c.client, c.nodes[0].adminAddr, "&cluster=1")
		if err != nil {
			return err
		}
		if len(r.Nodes) != 3 || len(r.Missing) != 0 {
			return fmt.Errorf("nodes %v, missing %v", r.Nodes, r.Missing)
		}
		if firstDenied(r) != "noisy" {
			return fmt.Errorf("denied top %+v", r.Buckets)
		}
		k := r.Buckets[0].Minute.TopDenied[0]
		if got := uint64(denied); got == 0 || got < k.Hits-k.Error || got > k.Hits {
			return fmt.Errorf("noisy listed with %d denied hits (error %d); Envoy answered it %d 429s", k.Hits, k.Error, got)
		}
		return nil
	})
	// Each node alone saw only its share of them.
	for _, nd := range c.nodes {
		r, err := readTop(c.client, nd.adminAddr)
		if err != nil {
			t.Fatal(err)
		}
		if d := r.Buckets[0].Minute.Denied; d >= uint64(denied) {
			t.Errorf("%s alone counts %d of the %d denials: the checks were not spread", nd.name, d, denied)
		}
	}
}
