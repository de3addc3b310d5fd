package replicate

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// Unit tests of what a node does with messages an attacker can send:
// without NATS, each message handed to the handlers directly.

// enc encodes m.
func enc(m message) []byte { return m.encode(nil) }

// forged returns a well-formed batch that sets (bucket 0's name, key) to
// count at at, from node.
func forged(node string, inc uint64, at time.Time, key string, count int64) message {
	return message{
		header:  header{Kind: kindBatch, Node: node, Incarnation: inc, SentAtMS: at.UnixMilli(), Seq: 1},
		Limits:  []wireLimit{{Name: "activity_create", ScaleMS: sec100.ScaleMS}},
		Entries: []entry{{Window: counter.WindowOf(at.UnixMilli(), sec100.ScaleMS), Key: key, Count: count}},
	}
}

func sealWith(t testing.TB, key []byte, prefix string, m message) []byte {
	t.Helper()
	var ad []byte
	return mustSealer(t, prefix, key).seal(nil, m.encode(nil), m.Kind, &ad)
}

// TestNodeIDsNotPrintableDropped: node ids that are not printable ASCII
// (invalid UTF-8 would make a node panic in a metric label, a control
// character forge a log line) are dropped as malformed, in batches and in
// sync reply origins.
func TestNodeIDsNotPrintableDropped(t *testing.T) {
	b := newNode(t, "b", Config{})
	for _, id := range []string{"\xff\xff", "a\xffb", "new\nline level=ERROR", "tab\tid", "sp ace", "\x00", "é", strings.Repeat("n", maxNodeLen+1)} {
		m := forged(id, 1, b.now, "victim", 100)
		b.receive(m.encode(nil))
		reply := message{
			header:  header{Kind: kindSyncReply, Node: "ok", Incarnation: 1, SentAtMS: b.now.UnixMilli(), Last: true},
			Limits:  m.Limits,
			Origins: []origin{{Node: id, Incarnation: 1}},
			Entries: []entry{{Window: m.Entries[0].Window, Key: "victim", Count: 100}},
		}
		var got message
		if err := decode(reply.encode(nil), &got); err == nil {
			t.Errorf("a reply naming origin %q decodes", id)
		}
	}
	if got := metric(t, b.r.m.malformed.decode); got != 8 {
		t.Errorf("malformed{decode} = %v, want 8", got)
	}
	if got := b.total(t, 0, "victim", sec100); got != 0 {
		t.Errorf("victim counted %d", got)
	}
	if b.r.peers.len() != 0 {
		t.Errorf("%d peers entered the table", b.r.peers.len())
	}
}

// TestSealedBatchesOnly: with a cluster key, a well-formed batch that is
// not sealed, or sealed with another key, changes nothing; sealed with
// the key, it counts.
func TestSealedBatchesOnly(t *testing.T) {
	b := newNode(t, "b", Config{Keys: [][]byte{keyA}})
	evil := forged("a", 1, b.now, "victim", 100)
	b.receive(evil.encode(nil), sealWith(t, keyB, "ratelimit", evil), sealWith(t, keyA, "elsewhere", evil))
	mal := &b.r.m.malformed
	for _, c := range []struct {
		reason string
		c      prometheus.Counter
	}{{"unsealed", mal.unsealed}, {"unknown_key", mal.unknownKey}, {"unauthentic", mal.auth}} {
		if got := metric(t, c.c); got != 1 {
			t.Errorf("malformed{%s} = %v, want 1", c.reason, got)
		}
	}
	if got := b.total(t, 0, "victim", sec100); got != 0 || !b.store.Take(0, "victim", sec100, b.now).Allowed {
		t.Fatalf("victim at %d after forged batches", got)
	}
	if b.r.peers.len() != 0 {
		t.Errorf("unauthenticated senders entered the peer table: %d", b.r.peers.len())
	}
	b.receive(sealWith(t, keyA, "ratelimit", evil))
	if got := b.total(t, 0, "victim", sec100); got != 101 {
		t.Errorf("a batch sealed with the key: total %d, want 101", got)
	}
	// A node without a key drops sealed messages rather than misread them.
	c := newNode(t, "c", Config{})
	c.receive(sealWith(t, keyA, "ratelimit", evil))
	if got := metric(t, c.r.m.malformed.noKey); got != 1 {
		t.Errorf("malformed{sealed_without_key} = %v, want 1", got)
	}
}

