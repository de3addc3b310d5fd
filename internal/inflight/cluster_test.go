package inflight_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// Integration tests: three nodes, each on its own server of a real
// three-server NATS cluster, sharing their in-flight gauges and releases
// over the replicator's sealed casts. Real time; synchronisation by
// polling, never by sleeping.

const (
	waitLong = 20 * time.Second
	step     = 5 * time.Millisecond
	conc     = counter.Bucket(11)
	// shareDelay is far above any delivery delay of the test's casts, so
	// that the shares' assumption (every node holds a gauge this long
	// after its cast) holds whatever the machine's load.
	shareDelay = 2 * time.Second
)

var clusterKey = bytes.Repeat([]byte{9}, replicate.KeySize)

type clusterNode struct {
	name string
	t    *inflight.Table
	sync *inflight.Sync
	r    *replicate.Replicator
	reg  *prometheus.Registry
	stop func()
}

// metric is the value of the unlabelled metric name in nd's registry.
func (nd *clusterNode) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := nd.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

const freedFromPeers = "ratelimit_authz_inflight_releases_from_peers_freed_total"

// startCluster starts n nodes; with shares, each node takes its peers
// to hold a gauge shareDelay after casting it, and startCluster waits
// until every node splits the slots with all the others.
func startCluster(t *testing.T, n int, shares bool) []*clusterNode {
	t.Helper()
	srvs := testnats.RunCluster(t, n)
	var nodes []*clusterNode
	for i := range n {
		nd := &clusterNode{name: fmt.Sprintf("n%d", i), reg: prometheus.NewRegistry()}
		store, err := counter.New(counter.Config{Track: true})
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.DiscardHandler)
		nd.r, err = replicate.New(replicate.Config{
			URL: srvs[i].ClientURL(), NodeID: nd.name, Keys: [][]byte{clusterKey},
			Buckets: []replicate.Bucket{{Name: "rate"}}, SyncInterval: 50 * time.Millisecond, ShareDelay: shareDelay,
		}, store, nd.reg, log)
		if err != nil {
			t.Fatal(err)
		}
		if nd.t, err = inflight.New(inflight.Config{}); err != nil {
			t.Fatal(err)
		}
		if nd.sync, err = inflight.NewSync(nd.t, nd.r, inflight.SyncConfig{NoShares: !shares}, nd.reg, log); err != nil {
			t.Fatal(err)
		}
		nd.sync.SetBuckets(map[string]counter.Bucket{"conc": conc})
		nd.r.SetCastHandler(nd.sync.Receive)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = nd.r.Run(ctx) }()
		go func() { defer wg.Done(); _ = nd.sync.Run(ctx) }()
		nd.stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
		t.Cleanup(nd.stop)
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		select {
		case <-nd.r.Ready():
		case <-time.After(waitLong):
			t.Fatalf("%s not ready", nd.name)
		}
	}
	if shares {
		poll.Until(t, waitLong, step, func() error {
			for _, nd := range nodes {
				if sp := nd.t.Shares(); sp.Nodes != n {
					return fmt.Errorf("%s splits the slots %+v, want over %d nodes", nd.name, sp, n)
				}
			}
			return nil
		})
	}
	return nodes
}

// allSee waits until every node counts want requests of key in flight,
// its own and its peers'.
func allSee(t *testing.T, nodes []*clusterNode, key string, want int64) {
	t.Helper()
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if l, r := nd.t.InFlight(conc, key); l+r != want {
				return fmt.Errorf("%s sees %d+%d in flight, want %d", nd.name, l, r, want)
			}
		}
		return nil
	})
}

