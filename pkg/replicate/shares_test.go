package replicate

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

// startShared starts n nodes on srv and waits until each splits the
// budgets n ways.
func startShared(t *testing.T, url string, n int) []*live {
	t.Helper()
	var nodes []*live
	for i := range n {
		nodes = append(nodes, startLive(t, url, fmt.Sprintf("n%d", i), Config{Heartbeat: 100 * time.Millisecond}, nodeOpts{}))
	}
	for _, nd := range nodes {
		nd.waitReady(t)
	}
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if got := nd.r.shareNodes.Load(); got != int64(n) {
				return fmt.Errorf("%s splits budgets %d ways, want %d", nd.id, got, n)
			}
		}
		return nil
	})
	return nodes
}

// TestClusterFloodIsNotReplicated: through a real nats-server, keys each
// hit once (a flood of client addresses) are never published, while a key
// hit up to half its share is, and the peers count it.
func TestClusterFloodIsNotReplicated(t *testing.T) {
	srv := testnats.StartProcess(t)
	nodes := startShared(t, srv.URL(), 3)
	perIP := long // 100 per window, as a per-address bucket
	sent := func() (n float64) {
		for _, nd := range nodes {
			n += metric(t, nd.r.m.entriesSent)
		}
		return n
	}
	before := sent()
	for i, nd := range nodes {
		for j := range 2000 {
			if !nd.store.Take(0, fmt.Sprintf("198.51.%d.%d", i*10+j/256, j%256), perIP, time.Now()).Allowed {
				t.Fatal("a first hit denied")
			}
		}
	}
	// Half of n0's share of 100 (33 or 34 of three nodes): published.
	for range 17 {
		nodes[0].store.Take(0, "hot", perIP, time.Now())
	}
	allSee(t, nodes, 0, "hot", 17)
	if got := sent() - before; got != 1 {
		t.Errorf("%v entries published for 6000 keys hit once and one key near its share, want 1", got)
	}
	for _, nd := range nodes[1:] {
		if got := nd.store.Len(); got != 2001 {
			t.Errorf("%s holds %d keys, want its own 2000 and the hot one", nd.id, got)
		}
	}
}

// TestClusterShareGrowsToTheWholeLimit: one node that carries all of a
// key's traffic admits the whole limit within a fraction of a second,
// never more, and the others then deny.
func TestClusterShareGrowsToTheWholeLimit(t *testing.T) {
	srv := testnats.StartProcess(t)
	nodes := startShared(t, srv.URL(), 3)
	lim := counter.Limit{Limit: 300, ScaleMS: counter.MaxScaleMS}
	admitted, denied := 0, 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && admitted < 300; {
		if r := nodes[0].store.Take(0, "k", lim, time.Now()); r.Allowed {
			admitted++
		} else {
			denied++
			if r.RetryAfterMS > 100 {
				t.Fatalf("denied at %d of 300 with RetryAfterMS %d: a denial by share is brief", admitted, r.RetryAfterMS)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if admitted != 300 {
		t.Fatalf("one node admitted %d of 300 in 2 s", admitted)
	}
	if denied == 0 || nodes[0].store.ShareDenials() == 0 {
		t.Error("no denial by share: the node admitted beyond its share at once")
	}
	if nodes[0].store.Take(0, "k", lim, time.Now()).Allowed {
		t.Error("admitted over the limit")
	}
	allSee(t, nodes, 0, "k", 300)
	for _, nd := range nodes[1:] {
		if nd.store.Take(0, "k", lim, time.Now()).Allowed {
			t.Errorf("%s admitted over the cluster's limit", nd.id)
		}
	}
}

// TestClusterLeavingNodePublishesUnreported: counts a node kept unreported
// (far below its share) reach its peers in its final batch.
func TestClusterLeavingNodePublishesUnreported(t *testing.T) {
	srv := testnats.StartProcess(t)
	nodes := startShared(t, srv.URL(), 2)
	for range 10 {
		nodes[0].store.Take(0, "k", long, time.Now())
	}
	nodes[0].store.Take(0, "once", long, time.Now())
	time.Sleep(200 * time.Millisecond)
	if got := nodes[1].total(0, "k"); got != 0 {
		t.Fatalf("10 of a share of 50 replicated before the node left: %d", got)
	}
	nodes[0].stop(t)
	allSee(t, nodes[1:], 0, "k", 10)
	if got := nodes[1].total(0, "once"); got != 0 {
		t.Errorf("a key hit once was published on leaving: %d", got)
	}
}

// TestShareDelayFollowsDelivery: the delay before a node's share grows is
// the early gap plus twice the peers' latest delivery delay (2.5 ms to a
// sync interval).
func TestShareDelayFollowsDelivery(t *testing.T) {
	store, err := counter.New(counter.Config{Track: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{URL: "nats://127.0.0.1:1", NodeID: "a", Buckets: []string{"x"}}, store, prometheus.NewRegistry(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	p := r.peers.get("b", 1, now)
	for _, c := range []struct {
		skewMS int64
		want   time.Duration
	}{
		// An early gap of 10 ms plus twice the delivery: at least 2.5 ms,
		// at most a sync interval.
		{0, 15 * time.Millisecond}, {3, 16 * time.Millisecond}, {40, 90 * time.Millisecond},
		{-60, 130 * time.Millisecond}, {5000, 210 * time.Millisecond},
	} {
		p.skewMS.Store(c.skewMS)
		if got := r.shareDelay(); got != c.want {
			t.Errorf("delivery %d ms: share delay %v, want %v", c.skewMS, got, c.want)
		}
	}
	r.setShares(true, now)
	if got := r.lastShares; got != (counter.Shares{Nodes: 2, Rank: 0, Delay: 210 * time.Millisecond}) {
		t.Errorf("shares %+v, want 2 nodes, a first, 210 ms", got)
	}
	r.setShares(false, now)
	if got := r.lastShares; got.Nodes != 1 {
		t.Errorf("shares while disconnected %+v, want none", got)
	}
}