// TestSealedClusterSharesOneBudget: two nodes with one key replicate as
// without keys; what goes over the wire is sealed.
func TestSealedClusterSharesOneBudget(t *testing.T) {
	cfg := Config{Keys: [][]byte{keyA}}
	a, b := newNode(t, "a", cfg), newNode(t, "b", cfg)
	for range 60 {
		a.store.Take(0, "acme", sec100, a.now)
	}
	msgs := a.publish(t, 1<<20)
	if len(msgs) != 1 || !isSealed(msgs[0]) || bytes.Contains(msgs[0], []byte("acme")) {
		t.Fatalf("published %d messages, not sealed or with the key in clear", len(msgs))
	}
	b.receive(msgs...)
	if got := b.total(t, 0, "acme", sec100); got != 60 {
		t.Errorf("b sees %d, want 60", got)
	}
}

// TestReplayChangesNothing: a captured batch replayed later changes no
// count: within its window the peer's count is merged by max (the same
// or lower count), later its send time is too far from the receiver's
// clock, and a batch of an earlier incarnation that expired from the peer
// table maps to the same peer id again.
func TestReplayChangesNothing(t *testing.T) {
	long := counter.Limit{Limit: 1000, ScaleMS: 3_600_000}
	cfg := Config{Keys: [][]byte{keyA}, PeerExpiry: 10 * time.Second}
	a, b := newNode(t, "a", cfg), newNode(t, "b", cfg)
	for range 10 {
		a.store.Take(0, "acme", long, a.now)
	}
	captured := a.publish(t, 1<<20)
	b.receive(captured...)
	if got := b.total(t, 0, "acme", long); got != 10 {
		t.Fatalf("b sees %d, want 10", got)
	}
	// Replayed at once, and again after a's count went on to 15.
	b.receive(captured...)
	a.store.Take(0, "acme", long, a.now)
	for range 4 {
		a.store.Take(0, "acme", long, a.now)
	}
	b.receive(a.publish(t, 1<<20)...)
	b.receive(captured...)
	if got := b.total(t, 0, "acme", long); got != 15 {
		t.Errorf("after replays: %d, want 15", got)
	}
	// a restarts (a new incarnation) and is forgotten by b; the replayed
	// batch of the old incarnation, within the clock bound, maps to the
	// old peer id: no second count.
	b.now = b.now.Add(20 * time.Second)
	b.publish(t, 1<<20) // a tick: the old incarnation expires
	if b.r.peers.len() != 0 {
		t.Fatalf("%d peers after expiry", b.r.peers.len())
	}
	b.receive(captured...)
	if got := b.total(t, 0, "acme", long); got != 15 {
		t.Errorf("a replay of a forgotten incarnation: %d, want 15", got)
	}
	// Later than MaxClockSkew: dropped unread.
	b.now = b.now.Add(DefaultMaxClockSkew)
	b.receive(captured...)
	if got := metric(t, b.r.m.malformed.clock); got != 1 {
		t.Errorf("malformed{clock} = %v, want 1", got)
	}
	if got := b.total(t, 0, "acme", long); got != 15 {
		t.Errorf("a late replay: %d, want 15", got)
	}
}

// TestReturningPeerKeepsItsID: a peer silent past the expiry that speaks
// again (same incarnation) is the same peer: its counts do not add twice.
func TestReturningPeerKeepsItsID(t *testing.T) {
	long := counter.Limit{Limit: 1000, ScaleMS: 3_600_000}
	a, b := newNode(t, "a", Config{}), newNode(t, "b", Config{PeerExpiry: time.Minute})
	for range 7 {
		a.store.Take(0, "acme", long, a.now)
	}
	b.receive(a.publish(t, 1<<20)...)
	b.now = b.now.Add(2 * time.Minute)
	a.now = b.now
	b.publish(t, 1<<20)
	if b.r.peers.len() != 0 {
		t.Fatal("a not expired")
	}
	a.store.Take(0, "acme", long, a.now)
	b.receive(a.publish(t, 1<<20)...)
	if got := b.total(t, 0, "acme", long); got != 8 {
		t.Errorf("after a came back: %d, want 8", got)
	}
}

