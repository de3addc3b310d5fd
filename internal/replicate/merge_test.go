package replicate

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// These tests drive the Replicator's publishing and receiving halves
// directly, without NATS: what one node's publishChanges emits is handed to
// another node's onBatch.

var t0 = time.Date(2025, 6, 2, 10, 0, 0, 250_000_000, time.UTC)

type node struct {
	r     *Replicator
	store *counter.Store
	reg   *prometheus.Registry
	now   time.Time
	logs  *logbuf.Buffer
}

func newNode(t testing.TB, id string, cfg Config) *node {
	t.Helper()
	return newNodeWith(t, id, cfg, nodeOpts{})
}

// nodeOpts adjust a test node.
type nodeOpts struct {
	store *counter.Store    // nil: a new store that tracks changes
	wrap  func(Store) Store // if set, the Replicator uses wrap(store)
	hooks hooks
	logs  *logbuf.Buffer // if set, a live node logs there too
}

// stores returns the node's store and the Store its Replicator uses.
func (o nodeOpts) stores(t testing.TB) (*counter.Store, Store) {
	t.Helper()
	store := o.store
	if store == nil {
		var err error
		if store, err = counter.New(counter.Config{Track: true}); err != nil {
			t.Fatal(err)
		}
	}
	if o.wrap != nil {
		return store, o.wrap(store)
	}
	return store, store
}

// buckets are buckets of the names, each with its index as id, counted in
// fixed windows, without bounds.
func buckets(names ...string) []Bucket {
	bs := make([]Bucket, len(names))
	for i, n := range names {
		bs[i] = Bucket{Name: n, ID: counter.Bucket(i)}
	}
	return bs
}

// bounded are the buckets activity_create and inbound, ids 0 and 1, with
// the bounds given.
func bounded(activityCreate, inbound map[int64]int64) []Bucket {
	bs := buckets("activity_create", "inbound")
	bs[0].Bounds, bs[1].Bounds = activityCreate, inbound
	return bs
}

// newNodeWith returns a node whose clock is its now field.
func newNodeWith(t testing.TB, id string, cfg Config, o nodeOpts) *node {
	t.Helper()
	store, st := o.stores(t)
	if cfg.URL == "" {
		cfg.URL = "nats://127.0.0.1:1" // never dialled by these tests
	}
	if cfg.Buckets == nil {
		cfg.Buckets = buckets("activity_create", "inbound")
	}
	cfg.NodeID = id
	n := &node{store: store, reg: prometheus.NewRegistry(), now: t0, logs: &logbuf.Buffer{}}
	cfg.Now = func() time.Time { return n.now }
	log := slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := newReplicator(cfg, st, n.reg, log, o.hooks)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	n.r = r
	return n
}

// publish runs one publishing tick at the node's clock and returns the
// messages it would have sent.
func (n *node) publish(t testing.TB, max int) [][]byte {
	t.Helper()
	var out [][]byte
	n.r.tickNoConn(n.now, max, func(b []byte) error {
		out = append(out, bytes.Clone(b))
		return nil
	})
	return out
}

// tickNoConn is tick without a connection.
func (r *Replicator) tickNoConn(now time.Time, max int, send func([]byte) error) {
	r.recv.retryDeferred(now)
	r.peers.expire(now, r.cfg.PeerExpiry)
	r.pub.publishChanges(now, max, send, false)
}

func (n *node) receive(msgs ...[]byte) {
	for _, m := range msgs {
		n.r.recv.onBatch(&nats.Msg{Subject: n.r.batchSubj, Data: m})
	}
}

func (n *node) total(t testing.TB, bucket counter.Bucket, key string, lim counter.Limit) int64 {
	t.Helper()
	_, tot := counts(n.store, bucket, key, lim, n.now)
	return tot
}

// counts reads, through Snapshot, the counts store holds of (bucket, key)
// in now's window of lim: this node's own, and the total over it and
// every peer (what a Fixed limit decides on).
func counts(store *counter.Store, bucket counter.Bucket, key string, lim counter.Limit, now time.Time) (local, total int64) {
	w := counter.WindowOf(now.UnixMilli(), lim.ScaleMS)
	for _, pc := range store.LiveCounts(nil, now) {
		if pc.Bucket != bucket || pc.Key != key || pc.ScaleMS != lim.ScaleMS || pc.Window != w {
			continue
		}
		total += pc.Count
		if pc.Peer == counter.Self {
			local += pc.Count
		}
	}
	return local, total
}

