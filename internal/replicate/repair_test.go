package replicate

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// TestClusterAntiEntropyRepairsLostBatch: through a real nats-server, a's
// only batch for a key is lost and the key never changes again; b has the
// count within two anti-entropy periods: the next snapshot of live counts
// is at most a period away, and its counts go out over the next period
// (measured and logged).
func TestClusterAntiEntropyRepairsLostBatch(t *testing.T) {
	srv := testnats.StartProcess(t)
	const period = 2 * time.Second
	var droppedAt atomic.Int64
	drop := hooks{send: func(nc *nats.Conn, subj string, data []byte) error {
		var m message
		if subj == "ratelimit.batch" && decode(data, &m) == nil && len(m.Entries) > 0 && droppedAt.Load() == 0 {
			droppedAt.Store(time.Now().UnixNano())
			return nil // lost on the way
		}
		return nc.Publish(subj, data)
	}}
	a := startLive(t, srv.URL(), "a", Config{AntiEntropy: period}, nodeOpts{hooks: drop})
	b := startLive(t, srv.URL(), "b", Config{}, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	// Half of a's first share of 100 (75 of two nodes): the last hit is
	// near the share and has the key published; the others are not.
	for range 38 {
		a.store.Take(0, "quiet", long, time.Now())
	}
	poll.Until(t, waitLong, time.Millisecond, func() error {
		if droppedAt.Load() == 0 {
			return fmt.Errorf("no batch dropped yet")
		}
		if got := b.total(0, "quiet"); got != 38 {
			return fmt.Errorf("b sees %d", got)
		}
		return nil
	})
	took := time.Since(time.Unix(0, droppedAt.Load()))
	t.Logf("lost batch repaired %v after it was dropped (anti-entropy period %v)", took.Round(time.Millisecond), period)
	if took > 2*period+time.Second {
		t.Errorf("repaired after %v, want within two periods of %v", took, period)
	}
	if got := metric(t, a.r.m.antiEntropy); got < 1 {
		t.Errorf("anti-entropy entries sent: %v", got)
	}
}

// TestClusterHeartbeatsKeepAQuietPeer: two nodes with nothing to send stay
// known to each other well past the peer expiry.
func TestClusterHeartbeatsKeepAQuietPeer(t *testing.T) {
	srv := testnats.StartProcess(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, PeerExpiry: 500 * time.Millisecond}
	a := startLive(t, srv.URL(), "a", cfg, nodeOpts{})
	b := startLive(t, srv.URL(), "b", cfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	poll.Until(t, waitLong, step, func() error {
		if a.r.peers.len() != 1 || b.r.peers.len() != 1 {
			return fmt.Errorf("peers: a %d, b %d", a.r.peers.len(), b.r.peers.len())
		}
		return nil
	})
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if a.r.peers.len() != 1 || b.r.peers.len() != 1 {
			t.Fatalf("a quiet peer was forgotten: a knows %d, b %d", a.r.peers.len(), b.r.peers.len())
		}
	}
	if metric(t, a.r.m.heartbeats) < 10 || metric(t, a.r.m.batchesSent) != 0 {
		t.Errorf("a sent %v heartbeats and %v batches in 2 s", metric(t, a.r.m.heartbeats), metric(t, a.r.m.batchesSent))
	}
}

// slowStore merges slowly.
type slowStore struct{ Store }

func (s slowStore) Merge(p counter.PeerID, c counter.WindowCount, now time.Time) counter.MergeStatus {
	time.Sleep(200 * time.Microsecond)
	return s.Store.Merge(p, c, now)
}

// TestClusterSlowConsumerResyncs: a node that reads its batches too slowly
// loses some in the NATS client; the event is counted and logged, and the
// node resyncs from its peers.
func TestClusterSlowConsumerResyncs(t *testing.T) {
	srv := testnats.StartProcess(t)
	b := startLive(t, srv.URL(), "b", Config{}, nodeOpts{})
	b.waitReady(t)
	a := startLive(t, srv.URL(), "a", Config{}, nodeOpts{
		wrap:  func(s Store) Store { return slowStore{s} },
		hooks: hooks{subPending: 16},
	})
	a.waitReady(t)
	syncs := a.r.syncer.lastSync.Load()
	flood, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	for i := range 2000 {
		flood.Publish("ratelimit.batch", enc(forged("p", 1, time.Now(), fmt.Sprint("k", i), 1)))
	}
	flood.Flush()
	poll.Until(t, waitLong, step, func() error {
		if got := metric(t, a.r.m.slowConsumer); got < 1 {
			return fmt.Errorf("slow consumer events %v", got)
		}
		if a.r.syncer.lastSync.Load() == syncs {
			return fmt.Errorf("no resync started")
		}
		return nil
	})
}

// gatedStore merges only while its gate is open: a node whose batch
// handler stalls, as a stopped process does, while NATS keeps its
// messages.
type gatedStore struct {
	Store
	gate *sync.RWMutex // write-locked: stalled
}

func (s gatedStore) Merge(p counter.PeerID, c counter.WindowCount, now time.Time) counter.MergeStatus {
	s.gate.RLock()
	defer s.gate.RUnlock()
	return s.Store.Merge(p, c, now)
}

// TestClusterStallIsNotClockSkew: a node whose reading stalls for 2.6 s
// then reads the batches that waited meanwhile, seconds old. That is how
// long they waited, logged as such; the clock skew (exported, logged) is
// what the batches read promptly show: none, on one host.
func TestClusterStallIsNotClockSkew(t *testing.T) {
	srv := testnats.StartProcess(t)
	cfg := Config{ShareDelay: -1, Heartbeat: 100 * time.Millisecond} // clock periods of 1 s
	var gate sync.RWMutex
	logs := &logbuf.Buffer{}
	b := startLive(t, srv.URL(), "b", cfg, nodeOpts{wrap: func(s Store) Store { return gatedStore{s, &gate} }, logs: logs})
	a := startLive(t, srv.URL(), "a", cfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	// a counts a hit every 10 ms: a batch every sync interval.
	big := counter.Limit{Limit: counter.MaxLimitFor(counter.MaxScaleMS), ScaleMS: counter.MaxScaleMS}
	stop := make(chan struct{})
	defer steadyLoad([]*live{a}, "k", big, 10*time.Millisecond, stop)()
	defer close(stop)
	seen := func() int64 {
		_, tot := counts(b.store, 0, "k", big, time.Now())
		return tot
	}
	poll.UntilTrue(t, waitLong, step, func() bool { return seen() > 0 })
	time.Sleep(1500 * time.Millisecond) // a clock period or more of prompt batches
	gate.Lock()
	time.Sleep(2600 * time.Millisecond)
	gate.Unlock()
	at := seen()
	poll.UntilTrue(t, waitLong, step, func() bool { return seen() > at })
	time.Sleep(2500 * time.Millisecond) // two clock periods of prompt batches
	if got := b.r.peers.maxSkew(); got > 100*time.Millisecond {
		t.Errorf("clock skew %v after a stall, on one host", got)
	}
	out := logs.String()
	if strings.Contains(out, "skew") {
		t.Errorf("a stall logged as clock skew:\n%s", out)
	}
	if !strings.Contains(out, "waited above the warning threshold") {
		t.Errorf("the batches that waited through the stall not logged:\n%s", out)
	}
}
