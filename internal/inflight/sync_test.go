package inflight

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// fakeCaster records the bodies cast.
type fakeCaster struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (f *fakeCaster) Cast(b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bodies = append(f.bodies, append([]byte(nil), b...))
	return nil
}
func (f *fakeCaster) MaxCast() int        { return 1 << 16 }
func (f *fakeCaster) Shares() share.Split { return share.Split{Nodes: 1} }

func (f *fakeCaster) take() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bodies
	f.bodies = nil
	return b
}

// value reads a counter.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func newSync(t *testing.T, c Caster, cfg SyncConfig) *Sync {
	t.Helper()
	tb := newTable(t, Config{})
	s, err := NewSync(tb, c, cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.SetBuckets(map[string]counter.Bucket{"db_pool": 1})
	return s
}

// TestSyncForwardsUnknownReleasesBounded: a release of a lease this node
// does not hold is forwarded, at most MaxForwards waiting; the peer that
// holds the lease frees it, another finds nothing.
func TestSyncForwardsUnknownReleasesBounded(t *testing.T) {
	var c fakeCaster
	a := newSync(t, &c, SyncConfig{MaxForwards: 2})
	for _, id := range []string{"r1", "r2", "r3"} {
		if a.Release(1, "acme", id) {
			t.Fatalf("%s released on a node that holds nothing", id)
		}
	}
	if got := value(t, a.m.forwardsDropped); got != 1 {
		t.Fatalf("%v forwards dropped, want 1", got)
	}
	a.castForwards(&packer{})
	bodies := c.take()
	if len(bodies) != 1 {
		t.Fatalf("%d bodies cast, want 1", len(bodies))
	}
	holder, other := newSync(t, nil, SyncConfig{}), newSync(t, nil, SyncConfig{})
	holder.t.Acquire(1, "acme", "r2", 5, time.Minute, t0)
	holder.Receive(3, bodies[0])
	other.Receive(3, bodies[0])
	if l, _ := holder.t.InFlight(1, "acme"); l != 0 {
		t.Fatalf("the holder still holds %d", l)
	}
	if got := value(t, holder.m.forwardedFreed); got != 1 {
		t.Fatalf("the holder freed %v forwarded releases, want 1", got)
	}
	if got := value(t, other.m.forwardedFreed); got != 0 {
		t.Fatalf("another node freed %v", got)
	}
}

// TestSyncForwardKeepsCopies: the key and request id of a forwarded
// release are copied: the caller (the lean RLS path) may reuse the
// buffer they are views of as soon as Release returns.
func TestSyncForwardKeepsCopies(t *testing.T) {
	var c fakeCaster
	a := newSync(t, &c, SyncConfig{})
	buf := []byte("acme|r1")
	a.Release(1, unsafe.String(&buf[0], 4), unsafe.String(&buf[5], 2))
	copy(buf, "XXXX|YY")
	a.castForwards(&packer{})
	holder := newSync(t, nil, SyncConfig{})
	holder.Acquire(1, "acme", "r1", 5, time.Minute, t0)
	for _, b := range c.take() {
		holder.Receive(3, b)
	}
	if l, _ := holder.t.InFlight(1, "acme"); l != 0 {
		t.Fatalf("the forwarded release named another lease: %d still held", l)
	}
}

// TestSyncCastsGaugesAndDropsUnknownBuckets: Run casts a changed gauge; a
// peer takes it under the sender's id; a gauge of a bucket the receiver
// does not have, and a body that does not decode, are dropped and
// counted.
func TestSyncCastsGaugesAndDropsUnknownBuckets(t *testing.T) {
	var c fakeCaster
	a := newSync(t, &c, SyncConfig{Interval: time.Millisecond})
	a.t.Acquire(1, "acme", "r1", 5, time.Minute, time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var bodies [][]byte
	poll.Until(t, 10*time.Second, time.Millisecond, func() error {
		if bodies = append(bodies, c.take()...); len(bodies) == 0 {
			return errors.New("nothing cast")
		}
		return nil
	})
	cancel()
	<-done
	b := newSync(t, nil, SyncConfig{})
	for _, body := range bodies {
		b.Receive(9, body)
	}
	if _, r := b.t.InFlight(1, "acme"); r != 1 {
		t.Fatalf("the peer counts %d of a's, want 1", r)
	}
	other := newSync(t, nil, SyncConfig{})
	other.SetBuckets(map[string]counter.Bucket{"jobs": 2})
	other.Receive(9, bodies[0])
	other.Receive(9, []byte{0xff})
	if got := value(t, other.m.dropped[dropUnknownBucket]); got < 1 {
		t.Errorf("unknown bucket drops %v", got)
	}
	if got := value(t, other.m.dropped[dropMalformed]); got != 1 {
		t.Errorf("malformed drops %v, want 1", got)
	}
}

func TestNewSyncRefuses(t *testing.T) {
	tb := newTable(t, Config{GaugeExpiry: time.Second})
	reg, log := prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	for _, cfg := range []SyncConfig{{FullInterval: time.Second}, {Interval: -1}, {MaxForwards: -1}} {
		if _, err := NewSync(tb, nil, cfg, reg, log); err == nil {
			t.Errorf("NewSync(%+v) accepted", cfg)
		}
	}
	if _, err := NewSync(nil, nil, SyncConfig{}, reg, log); err == nil {
		t.Error("NewSync without a table accepted")
	}
}