// TestWindowsAndCountsBounded: a window length no limit of the bucket has
// here is dropped; a count above the bound is merged at the bound.
func TestWindowsAndCountsBounded(t *testing.T) {
	b := newNode(t, "b", Config{Buckets: bounded(map[int64]int64{1000: 400}, map[int64]int64{})})
	week := message{
		header:  header{Kind: kindBatch, Node: "a", Incarnation: 1, SentAtMS: b.now.UnixMilli()},
		Limits:  []wireLimit{{Name: "activity_create", ScaleMS: 7 * 86_400_000}, {Name: "inbound", ScaleMS: 1000}},
		Entries: []entry{{Limit: 0, Window: counter.WindowOf(b.now.UnixMilli(), 7*86_400_000), Key: "junk", Count: 1}, {Limit: 1, Window: b.now.Unix(), Key: "junk2", Count: 1}},
	}
	b.receive(week.encode(nil), enc(forged("a", 1, b.now, "victim", counter.MaxCount)))
	if got := metric(t, b.r.m.dropped.scale); got != 2 {
		t.Errorf("dropped{scale} = %v, want 2", got)
	}
	if b.store.Len() != 1 {
		t.Errorf("%d keys stored, want 1 (the victim)", b.store.Len())
	}
	if got := b.total(t, 0, "victim", sec100); got != 400 {
		t.Errorf("victim at %d, want the bound 400", got)
	}
	if got := metric(t, b.r.m.clamped); got != 1 {
		t.Errorf("clamped %v, want 1", got)
	}
}

// panicStore panics on Merge.
type panicStore struct {
	Store
	merges atomic.Int32
}

func (p *panicStore) Merge(counter.PeerID, counter.WindowCount, time.Time) counter.MergeStatus {
	p.merges.Add(1)
	panic("boom")
}

func TestPanicInHandlerRecovered(t *testing.T) {
	var ps *panicStore
	n := newNodeWith(t, "b", Config{}, nodeOpts{wrap: func(s Store) Store { ps = &panicStore{Store: s}; return ps }})
	h := n.r.guard("batch", n.r.recv.onBatch)
	h(&nats.Msg{Data: enc(forged("a", 1, n.now, "k", 1))})
	h(&nats.Msg{Data: enc(forged("a", 1, n.now, "k", 2))})
	if got := metric(t, n.r.m.panics); got != 2 || ps.merges.Load() != 2 {
		t.Errorf("panics %v after %d merges, want 2", got, ps.merges.Load())
	}
	if !strings.Contains(n.logs.String(), "recovered a panic") {
		t.Errorf("panic not logged:\n%s", n.logs)
	}
}

// TestHeartbeats: a node with nothing to send publishes an empty batch
// once per heartbeat interval, and that keeps it known to its peers.
func TestHeartbeats(t *testing.T) {
	a := newNode(t, "a", Config{Heartbeat: time.Second, AntiEntropy: -1})
	b := newNode(t, "b", Config{PeerExpiry: 3 * time.Second})
	var out [][]byte
	send := func(m []byte) error { out = append(out, bytes.Clone(m)); return nil }
	for i := range 100 { // 10 s of 100 ms ticks
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		a.r.pub.publishTick(at, 1<<20, send)
		b.now = at
		b.receive(out...)
		out = out[:0]
		b.publish(t, 1<<20)
		if b.r.peers.len() != 1 {
			t.Fatalf("at +%v b knows %d peers", at.Sub(t0), b.r.peers.len())
		}
	}
	if got := metric(t, a.r.m.heartbeats); got != 10 {
		t.Errorf("%v heartbeats in 10 s, want 10", got)
	}
	// With changes to send, no heartbeat.
	a.store.Take(0, "acme", sec100, t0.Add(20*time.Second))
	a.r.pub.publishTick(t0.Add(20*time.Second), 1<<20, send)
	if got := metric(t, a.r.m.heartbeats); got != 10 || len(out) != 1 {
		t.Errorf("heartbeats %v, %d messages", got, len(out))
	}
}