// TestClusterSharesInFlight: what one node holds counts on the others; a
// release that reaches another node is forwarded to the holder; a
// forged or repeated release frees nothing.
func TestClusterSharesInFlight(t *testing.T) {
	nodes := startCluster(t, 3, false)
	a, b, c := nodes[0], nodes[1], nodes[2]
	const lim = 5
	for i := range 3 {
		if r := a.t.Acquire(conc, "tenant", fmt.Sprint("a-", i), lim, time.Minute, time.Now()); !r.Allowed() {
			t.Fatalf("a: acquisition %d denied: %+v", i, r)
		}
	}
	allSee(t, nodes, "tenant", 3)
	for i := range 2 {
		if r := b.t.Acquire(conc, "tenant", fmt.Sprint("b-", i), lim, time.Minute, time.Now()); !r.Allowed() {
			t.Fatalf("b: acquisition %d denied: %+v", i, r)
		}
	}
	allSee(t, nodes, "tenant", 5)
	if r := c.t.Acquire(conc, "tenant", "c-0", lim, time.Minute, time.Now()); r.Outcome != inflight.DeniedLimit {
		t.Fatalf("c admitted over the cluster's limit: %+v", r)
	}

	// Forged releases at c: another tenant's, a request id nobody holds.
	c.sync.Release(conc, "other-tenant", "a-0")
	c.sync.Release(conc, "tenant", "nobody")
	// The release of a-1 arrives at c: forwarded, a frees it.
	if c.sync.Release(conc, "tenant", "a-1") {
		t.Fatal("c reports holding a's lease")
	}
	allSee(t, nodes, "tenant", 4)
	poll.Until(t, waitLong, step, func() error {
		if got := a.metric(t, freedFromPeers); got != 1 {
			return fmt.Errorf("a freed %v forwarded releases, want 1", got)
		}
		return nil
	})
	// The same release again, at b: a no longer holds it, nothing moves.
	b.sync.Release(conc, "tenant", "a-1")
	if r := c.t.Acquire(conc, "tenant", "c-1", lim, time.Minute, time.Now()); !r.Allowed() {
		t.Fatalf("c denied with a slot free: %+v", r)
	}
	allSee(t, nodes, "tenant", 5)
	for _, nd := range nodes {
		if got := nd.metric(t, freedFromPeers); nd != a && got != 0 {
			t.Errorf("%s freed %v forwarded releases", nd.name, got)
		}
	}

	// Everything released, wherever the releases arrive: back to 0.
	for i, id := range []string{"a-0", "a-2", "b-0", "b-1", "c-1"} {
		nodes[i%3].sync.Release(conc, "tenant", id)
	}
	allSee(t, nodes, "tenant", 0)
}

// TestClusterGaugesVanishWithTheNode: a node that stops being heard from
// stops counting on its peers once its gauges expire.
func TestClusterGaugesVanishWithTheNode(t *testing.T) {
	nodes := startCluster(t, 2, false)
	a, b := nodes[0], nodes[1]
	a.t.Acquire(conc, "k", "r", 3, time.Hour, time.Now())
	allSee(t, nodes, "k", 1)
	// Stop a: b keeps a's gauge until it expires, then drops it.
	stopped := time.Now()
	a.stop()
	poll.Until(t, waitLong, step, func() error {
		if _, r := b.t.InFlight(conc, "k"); r != 0 {
			return fmt.Errorf("b still counts %d of a's", r)
		}
		return nil
	})
	if d := time.Since(stopped); d < inflight.DefaultGaugeExpiry-inflight.DefaultFullInterval {
		t.Errorf("a's gauge vanished %v after its last cast could have been sent, before the expiry", d)
	}
}

// TestClusterBurstBound: a burst that hits every node before any has
// heard of the others holds at most the limit (the nodes' first shares
// add up to it) with shares, and nodes × limit without; once the gauges
// have crossed, the cluster admits nothing until it is below the limit
// again.
func TestClusterBurstBound(t *testing.T) {
	for _, c := range []struct {
		shares bool
		bound  int64
	}{{true, 10}, {false, 30}} {
		t.Run(fmt.Sprint("shares=", c.shares), func(t *testing.T) { testBurst(t, c.shares, c.bound) })
	}
}

func testBurst(t *testing.T, shares bool, bound int64) {
	nodes := startCluster(t, 3, shares)
	const lim = 10
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for i, nd := range nodes {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 10 {
					if nd.t.Acquire(conc, "burst", fmt.Sprint(i, "-", g, "-", j), lim, time.Minute, time.Now()).Allowed() {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	n := admitted.Load()
	if n < lim || n > bound {
		t.Fatalf("a burst over 3 nodes admitted %d, want [%d, %d]", n, lim, bound)
	}
	for _, nd := range nodes {
		if l, _ := nd.t.InFlight(conc, "burst"); l > lim {
			t.Fatalf("%s holds %d, over the limit %d", nd.name, l, lim)
		}
	}
	allSee(t, nodes, "burst", n)
	for _, nd := range nodes {
		if r := nd.t.Acquire(conc, "burst", "late-"+nd.name, lim, time.Minute, time.Now()); r.Allowed() {
			t.Fatalf("%s admitted with %d in flight in the cluster", nd.name, n)
		}
	}
	t.Logf("burst of 120 acquisitions over 3 nodes, limit %d: %d admitted", lim, n)
}
