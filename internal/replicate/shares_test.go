package replicate

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
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
	// Half of n0's first share of 100 (50 of three nodes): published.
	for range 25 {
		nodes[0].store.Take(0, "hot", perIP, time.Now())
	}
	allSee(t, nodes, 0, "hot", 25)
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
		t.Fatalf("10 of a first share of 75 replicated before the node left: %d", got)
	}
	nodes[0].stop(t)
	allSee(t, nodes[1:], 0, "k", 10)
	if got := nodes[1].total(0, "once"); got != 0 {
		t.Errorf("a key hit once was published on leaving: %d", got)
	}
}

// TestShareDelayFollowsDelivery: the delay before a node's share grows is
// the early gap plus the round trip to the slowest peer: its probes',
// however long, or twice its latest delivery delay (2.5 ms to a sync
// interval) for a peer that echoes none.
func TestShareDelayFollowsDelivery(t *testing.T) {
	store, err := counter.New(counter.Config{Track: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{URL: "nats://127.0.0.1:1", NodeID: "a", Buckets: buckets("x")}, store, prometheus.NewRegistry(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	p := r.peers.get("b", 1, now, true)
	for _, c := range []struct {
		skewMS int64
		want   time.Duration
	}{
		// An early gap of 10 ms plus twice the delivery: at least 2.5 ms,
		// at most a sync interval.
		{0, 15 * time.Millisecond}, {3, 16 * time.Millisecond}, {40, 90 * time.Millisecond},
		{-60, 130 * time.Millisecond}, {5000, 210 * time.Millisecond},
	} {
		p.ageMS.Store(c.skewMS)
		if got := r.shareDelay(); got != c.want {
			t.Errorf("delivery %d ms: share delay %v, want %v", c.skewMS, got, c.want)
		}
	}
	// A peer that echoes probes: the longest round trip of its probes
	// lately, however long, or the time its oldest unanswered probe has
	// waited when longer; its clock skew is its batches' least age less
	// half the least round trip.
	p.minAgeMS.Store(300) // a clock 200 ms ahead, 100 ms away
	p.rttMinMS.Store(200)
	p.echoed.Store(int64(time.Second))
	for _, c := range []struct {
		rttMaxMS int64
		waiting  time.Duration // the oldest probe not echoed yet sent this long ago
		want     time.Duration
	}{
		{200, 0, 210 * time.Millisecond}, {1000, 0, 1010 * time.Millisecond}, {200, 800 * time.Millisecond, 810 * time.Millisecond},
	} {
		p.rttMaxMS.Store(c.rttMaxMS)
		r.probe = prober{epoch: time.Now().Add(-time.Hour)}
		r.probe.note(time.Second) // the echoed one
		if c.waiting > 0 {
			r.probe.note(time.Since(r.probe.epoch) - c.waiting)
		}
		got := r.shareDelay()
		if d := got - c.want; d < 0 || d > 20*time.Millisecond { // the clock moves on meanwhile
			t.Errorf("round trip %d ms lately, a probe waiting %v: share delay %v, want %v", c.rttMaxMS, c.waiting, got, c.want)
		}
	}
	// Silent for more than a heartbeat: more likely stopped than slow, its
	// unanswered probe no longer counts (its share goes to the others
	// once it is out of the live nodes).
	r.peers.mu.Lock()
	p.last = time.Now().Add(-2 * time.Second)
	r.peers.mu.Unlock()
	if got := r.shareDelay(); got < 210*time.Millisecond || got > 230*time.Millisecond {
		t.Errorf("a peer silent for 2 s with a probe waiting 800 ms: share delay %v, want 210ms", got)
	}
	r.peers.mu.Lock()
	p.last = now
	r.peers.mu.Unlock()
	if got := r.peers.maxSkew(); got != 200*time.Millisecond {
		t.Errorf("skew %v, want 200ms: the least age less half the least round trip", got)
	}
	p.rttMaxMS.Store(200)
	r.probe = prober{epoch: time.Now()}
	r.setShares(r.live(now), true)
	if got := r.lastShares; got != (share.Split{Nodes: 2, Rank: 0, Delay: 210 * time.Millisecond}) {
		t.Errorf("shares %+v, want 2 nodes, a first, 210 ms", got)
	}
	r.setShares(r.live(now), false)
	if got := r.lastShares; got.Nodes != 1 {
		t.Errorf("shares while disconnected %+v, want none", got)
	}
}

// overload offers every node rate hits per second of key until stop is
// closed (paced by elapsed time, so a late wakeup catches up), and counts
// what the cluster admitted per window of lim.
func overload(nodes []*live, key string, lim counter.Limit, rate float64, stop <-chan struct{}) (wait func() map[int64]int64) {
	var mu sync.Mutex
	admitted := map[int64]int64{}
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Go(func() {
			start := time.Now()
			sent := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				now := time.Now()
				for due := int(rate * now.Sub(start).Seconds()); sent < due; sent++ {
					if nd.store.Take(0, key, lim, now).Allowed {
						mu.Lock()
						admitted[now.UnixMilli()/lim.ScaleMS]++
						mu.Unlock()
					}
				}
				time.Sleep(500 * time.Microsecond)
			}
		})
	}
	return func() map[int64]int64 {
		wg.Wait()
		return admitted
	}
}

// TestClusterNodesSharingANameHoldTheLimit: three processes started with
// one node id — the same --node-id, or none on one host (the host name) —
// split the budgets three ways and hold the limit at 50× offered as well
// as three with distinct ids.
func TestClusterNodesSharingANameHoldTheLimit(t *testing.T) {
	srv := testnats.StartProcess(t)
	lim := counter.Limit{Limit: 100, ScaleMS: 1000}
	for _, c := range []struct {
		name string
		ids  []string
	}{
		{"distinct ids", []string{"n0", "n1", "n2"}},
		{"one id", []string{"same", "same", "same"}},
		{"host name", []string{"", "", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var nodes []*live
			for _, id := range c.ids {
				cfg := Config{Heartbeat: 100 * time.Millisecond}
				nodes = append(nodes, startLive(t, srv.URL(), id, cfg, nodeOpts{}))
			}
			for _, nd := range nodes {
				nd.waitReady(t)
			}
			poll.Until(t, waitLong, step, func() error {
				for i, nd := range nodes {
					if got := nd.r.peers.len(); got != 2 {
						return fmt.Errorf("node %d knows %d peers, want 2", i, got)
					}
				}
				return nil
			})
			// 50× the limit over the three nodes, for four whole windows.
			const windows = 4
			from := time.Now().UnixMilli()/lim.ScaleMS + 1
			stop := make(chan struct{})
			wait := overload(nodes, "k", lim, 50*100/3.0, stop)
			time.Sleep(time.Until(time.UnixMilli((from + windows) * lim.ScaleMS)))
			close(stop)
			admitted := wait()
			var per []int64
			for w := from; w < from+windows; w++ {
				per = append(per, admitted[w])
			}
			t.Logf("admitted per window of a limit of %d at 50×: %v", lim.Limit, per)
			for i, n := range per {
				if n > lim.Limit*110/100 {
					t.Errorf("window %d admitted %d, above 1.10× the limit of %d", i, n, lim.Limit)
				}
			}
			shared := c.ids[0] == c.ids[1]
			for i, nd := range nodes {
				if got := nd.r.shareNodes.Load(); got != 3 {
					t.Errorf("node %d splits budgets %d ways, want 3", i, got)
				}
				// Each node sees its name claimed by the three.
				if got := metric(t, nd.r.m.duplicateNodeIDs); (got >= 1) != shared {
					t.Errorf("node %d: duplicate_node_ids_total %v with ids %q", i, got, c.ids)
				}
			}
		})
	}
}

// heartbeat is an empty batch from (node, inc) sent at at.
func heartbeat(node string, inc uint64, at time.Time) []byte {
	return enc(message{header: header{Kind: kindBatch, Node: node, Incarnation: inc, SentAtMS: at.UnixMilli()}})
}

// TestDuplicateNodeIDs: processes that claim one node id are each a node
// of their own in the shares; while two of them are heard from in turns,
// the id is logged once, naming both, and counted once. A restart (the
// old process last heard before the new one first) is no duplicate; the
// old process keeps its share until it is no longer live.
func TestDuplicateNodeIDs(t *testing.T) {
	x := newNode(t, "x", Config{Heartbeat: 100 * time.Millisecond})
	dups := func() float64 { return metric(t, x.r.m.duplicateNodeIDs) }
	// hear moves x's clock on by a heartbeat, has x hear from the
	// processes (node, incs) and tick.
	hear := func(node string, incs ...uint64) {
		x.now = x.now.Add(100 * time.Millisecond)
		for _, inc := range incs {
			x.receive(heartbeat(node, inc, x.now))
		}
		x.r.members(x.now, true)
	}

	// p restarts: p/1 last heard before p/2 first.
	hear("p", 1)
	hear("p", 2)
	if got := x.r.lastShares.Nodes; got != 3 {
		t.Errorf("just after a restart: %d nodes, want 3 (x, and p's old process still live)", got)
	}
	for range 3 {
		hear("p", 2)
	}
	if got := x.r.lastShares.Nodes; got != 2 {
		t.Errorf("3 heartbeats after a restart: %d nodes, want 2 (x and the new p)", got)
	}
	if dups() != 0 || strings.Contains(x.logs.String(), "claim one node id") {
		t.Errorf("a restart taken for a duplicate:\n%s", x.logs.String())
	}
	// A second process named p (p/3) speaks in turns with p/2.
	for range 10 {
		hear("p", 3, 2)
	}
	if got := x.r.lastShares.Nodes; got != 3 {
		t.Errorf("two processes named p: %d nodes, want 3", got)
	}
	if got := dups(); got != 1 {
		t.Errorf("duplicate_node_ids_total %v after one episode, want 1", got)
	}
	logs := x.logs.String()
	if n := strings.Count(logs, "claim one node id"); n != 1 || !strings.Contains(logs, "processes=p/0000000000000002,p/0000000000000003") {
		t.Errorf("want one warning naming both processes, got %d:\n%s", n, logs)
	}
	// p/3 goes: the episode ends once it is no longer live; a process
	// named like x itself begins another.
	for range 5 {
		hear("p", 2)
	}
	if got := x.r.lastShares.Nodes; got != 2 {
		t.Errorf("after p/3 left: %d nodes, want 2", got)
	}
	hear("x", 9)
	if got, want := x.r.lastShares.Nodes, 3; got != want {
		t.Errorf("another process named x: %d nodes, want %d", got, want)
	}
	if got := dups(); got != 2 {
		t.Errorf("duplicate_node_ids_total %v after a second episode, want 2", got)
	}
	if !strings.Contains(x.logs.String(), "processes="+x.r.self.String()+",x/0000000000000009") &&
		!strings.Contains(x.logs.String(), "processes=x/0000000000000009,"+x.r.self.String()) {
		t.Errorf("the warning does not name this process and the other x:\n%s", x.logs.String())
	}
}

// TestSyncOriginIsNotLive: a process named only as the origin of counts in
// a sync reply (this node's own previous incarnation, after a restart) is
// not heard from: it takes no share and claims no node id, while the
// process that sent the reply is live.
func TestSyncOriginIsNotLive(t *testing.T) {
	x := newNode(t, "x", Config{Heartbeat: 100 * time.Millisecond})
	reply := message{
		header:  header{Kind: kindSyncReply, Node: "y", Incarnation: 5, SentAtMS: x.now.UnixMilli(), Last: true},
		Limits:  []wireLimit{{Name: "activity_create", ScaleMS: sec100.ScaleMS}},
		Origins: []origin{{"x", 1}, {"y", 5}},
		Entries: []entry{
			{Origin: 0, Window: counter.WindowOf(x.now.UnixMilli(), sec100.ScaleMS), Key: "acme", Count: 7},
			{Origin: 1, Window: counter.WindowOf(x.now.UnixMilli(), sec100.ScaleMS), Key: "acme", Count: 3},
		},
	}
	if got := x.r.syncer.mergeReply(&reply, x.now); got != 2 {
		t.Fatalf("merged %d counts, want 2", got)
	}
	x.r.members(x.now, true)
	if got := x.r.lastShares.Nodes; got != 2 {
		t.Errorf("%d nodes, want 2 (x and y; x's previous incarnation is gone)", got)
	}
	if got := metric(t, x.r.m.duplicateNodeIDs); got != 0 {
		t.Errorf("duplicate_node_ids_total %v: an origin taken for a live process", got)
	}
}
