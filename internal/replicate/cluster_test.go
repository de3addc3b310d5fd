package replicate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// Integration tests: real NATS servers, real time. Windows are the longest
// the counter allows (about 24.8 days), so that no test runs across a
// window edge; synchronisation is by polling (checkFor), never by sleeping.

var long = counter.Limit{Limit: 100, ScaleMS: counter.MaxScaleMS}

const (
	waitLong = 20 * time.Second
	step     = 5 * time.Millisecond
)

// live is a Replicator running against a real NATS server.
type live struct {
	id     string
	r      *Replicator
	store  *counter.Store
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// logWriter is where testLogger writes.
func logWriter(t testing.TB) io.Writer {
	if testing.Verbose() {
		return os.Stderr
	}
	return io.Discard
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

// startLive starts a node, adjusted by o. The node is stopped when the
// test ends.
func startLive(t testing.TB, url, id string, cfg Config, o nodeOpts) *live {
	t.Helper()
	store, st := o.stores(t)
	cfg.URL, cfg.NodeID = url, id
	if cfg.Buckets == nil {
		cfg.Buckets = buckets("activity_create", "inbound")
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = 50 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	log := testLogger(t).With("test", t.Name())
	if o.logs != nil {
		log = slog.New(slog.NewTextHandler(io.MultiWriter(o.logs, logWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	r, err := newReplicator(cfg, st, reg, log, o.hooks)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &live{id: id, r: r, store: store, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- r.Run(ctx) }()
	t.Cleanup(func() { n.stop(t) })
	return n
}

// stop cancels the node and waits for Run to return (idempotent).
func (n *live) stop(t testing.TB) {
	t.Helper()
	n.cancel()
	select {
	case err, ok := <-n.done:
		if ok && err != nil {
			t.Errorf("%s: Run: %v", n.id, err)
		}
		if ok {
			close(n.done)
		}
	case <-time.After(waitLong):
		t.Errorf("%s: Run did not return %v after cancel", n.id, waitLong)
	}
}

func (n *live) waitReady(t testing.TB) {
	t.Helper()
	select {
	case <-n.r.Ready():
	case <-time.After(waitLong):
		t.Fatalf("%s: not ready after %v", n.id, waitLong)
	}
}

func (n *live) total(bucket counter.Bucket, key string) int64 {
	_, tot := counts(n.store, bucket, key, long, time.Now())
	return tot
}

func (n *live) local(bucket counter.Bucket, key string) int64 {
	l, _ := counts(n.store, bucket, key, long, time.Now())
	return l
}

func (n *live) connected() bool {
	nc := n.r.conn.Load()
	return nc != nil && nc.IsConnected()
}

// allSee waits until every node's total of (bucket, key) is want.
func allSee(t testing.TB, nodes []*live, bucket counter.Bucket, key string, want int64) {
	t.Helper()
	poll.Until(t, waitLong, step, func() error {
		for _, n := range nodes {
			if got := n.total(bucket, key); got != want {
				return fmt.Errorf("%s sees %d of %s, want %d", n.id, got, key, want)
			}
		}
		return nil
	})
}

// noLeaks waits until no goroutine of a Replicator (a method of one of its
// parts) or a NATS client is left.
func noLeaks(t testing.TB) {
	t.Helper()
	poll.Until(t, waitLong, 10*time.Millisecond, func() error {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "internal/replicate.(*") || strings.Contains(g, "nats-io/nats.go.(*Conn)") {
				return fmt.Errorf("goroutine left:\n%s", g)
			}
		}
		return nil
	})
}

func TestClusterSharesOneBudget(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			srv := testnats.Run(t)
			var nodes []*live
			for i := range n {
				nodes = append(nodes, startLive(t, srv.ClientURL(), fmt.Sprintf("n%d", i), Config{}, nodeOpts{}))
			}
			for _, nd := range nodes {
				nd.waitReady(t)
			}
			// Each hit within a short time: a node's share shrinks as the
			// others' reports arrive, and grows back once its own is in.
			// Each node takes more than half its first share (75 of two
			// nodes, 50 of three), so that it reports them.
			hits := map[int]int{2: 40, 3: 30}[n]
			for _, nd := range nodes {
				for range hits {
					if !poll.Soon(2*time.Second, time.Millisecond, func() bool { return nd.store.Take(0, "acme", long, time.Now()).Allowed }) {
						t.Fatalf("%s: hit denied under the limit", nd.id)
					}
				}
			}
			allSee(t, nodes, 0, "acme", int64(hits*n))
			// What is left of the budget can be spent on any node, once:
			// the node takes its share of it, and once its report has
			// reached the others, its share of what then remains, and so
			// on until nothing remains.
			admitted, want := 0, 100-hits*n
			last := nodes[n-1]
			deadline := time.Now().Add(waitLong)
			for last.total(0, "acme") < 100 && time.Now().Before(deadline) {
				if last.store.Take(0, "acme", long, time.Now()).Allowed {
					admitted++
				} else {
					time.Sleep(time.Millisecond)
				}
			}
			if admitted != want {
				t.Errorf("the last node admitted %d, want the %d left", admitted, want)
			}
			if got := last.store.ShareDenials(); got == 0 {
				t.Errorf("no share denial: the last node admitted %d at once, beyond its share", admitted)
			}
			allSee(t, nodes, 0, "acme", 100)
			for _, nd := range nodes {
				if nd.store.Take(0, "acme", long, time.Now()).Allowed {
					t.Errorf("%s admitted over the cluster limit", nd.id)
				}
			}
			for _, nd := range nodes {
				nd.stop(t)
			}
			noLeaks(t)
		})
	}
}

func TestClusterOneMessagePerNodePerInterval(t *testing.T) {
	srv := testnats.Run(t)
	const interval = 50 * time.Millisecond
	// Count every batch message per sender, from a plain subscriber.
	watch, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var mu sync.Mutex
	perNode := map[string]int{}
	if _, err := watch.Subscribe("ratelimit.batch", func(m *nats.Msg) {
		var msg message
		if decode(m.Data, &msg) == nil {
			mu.Lock()
			perNode[msg.Node]++
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	a := startLive(t, srv.ClientURL(), "a", Config{SyncInterval: interval}, nodeOpts{})
	b := startLive(t, srv.ClientURL(), "b", Config{SyncInterval: interval}, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)

	big := counter.Limit{Limit: counter.MaxLimitFor(counter.MaxScaleMS), ScaleMS: counter.MaxScaleMS}
	start := time.Now()
	var hits atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		nd := []*live{a, b}[g%2]
		wg.Go(func() {
			for i := 0; time.Since(start) < 20*interval; i++ {
				nd.store.Take(0, fmt.Sprint("k", (g*7919+i)%1000), big, time.Now())
				hits.Add(1)
			}
		})
	}
	wg.Wait()
	// Let the last changes go out, then stop counting.
	poll.Until(t, waitLong, step, func() error {
		if p := a.store.Pending() + b.store.Pending(); p != 0 {
			return fmt.Errorf("%d keys pending", p)
		}
		return nil
	})
	a.stop(t)
	b.stop(t)
	watch.Flush()
	elapsed := time.Since(start)
	intervals := int(elapsed/interval) + 2 // the partial ones at each end, and the final batch
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"a", "b"} {
		if perNode[id] == 0 || perNode[id] > intervals {
			t.Errorf("%s published %d batches in %v (%d intervals) for %d hits in all; want 1..%d",
				id, perNode[id], elapsed.Round(time.Millisecond), intervals, hits.Load(), intervals)
		}
	}
	t.Logf("%d hits in %v: %v batches per node", hits.Load(), elapsed.Round(time.Millisecond), perNode)
}

func TestClusterLostAndDuplicatedBatch(t *testing.T) {
	srv := testnats.Run(t)
	var sent atomic.Int32
	// a ticks when the test says so; its second batch is lost on the way,
	// its third goes out twice.
	kick := make(chan chan struct{})
	// Shares off: every hit is replicated, whatever its key's share.
	a := startLive(t, srv.ClientURL(), "a", Config{SyncInterval: time.Hour, ShareDelay: -1}, nodeOpts{hooks: hooks{
		kick: kick,
		send: func(nc *nats.Conn, subj string, data []byte) error {
			if subj != "ratelimit.batch" {
				return nc.Publish(subj, data)
			}
			switch sent.Add(1) {
			case 2:
				return nil
			case 3:
				if err := nc.Publish(subj, data); err != nil {
					return err
				}
			}
			return nc.Publish(subj, data)
		},
	}})
	b := startLive(t, srv.ClientURL(), "b", Config{}, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	take := func(n int) {
		for range n {
			a.store.Take(1, "ch", long, time.Now())
		}
		done := make(chan struct{})
		kick <- done
		<-done
	}
	take(4)
	allSee(t, []*live{b}, 1, "ch", 4)
	take(3) // lost
	take(1) // sent twice
	allSee(t, []*live{b}, 1, "ch", 8)
	poll.Until(t, waitLong, step, func() error {
		if got := metric(t, b.r.m.batchesRepeated); got != 1 {
			return fmt.Errorf("batches_repeated_total %v, want 1", got)
		}
		return nil
	})
	if got := metric(t, b.r.m.batchesMissed); got != 1 {
		t.Errorf("batches_missed_total %v, want 1", got)
	}
	if got := b.total(1, "ch"); got != 8 {
		t.Errorf("b's total %d after the duplicate, want 8", got)
	}
}

func TestClusterDropsStaleWindows(t *testing.T) {
	srv := testnats.Run(t)
	b := startLive(t, srv.ClientURL(), "b", Config{}, nodeOpts{})
	b.waitReady(t)
	raw, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	now := time.Now()
	batch := func(seq uint64, key string, window int64) []byte {
		sent := now
		if w := counter.WindowOf(now.UnixMilli(), 1000); window < w {
			sent = now.Add(time.Duration(window-w) * time.Second) // a late batch: its offset is 0
		}
		m := message{
			header:  header{Kind: kindBatch, Node: "raw", Incarnation: 1, SentAtMS: sent.UnixMilli(), Seq: seq},
			Limits:  []wireLimit{{Name: "inbound", ScaleMS: 1000}},
			Entries: []entry{{Window: window, Key: key, Count: 3}},
		}
		return m.encode(nil)
	}
	w := counter.WindowOf(now.UnixMilli(), 1000)
	raw.Publish("ratelimit.batch", batch(1, "old", w-2))      // sent 2 s ago: ended before the previous window
	raw.Publish("ratelimit.batch", batch(2, "previous", w-1)) // merged: it weighs in the shares
	raw.Publish("ratelimit.batch", []byte("not a batch"))
	raw.Publish("ratelimit.batch", batch(3, "new", w))
	poll.Until(t, waitLong, step, func() error {
		if got := metric(t, b.r.m.batchesReceived); got != 3 {
			return fmt.Errorf("%v batches received", got)
		}
		return nil
	})
	if got := metric(t, b.r.m.dropped.stale); got != 1 {
		t.Errorf("stale drops %v, want 1", got)
	}
	if got := metric(t, b.r.m.malformed.decode); got != 1 {
		t.Errorf("malformed %v, want 1", got)
	}
	if n := b.store.Len(); n != 2 {
		t.Errorf("%d keys stored, want 2 (the stale entry is not)", n)
	}
}

func TestClusterFinalBatchOnShutdown(t *testing.T) {
	srv := testnats.Run(t)
	// An interval so long that only the final batch can carry the hits.
	a := startLive(t, srv.ClientURL(), "a", Config{SyncInterval: time.Hour}, nodeOpts{})
	b := startLive(t, srv.ClientURL(), "b", Config{SyncInterval: time.Hour}, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	for range 7 {
		a.store.Take(0, "acme", long, time.Now())
	}
	a.stop(t)
	allSee(t, []*live{b}, 0, "acme", 7)
}

func TestClusterWarmStart(t *testing.T) {
	srv := testnats.Run(t)
	// Shares off: b2's one hit is replicated, far below its share as it is.
	cfg := Config{WarmStartTimeout: time.Minute, ShareDelay: -1}
	a := startLive(t, srv.ClientURL(), "a", cfg, nodeOpts{})
	// Alone, a is ready at once: nobody answers, NATS says so.
	a.waitReady(t)
	b := startLive(t, srv.ClientURL(), "b", cfg, nodeOpts{})
	b.waitReady(t)
	for range 40 {
		a.store.Take(0, "acme", long, time.Now())
	}
	for range 25 {
		b.store.Take(0, "acme", long, time.Now())
	}
	allSee(t, []*live{a, b}, 0, "acme", 65)
	// b restarts: a new process with an empty store, the same node id.
	b.stop(t)
	b2 := startLive(t, srv.ClientURL(), "b", cfg, nodeOpts{})
	b2.waitReady(t)
	// Ready means warm: no waiting for batches (a has nothing new to send).
	if got := b2.total(0, "acme"); got != 65 {
		t.Fatalf("restarted b sees %d when ready, want 65", got)
	}
	if b2.store.Take(0, "acme", long, time.Now()); b2.local(0, "acme") != 1 {
		t.Errorf("local count after warm start: %d", b2.local(0, "acme"))
	}
	allSee(t, []*live{a, b2}, 0, "acme", 66)
}

// steadyLoad takes a hit on every node every tick until stop is closed,
// and counts what each admitted.
func steadyLoad(nodes []*live, key string, lim counter.Limit, tick time.Duration, stop <-chan struct{}) (wait func() []int64) {
	admitted := make([]atomic.Int64, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Go(func() {
			tk := time.NewTicker(tick)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-tk.C:
					if nd.store.Take(0, key, lim, now).Allowed {
						admitted[i].Add(1)
					}
				}
			}
		})
	}
	return func() []int64 {
		wg.Wait()
		out := make([]int64, len(nodes))
		for i := range admitted {
			out[i] = admitted[i].Load()
		}
		return out
	}
}

func TestClusterNATSStoppedAndRestartedUnderLoad(t *testing.T) {
	p := testnats.StartProcess(t)
	// Shares off: a key of a huge limit is replicated at every change.
	a := startLive(t, p.URL(), "a", Config{ShareDelay: -1}, nodeOpts{})
	b := startLive(t, p.URL(), "b", Config{ShareDelay: -1}, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	nodes := []*live{a, b}
	big := counter.Limit{Limit: counter.MaxLimitFor(counter.MaxScaleMS), ScaleMS: counter.MaxScaleMS}
	stop := make(chan struct{})
	wait := steadyLoad(nodes, "k", big, time.Millisecond, stop)

	// Running: both see both.
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if nd.total(0, "k") <= nd.local(0, "k") {
				return fmt.Errorf("%s has no remote counts yet", nd.id)
			}
		}
		return nil
	})
	p.Stop()
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if nd.connected() {
				return fmt.Errorf("%s still connected", nd.id)
			}
		}
		return nil
	})
	// NATS is away: the nodes keep admitting on their own counts.
	remoteAtStop := map[string]int64{}
	localAtStop := map[string]int64{}
	for _, nd := range nodes {
		localAtStop[nd.id] = nd.local(0, "k")
		remoteAtStop[nd.id] = nd.total(0, "k") - nd.local(0, "k")
	}
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if nd.local(0, "k") < localAtStop[nd.id]+100 {
				return fmt.Errorf("%s admitted only %d during the outage", nd.id, nd.local(0, "k")-localAtStop[nd.id])
			}
		}
		return nil
	})
	p.Start()
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if !nd.connected() {
				return fmt.Errorf("%s not reconnected", nd.id)
			}
		}
		return nil
	})
	// Back: what each counted during the outage reaches the other.
	poll.Until(t, waitLong, step, func() error {
		for _, nd := range nodes {
			if remote := nd.total(0, "k") - nd.local(0, "k"); remote < remoteAtStop[nd.id]+100 {
				return fmt.Errorf("%s: remote count %d, not caught up from %d", nd.id, remote, remoteAtStop[nd.id])
			}
		}
		return nil
	})
	close(stop)
	counts := wait()
	sum := counts[0] + counts[1]
	allSee(t, nodes, 0, "k", sum)
	if got := metric(t, a.r.m.publishErrors) + metric(t, b.r.m.publishErrors); got != 0 {
		t.Logf("%v publish errors (allowed: NATS went away mid-publish)", got)
	}
	t.Logf("admitted %v; reconnects a=%d b=%d", counts, a.r.conn.Load().Stats().Reconnects, b.r.conn.Load().Stats().Reconnects)
}

func TestClusterStartsWithoutNATS(t *testing.T) {
	p := testnats.StartProcess(t)
	p.Stop()
	a := startLive(t, p.URL(), "a", Config{WarmStartTimeout: time.Minute}, nodeOpts{})
	// Ready at once: serving on its own counts.
	a.waitReady(t)
	for range 5 {
		if !a.store.Take(0, "acme", long, time.Now()).Allowed {
			t.Fatal("denied while NATS is away")
		}
	}
	p.Start()
	poll.Until(t, waitLong, step, func() error {
		if !a.connected() {
			return fmt.Errorf("a not connected")
		}
		return nil
	})
	b := startLive(t, p.URL(), "b", Config{}, nodeOpts{})
	b.waitReady(t)
	allSee(t, []*live{a, b}, 0, "acme", 5)
}