// metric reads a counter or gauge.
func metric(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	v, err := scrape.Value(m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sumReasons is the sum of the counters of rs.
func sumReasons(t testing.TB, rs []reason) float64 {
	t.Helper()
	var s float64
	for _, r := range rs {
		s += metric(t, *r.c)
	}
	return s
}

var sec100 = counter.Limit{Limit: 100, ScaleMS: 1000}

func TestBatchesShareOneBudget(t *testing.T) {
	a, b := newNode(t, "a", Config{}), newNode(t, "b", Config{})
	for range 60 {
		a.store.Take(0, "acme", sec100, a.now)
	}
	for range 30 {
		b.store.Take(0, "acme", sec100, b.now)
	}
	b.receive(a.publish(t, 1<<20)...)
	a.receive(b.publish(t, 1<<20)...)
	for _, n := range []*node{a, b} {
		if got := n.total(t, 0, "acme", sec100); got != 90 {
			t.Errorf("%s: total %d, want 90", n.r.cfg.NodeID, got)
		}
	}
	// Ten more in all, whichever node takes them.
	admitted := 0
	for i := range 20 {
		n := a
		if i%2 == 1 {
			n = b
		}
		if n.store.Take(0, "acme", sec100, n.now).Allowed {
			admitted++
		}
	}
	if admitted != 20 {
		// Without a sync in between each node admits up to its own view:
		// both see 90, so both admit 10.
		t.Fatalf("admitted %d of 20 before the next sync, want 20 (10 per node)", admitted)
	}
	b.receive(a.publish(t, 1<<20)...)
	a.receive(b.publish(t, 1<<20)...)
	for _, n := range []*node{a, b} {
		if got := n.total(t, 0, "acme", sec100); got != 110 {
			t.Errorf("%s: total %d after sync, want 110", n.r.cfg.NodeID, got)
		}
		if n.store.Take(0, "acme", sec100, n.now).Allowed {
			t.Errorf("%s: admitted over the cluster limit after sync", n.r.cfg.NodeID)
		}
	}
	if got := metric(t, a.r.m.batchesSent); got != 2 {
		t.Errorf("a sent %v batches, want 2", got)
	}
	if got := metric(t, b.r.m.entriesMerged); got != 2 {
		t.Errorf("b merged %v entries, want 2", got)
	}
}

func TestLostAndRepeatedBatches(t *testing.T) {
	a, b := newNode(t, "a", Config{}), newNode(t, "b", Config{})
	take := func(n int) {
		for range n {
			a.store.Take(1, "ch-1", sec100, a.now)
		}
	}
	take(5)
	first := a.publish(t, 1<<20)
	take(3)
	lost := a.publish(t, 1<<20)
	take(2)
	third := a.publish(t, 1<<20)
	b.receive(first...)
	if got := b.total(t, 1, "ch-1", sec100); got != 5 {
		t.Fatalf("after the first batch: %d, want 5", got)
	}
	_ = lost // never arrives
	b.receive(third...)
	if got := b.total(t, 1, "ch-1", sec100); got != 10 {
		t.Errorf("after a lost batch and the next: %d, want 10 (repaired)", got)
	}
	b.receive(third...)
	b.receive(first...) // late and repeated
	if got := b.total(t, 1, "ch-1", sec100); got != 10 {
		t.Errorf("after repeats: %d, want 10", got)
	}
	if got := metric(t, b.r.m.batchesMissed); got != 1 {
		t.Errorf("batches_missed_total %v, want 1", got)
	}
	if got := metric(t, b.r.m.batchesRepeated); got != 2 {
		t.Errorf("batches_repeated_total %v, want 2", got)
	}
}

func TestOneMessagePerInterval(t *testing.T) {
	a := newNode(t, "a", Config{})
	for i := range 10_000 {
		a.store.Take(0, fmt.Sprintf("tenant-%05d", i), sec100, a.now)
	}
	msgs := a.publish(t, 1<<20)
	if len(msgs) != 1 {
		t.Fatalf("%d messages for 10,000 changed keys under 1 MiB, want 1", len(msgs))
	}
	if msgs := a.publish(t, 1<<20); len(msgs) != 0 {
		t.Errorf("%d messages with nothing changed, want 0", len(msgs))
	}
	for i := range 10_000 {
		a.store.Take(0, fmt.Sprintf("a-longer-tenant-name-%05d", i), sec100, a.now)
	}
	msgs = a.publish(t, 64<<10)
	if len(msgs) < 3 || len(msgs) > 6 {
		t.Errorf("%d messages for ~300 KB of entries at 64 KiB each", len(msgs))
	}
	for _, m := range msgs {
		if len(m) > 64<<10 {
			t.Errorf("message of %d bytes over the 64 KiB limit", len(m))
		}
	}
}

func TestStaleWindowsDroppedOnBothSides(t *testing.T) {
	a, b := newNode(t, "a", Config{}), newNode(t, "b", Config{})
	a.store.Take(0, "acme", sec100, a.now)
	a.now = a.now.Add(time.Second) // the window ended before the tick
	if msgs := a.publish(t, 1<<20); len(msgs) != 0 {
		t.Errorf("published %d messages of an ended window", len(msgs))
	}
	if got := metric(t, a.r.m.dropped.staleLocal); got != 1 {
		t.Errorf("stale_local drops %v, want 1", got)
	}
	// A batch that arrives after its window and the next ended (one that
	// arrives in the next is merged: the previous window weighs in the
	// shares).
	a.now = t0
	a.store.Take(0, "acme", sec100, a.now)
	msgs := a.publish(t, 1<<20)
	b.now = t0.Add(2 * time.Second)
	b.receive(msgs...)
	if got := metric(t, b.r.m.dropped.stale); got != 1 {
		t.Errorf("stale drops %v, want 1", got)
	}
	if b.store.Len() != 0 {
		t.Errorf("a stale entry was stored")
	}
}

func TestBucketsMatchByName(t *testing.T) {
	a := newNode(t, "a", Config{Buckets: buckets("old_bucket", "inbound")})
	b := newNode(t, "b", Config{Buckets: buckets("inbound", "new_bucket")})
	a.store.Take(0, "k", sec100, a.now) // old_bucket: unknown to b
	a.store.Take(1, "k", sec100, a.now) // inbound: b's bucket 0
	a.store.Take(1, "k", sec100, a.now)
	b.receive(a.publish(t, 1<<20)...)
	if got := b.total(t, 0, "k", sec100); got != 2 {
		t.Errorf("inbound on b: %d, want 2", got)
	}
	if got := b.total(t, 1, "k", sec100); got != 0 {
		t.Errorf("new_bucket on b: %d, want 0", got)
	}
	if got := metric(t, b.r.m.dropped.unknownBucket); got != 1 {
		t.Errorf("unknown_bucket drops %v, want 1", got)
	}
	// The same bucket counted in another window length here.
	b.store.Take(0, "m", counter.Limit{Limit: 5, ScaleMS: 60_000}, b.now)
	a.store.Take(1, "m", sec100, a.now)
	b.receive(a.publish(t, 1<<20)...)
	if got := metric(t, b.r.m.dropped.mismatch); got != 1 {
		t.Errorf("mismatch drops %v, want 1", got)
	}
}

func TestMalformedMessagesCounted(t *testing.T) {
	b := newNode(t, "b", Config{MaxMessageBytes: 1024})
	good := message{header: header{Kind: kindBatch, Node: "a", Incarnation: 1, SentAtMS: t0.UnixMilli()}}
	v2 := good.encode(nil)
	v2[2] = 2
	req := message{header: header{Kind: kindSyncRequest, Node: "a", Incarnation: 1}}
	self := message{header: header{Kind: kindBatch, Node: "b", Incarnation: b.r.self.Incarnation}}
	b.receive([]byte("garbage"), v2, make([]byte, 2000), req.encode(nil), self.encode(nil), good.encode(nil))
	mal := &b.r.m.malformed
	for _, c := range []struct {
		reason string
		c      prometheus.Counter
	}{{"decode", mal.decode}, {"version", mal.version}, {"oversize", mal.oversize}, {"kind", mal.kind}, {"self", mal.self}} {
		if got := metric(t, c.c); got != 1 {
			t.Errorf("malformed{%s} = %v, want 1", c.reason, got)
		}
	}
	if got := metric(t, b.r.m.batchesReceived); got != 1 {
		t.Errorf("batches received %v, want 1 (only the good one)", got)
	}
}

func TestPeersBoundedAndExpired(t *testing.T) {
	b := newNode(t, "b", Config{MaxPeers: 2, PeerExpiry: time.Minute})
	batch := func(node string, key string) []byte {
		m := message{
			header:  header{Kind: kindBatch, Node: node, Incarnation: 7, SentAtMS: t0.UnixMilli()},
			Limits:  []wireLimit{{Name: "inbound", ScaleMS: 1000}},
			Entries: []entry{{Window: t0.Unix(), Key: key, Count: 1}},
		}
		return m.encode(nil)
	}
	b.receive(batch("p1", "x"), batch("p2", "x"), batch("p3", "x"))
	if got := b.total(t, 1, "x", sec100); got != 2 {
		t.Errorf("total %d, want 2 (third peer refused)", got)
	}
	if got := metric(t, b.r.m.peersRefused); got != 1 {
		t.Errorf("peers_refused_total %v, want 1", got)
	}
	// Silent peers are forgotten.
	b.now = t0.Add(2 * time.Minute)
	b.publish(t, 1<<20)
	if b.r.peers.len() != 0 {
		t.Errorf("after expiry: %d peers", b.r.peers.len())
	}
}

// batchesAt returns a's batches sent at each of at, a hit each.
func (a *node) batchesAt(t *testing.T, at ...time.Time) [][]byte {
	t.Helper()
	var out [][]byte
	for _, now := range at {
		a.now = now
		a.store.Take(0, "acme", sec100, now)
		msgs := a.publish(t, 1<<20)
		if len(msgs) != 1 {
			t.Fatalf("%d messages at %v, want 1", len(msgs), now)
		}
		out = append(out, msgs[0])
	}
	return out
}

// every returns n instants d apart from start.
func every(start time.Time, d time.Duration, n int) []time.Time {
	out := make([]time.Time, n)
	for i := range out {
		out[i] = start.Add(time.Duration(i) * d)
	}
	return out
}

// TestClockSkew: a peer whose batches all arrive 1.5 s after their send
// time, over a clock period (ten heartbeats), has a clock 1.5 s off: it
// is exported and logged as skew, not as waiting.
func TestClockSkew(t *testing.T) {
	a := newNode(t, "a", Config{})
	b := newNode(t, "b", Config{Heartbeat: 100 * time.Millisecond, SkewWarning: 500 * time.Millisecond})
	for _, at := range every(t0, 100*time.Millisecond, 12) {
		msgs := a.batchesAt(t, at)
		b.now = at.Add(1500 * time.Millisecond) // b's clock is 1.5 s ahead of a's
		b.receive(msgs...)
	}
	if got := b.r.peers.maxSkew().Seconds(); got != 1.5 {
		t.Errorf("skew %v s, want 1.5", got)
	}
	logs := b.logs.String()
	if !strings.Contains(logs, "clock skew above the warning threshold") || !strings.Contains(logs, "skew=1.5s") {
		t.Errorf("no skew warning logged:\n%s", logs)
	}
	if strings.Contains(logs, "waited") {
		t.Errorf("a skewed clock logged as waiting:\n%s", logs)
	}
}

// TestStalledBatchesAreNotSkew: a node that resumes after a stall reads
// the batches that waited meanwhile, seconds old; that is their delivery
// delay, logged as waiting, while the clock skew stays what the batches
// delivered promptly show.
func TestStalledBatchesAreNotSkew(t *testing.T) {
	a := newNode(t, "a", Config{})
	b := newNode(t, "b", Config{Heartbeat: 100 * time.Millisecond, SkewWarning: 500 * time.Millisecond})
	const prompt = 2 * time.Millisecond
	// Running: each batch read 2 ms after it was sent.
	for _, at := range every(t0, 100*time.Millisecond, 5) {
		msgs := a.batchesAt(t, at)
		b.now = at.Add(prompt)
		b.receive(msgs...)
	}
	// b stalls for 2.6 s (SIGSTOP): a's batches wait, and are all read
	// when b resumes.
	stalled := a.batchesAt(t, every(t0.Add(500*time.Millisecond), 100*time.Millisecond, 26)...)
	b.now = a.now.Add(prompt)
	b.receive(stalled...)
	if got := b.r.peers.roundTrip(&b.r.probe, time.Now(), time.Time{}, time.Time{}, time.Hour); got != 2*prompt {
		t.Errorf("round trip after the backlog %v, want %v (twice the latest batch's age: no probes)", got, 2*prompt)
	}
	// And on: promptly, for more than two clock periods.
	for _, at := range every(a.now.Add(100*time.Millisecond), 100*time.Millisecond, 25) {
		msgs := a.batchesAt(t, at)
		b.now = at.Add(prompt)
		b.receive(msgs...)
	}
	if got := b.r.peers.maxSkew(); got != prompt {
		t.Errorf("skew %v, want %v: the batches that waited are not skew", got, prompt)
	}
	logs := b.logs.String()
	if strings.Contains(logs, "skew") {
		t.Errorf("a stall logged as clock skew:\n%s", logs)
	}
	if !strings.Contains(logs, "waited above the warning threshold") || !strings.Contains(logs, "waited=2.5s") {
		t.Errorf("the batches that waited 2.5 s not logged as such:\n%s", logs)
	}
}

func TestSyncReplyWarmsANewNode(t *testing.T) {
	a, b, c := newNode(t, "a", Config{}), newNode(t, "b", Config{}), newNode(t, "c", Config{})
	for range 40 {
		a.store.Take(0, "acme", sec100, a.now)
	}
	for range 25 {
		b.store.Take(0, "acme", sec100, b.now)
	}
	bBatch := b.publish(t, 1<<20)
	a.receive(bBatch...)
	// c starts and asks a; a's reply holds a's 40 and b's 25, apart.
	chunks := a.r.syncer.reply(1<<20, a.now)
	var m message
	for _, ch := range chunks {
		if err := decode(ch, &m); err != nil {
			t.Fatal(err)
		}
		c.r.syncer.mergeReply(&m, c.now)
	}
	if got := c.total(t, 0, "acme", sec100); got != 65 {
		t.Fatalf("warm total %d, want 65", got)
	}
	// b's batch arriving now (it was in flight) does not count twice, and a
	// later one counts only what is new.
	c.receive(bBatch...)
	if got := c.total(t, 0, "acme", sec100); got != 65 {
		t.Errorf("after b's batch: %d, want 65", got)
	}
	b.store.Take(0, "acme", sec100, b.now)
	c.receive(b.publish(t, 1<<20)...)
	if got := c.total(t, 0, "acme", sec100); got != 66 {
		t.Errorf("after b's next batch: %d, want 66", got)
	}
	// A reply that holds the requester's own counts skips them.
	c.store.Take(0, "own", sec100, c.now)
	a.receive(c.publish(t, 1<<20)...)
	a.now = a.now.Add(time.Second) // a new snapshot may be taken
	for _, ch := range a.r.syncer.reply(1<<20, a.now) {
		if err := decode(ch, &m); err != nil {
			t.Fatal(err)
		}
		c.r.syncer.mergeReply(&m, c.now)
	}
	if got := c.total(t, 0, "own", sec100); got != 1 {
		t.Errorf("own key after a reply that echoes it: %d, want 1", got)
	}
}

func TestDeferredCountsRetried(t *testing.T) {
	sliding := counter.Limit{Limit: 100, ScaleMS: 1000, Algorithm: counter.Sliding}
	bs := buckets("activity_create", "inbound")
	bs[0].Algorithm = counter.Sliding
	a, b := newNode(t, "a", Config{Buckets: bs}), newNode(t, "b", Config{Buckets: bs})
	// b holds the previous window, which its sliding estimate still reads.
	b.store.Incr(0, "acme", sliding, 50, t0.Add(-time.Second))
	// a's clock is ahead: its batch is for b's next window.
	a.now = t0.Add(800 * time.Millisecond)
	a.store.Incr(0, "acme", sliding, 7, a.now)
	b.now = t0.Add(700 * time.Millisecond)
	b.receive(a.publish(t, 1<<20)...)
	if n := len(b.r.recv.deferred); n != 1 {
		t.Fatalf("%d deferred counts, want 1", n)
	}
	b.now = t0.Add(800 * time.Millisecond)
	b.publish(t, 1<<20) // a tick retries
	if got := b.total(t, 0, "acme", sliding); got != 7 {
		t.Errorf("after the retry: %d, want 7", got)
	}
	if len(b.r.recv.deferred) != 0 {
		t.Errorf("%d counts still deferred", len(b.r.recv.deferred))
	}
}

func TestFailedPublishRetried(t *testing.T) {
	a := newNode(t, "a", Config{})
	a.store.Take(0, "acme", sec100, a.now)
	var calls int
	a.r.tickNoConn(a.now, 1<<20, func([]byte) error { calls++; return errors.New("boom") })
	if got := metric(t, a.r.m.publishErrors); got != 1 {
		t.Errorf("publish errors %v, want 1", got)
	}
	if msgs := a.publish(t, 1<<20); len(msgs) != 1 {
		t.Fatalf("%d messages after a failed publish, want 1 (the retry)", len(msgs))
	} else {
		var m message
		if err := decode(msgs[0], &m); err != nil || len(m.Entries) != 1 || m.Entries[0].Count != 1 {
			t.Errorf("retry message: %+v, %v", m, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	store, _ := counter.New(counter.Config{Track: true})
	log := slog.New(slog.DiscardHandler)
	for _, cfg := range []Config{
		{Buckets: buckets("a")},
		{URL: "nats://x"},
		{URL: "nats://x", Buckets: buckets("a", "a")},
		{URL: "nats://x", Buckets: []Bucket{{Name: "a", ID: 7}, {Name: "b", ID: 7}}},
		{URL: "nats://x", Buckets: buckets("")},
		{URL: "nats://x", Buckets: buckets(strings.Repeat("b", maxNameLen+1))},
		{URL: "nats://x", Buckets: buckets("a"), SubjectPrefix: "a.*"},
		{URL: "nats://x", Buckets: buckets("a"), SubjectPrefix: "a..b"},
		{URL: "nats://x", Buckets: buckets("a"), SyncInterval: -1},
		{URL: "nats://x", Buckets: buckets("a"), NodeID: strings.Repeat("n", 256)},
		{URL: "nats://x", Buckets: buckets("a"), MaxMessageBytes: 100},
	} {
		if _, err := New(cfg, store, prometheus.NewRegistry(), log); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	r, err := New(Config{URL: "nats://x", Buckets: buckets("a")}, store, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	if r.cfg.SyncInterval != DefaultSyncInterval || r.cfg.NodeID == "" || r.batchSubj != "ratelimit.batch" {
		t.Errorf("defaults: %+v", r.cfg)
	}
}

func TestTicksAlignToWallClock(t *testing.T) {
	a := newNode(t, "a", Config{SyncInterval: 100 * time.Millisecond})
	for _, c := range []struct{ at, want time.Duration }{
		{0, 100 * time.Millisecond},
		{250 * time.Millisecond, 50 * time.Millisecond},
		{299*time.Millisecond + 999*time.Microsecond, time.Microsecond},
	} {
		now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC).Add(c.at)
		if got := untilTick(now, a.r.cfg.SyncInterval); got != c.want {
			t.Errorf("at +%v: next tick in %v, want %v", c.at, got, c.want)
		}
	}
}

// A count kept for a retry is sent under the bucket its id named when it
// was taken: after a reload gives that id to another bucket, it is
// dropped, never sent as the other bucket's.
func TestRetryAcrossReloadKeepsItsBucket(t *testing.T) {
	a := newNode(t, "a", Config{Buckets: buckets("old_bucket", "inbound")})
	a.store.Take(0, "k", sec100, a.now) // old_bucket
	a.store.Take(1, "k", sec100, a.now) // inbound
	a.r.tickNoConn(a.now, 1<<20, func([]byte) error { return errors.New("boom") })
	// A reload removes old_bucket and gives its id to new_bucket.
	swap, err := a.r.Prepare(buckets("new_bucket", "inbound"))
	if err != nil {
		t.Fatal(err)
	}
	swap()
	msgs := a.publish(t, 1<<20)
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	var m message
	if err := decode(msgs[0], &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Entries) != 1 || m.Limits[m.Entries[0].Limit].Name != "inbound" {
		t.Errorf("retried entries %+v with limits %+v, want inbound's alone", m.Entries, m.Limits)
	}
	if got := metric(t, a.r.m.dropped.unknownBucket); got != 1 {
		t.Errorf("unknown_bucket drops %v, want 1", got)
	}
}