// TestAntiEntropyRepairsAQuietKey: a's only batch for a key is lost and
// the key never changes again; within the anti-entropy period b has it.
func TestAntiEntropyRepairsAQuietKey(t *testing.T) {
	long := counter.Limit{Limit: 1000, ScaleMS: 3_600_000}
	period := 2 * time.Second
	a := newNode(t, "a", Config{SyncInterval: 100 * time.Millisecond, AntiEntropy: period})
	b := newNode(t, "b", Config{})
	for i := range 50 {
		for range i%5 + 1 {
			a.store.Take(0, "k"+string(rune('A'+i)), long, a.now)
		}
	}
	lost := a.publish(t, 1<<20)
	if len(lost) != 1 {
		t.Fatalf("%d messages", len(lost))
	}
	var out [][]byte
	send := func(m []byte) error { out = append(out, bytes.Clone(m)); return nil }
	var repaired time.Duration
	for i := 1; i <= 60; i++ {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		a.r.pub.publishTick(at, 1<<20, send)
		b.now = at
		b.receive(out...)
		out = out[:0]
		all := true
		for j := range 50 {
			if b.total(t, 0, "k"+string(rune('A'+j)), long) != int64(j%5+1) {
				all = false
			}
		}
		if all {
			repaired = at.Sub(t0)
			break
		}
	}
	if repaired == 0 || repaired > period+100*time.Millisecond {
		t.Fatalf("repaired after %v, want within the period %v", repaired, period)
	}
	t.Logf("a lost batch of 50 quiet keys repaired after %v (anti-entropy period %v)", repaired, period)
	if got := metric(t, a.r.m.antiEntropy); got < 50 {
		t.Errorf("%v anti-entropy entries sent, want ≥ 50", got)
	}
}

// countingStore counts Snapshot calls.
type countingStore struct {
	Store
	snapshots atomic.Int32
}

func (c *countingStore) LiveCounts(dst []counter.PeerCount, now time.Time) []counter.PeerCount {
	c.snapshots.Add(1)
	return c.Store.LiveCounts(dst, now)
}

// TestSyncRequestsBounded: a sync request is answered only to an inbox,
// at most SyncAnswersPerSecond in all, from a snapshot taken at most once
// a second whatever the request's time.
func TestSyncRequestsBounded(t *testing.T) {
	var cs *countingStore
	var published []string
	n := newNodeWith(t, "b", Config{SyncAnswersPerSecond: 3}, nodeOpts{
		wrap:  func(s Store) Store { cs = &countingStore{Store: s}; return cs },
		hooks: hooks{send: func(_ *nats.Conn, subj string, _ []byte) error { published = append(published, subj); return nil }},
	})
	nc := &nats.Conn{} // never connected: maxOut uses MaxMessageBytes
	req := func(sentAt time.Time, reply string) {
		m := message{header: header{Kind: kindSyncRequest, Node: "a", Incarnation: 1, SentAtMS: sentAt.UnixMilli()}}
		n.r.syncer.onRequest(nc, &nats.Msg{Subject: n.r.syncSubj, Reply: reply, Data: m.encode(nil)})
	}
	for _, reply := range []string{"", "ratelimit.batch", "_INBOX.", "_INBOX.*", "_INBOX.a.>", "_INBOX..x", "_INBOX.a b", "_INBOX.\xff"} {
		req(n.now, reply)
	}
	if got := metric(t, n.r.m.syncRefused.reply); got != 8 || len(published) != 0 {
		t.Errorf("refused{reply} %v, %d published", got, len(published))
	}
	// 100 requests at once, their send times in the past: 3 answered from
	// one snapshot.
	for range 100 {
		req(n.now.Add(-time.Second), "_INBOX.x")
	}
	if got := metric(t, n.r.m.syncServed); got != 3 {
		t.Errorf("%v answered, want 3", got)
	}
	if got := metric(t, n.r.m.syncRefused.rate); got != 97 {
		t.Errorf("refused{rate} %v, want 97", got)
	}
	if got := cs.snapshots.Load(); got != 1 {
		t.Errorf("%d snapshots for 3 answers, want 1", got)
	}
	for _, s := range published {
		if s != "_INBOX.x" {
			t.Errorf("published to %q", s)
		}
	}
}
