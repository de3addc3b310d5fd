package inflight

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// Caster broadcasts a body to every peer (replicate.Replicator.Cast),
// and says how the live nodes split the budgets (Nodes 1 while NATS is
// away or shares are off).
type Caster interface {
	Cast(body []byte) error
	MaxCast() int
	Shares() share.Split
}

// SyncConfig configures a [Sync]. A zero field means its default.
type SyncConfig struct {
	// Interval: the gauges that changed, and the releases to forward, are
	// cast at most this often; 10 ms. It is most of the delay with which
	// a peer learns of an acquisition (see docs/design/inflight.md).
	Interval time.Duration
	// FullInterval: every gauge this node holds is cast this often, so
	// that a lost cast is repaired and the peers' copies do not expire;
	// 1 s. It must be below the peers' Config.GaugeExpiry.
	FullInterval time.Duration
	// SweepInterval: expired leases and silent peers' gauges are swept
	// this often; 250 ms.
	SweepInterval time.Duration
	// NoShares turns the shares of the free slots off (Table.SetShares):
	// each node admits up to the limit on its view.
	NoShares bool
	// MaxForwards bounds the releases waiting to be forwarded; 4096.
	// Beyond, a release is dropped and counted (its lease then expires).
	MaxForwards int
	// Now is the clock; time.Now.
	Now func() time.Time
}

// minDelivery is the least delivery delay of a cast the shares assume
// (as share.Delay does for batches).
const minDelivery = 5 * time.Millisecond

// Defaults of SyncConfig.
const (
	DefaultInterval      = 10 * time.Millisecond
	DefaultFullInterval  = time.Second
	DefaultSweepInterval = 250 * time.Millisecond
	DefaultMaxForwards   = 4096
)

// Sync runs a Table: it sweeps it, exports its metrics and, with a
// Caster, casts this node's gauges to the peers, takes theirs, and
// forwards to them the releases of leases it does not hold. Its methods
// are safe for concurrent use.
type Sync struct {
	t     *Table
	cast  Caster // nil: a node alone
	cfg   SyncConfig
	log   *slog.Logger
	names atomic.Pointer[bucketNames]
	m     syncMetrics

	mu       sync.Mutex
	forwards []forward // releases to forward, at most cfg.MaxForwards

	rx body // owned by Receive (one cast at a time)
}

type forward struct {
	bucket       counter.Bucket
	key, request string
}

// bucketNames maps the buckets to the names they travel under, both ways.
type bucketNames struct {
	ids   map[string]counter.Bucket
	names map[counter.Bucket]string
}

// NewSync returns a Sync of t, casting with c (nil: a node alone), with
// its metrics registered on reg.
func NewSync(t *Table, c Caster, cfg SyncConfig, reg prometheus.Registerer, log *slog.Logger) (*Sync, error) {
	if t == nil || reg == nil || log == nil {
		return nil, errors.New("inflight: NewSync needs a table, a registerer and a logger")
	}
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.Interval, DefaultInterval}, {&cfg.FullInterval, DefaultFullInterval}, {&cfg.SweepInterval, DefaultSweepInterval}} {
		if *f.v < 0 {
			return nil, fmt.Errorf("%w: negative interval %v", ErrInvalidConfig, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if cfg.FullInterval >= t.cfg.GaugeExpiry {
		return nil, fmt.Errorf("%w: FullInterval %v is not below GaugeExpiry %v: the peers would drop this node's gauges between two casts", ErrInvalidConfig, cfg.FullInterval, t.cfg.GaugeExpiry)
	}
	if cfg.MaxForwards < 0 {
		return nil, fmt.Errorf("%w: MaxForwards %d is negative", ErrInvalidConfig, cfg.MaxForwards)
	}
	if cfg.MaxForwards == 0 {
		cfg.MaxForwards = DefaultMaxForwards
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Sync{t: t, cast: c, cfg: cfg, log: log}
	s.names.Store(&bucketNames{})
	if err := s.m.register(reg, s); err != nil {
		return nil, err
	}
	return s, nil
}

// SetBuckets names the concurrency buckets, by id, for the wire and the
// metrics; a peer's gauge or release of a bucket not named is dropped
// and counted. Safe to call while the Sync runs (a reload).
func (s *Sync) SetBuckets(byName map[string]counter.Bucket) {
	n := &bucketNames{ids: maps.Clone(byName), names: make(map[counter.Bucket]string, len(byName))}
	for name, id := range byName {
		n.names[id] = name
	}
	s.names.Store(n)
}

// Table is the lease table the Sync runs.
func (s *Sync) Table() *Table { return s.t }

// Acquire is Table.Acquire: a lease that Release frees here or, held by
// a peer, there.
func (s *Sync) Acquire(bucket counter.Bucket, key, requestID string, limit int64, ttl time.Duration, now time.Time) Result {
	return s.t.Acquire(bucket, key, requestID, limit, ttl, now)
}

// Release frees requestID's lease of (bucket, key) and reports whether
// this node held it. A release of a lease it does not hold is counted
// and, in a cluster, forwarded to the peers: the node that holds it
// frees it. It keeps copies of what it forwards, never key or requestID
// themselves (they may be views of a buffer the caller reuses).
func (s *Sync) Release(bucket counter.Bucket, key, requestID string) bool {
	if s.t.Release(bucket, key, requestID) {
		return true
	}
	s.m.releasesUnknown.Inc()
	if s.cast == nil || len(requestID) == 0 || len(requestID) > s.t.cfg.MaxRequestIDBytes {
		return false
	}
	s.mu.Lock()
	if len(s.forwards) >= s.cfg.MaxForwards {
		s.mu.Unlock()
		s.m.forwardsDropped.Inc()
		return false
	}
	s.forwards = append(s.forwards, forward{bucket, strings.Clone(counter.StoredKey(key, s.t.cfg.MaxKeyBytes)), strings.Clone(requestID)})
	s.mu.Unlock()
	return false
}

// Receive takes a peer's cast (a replicate.CastHandler): its gauges
// replace the peer's previous ones, its releases free the leases this
// node holds. Whatever does not decode or names a bucket this node does
// not know is dropped and counted. Casts come one at a time.
func (s *Sync) Receive(from counter.PeerID, data []byte) {
	m := &s.rx
	if err := decodeBody(data, m); err != nil {
		s.m.dropped[dropMalformed].Inc()
		s.log.Debug("dropped a malformed in-flight cast", "err", err)
		return
	}
	names := s.names.Load()
	now := s.cfg.Now()
	for _, e := range m.Entries {
		id, ok := names.ids[m.Buckets[e.Bucket]]
		if !ok {
			s.m.dropped[dropUnknownBucket].Inc()
			continue
		}
		if m.Kind == kindGauges {
			if !s.t.SetPeer(uint32(from), id, e.Key, e.N, now) {
				s.m.dropped[dropRefused].Inc()
			}
			continue
		}
		if s.t.Release(id, e.Key, e.ID) {
			s.m.forwardedFreed.Inc()
		}
	}
}

// Run sweeps the table and, with a Caster, casts until ctx is done; it
// then returns nil.
func (s *Sync) Run(ctx context.Context) error {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	var lastFull, lastSweep time.Time
	var gauges []Gauge
	p := &packer{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now := s.cfg.Now()
		if now.Sub(lastSweep) >= s.cfg.SweepInterval {
			s.t.Sweep(now)
			lastSweep = now
		}
		gauges = s.t.Changes(gauges[:0], now)
		if s.cast == nil {
			continue
		}
		if !s.cfg.NoShares {
			sp := s.cast.Shares()
			// The peers cast their gauges every Interval, not every
			// early gap: the delay covers one.
			sp.Delay = max(sp.Delay, s.cfg.Interval+minDelivery)
			s.t.SetShares(sp)
		}
		s.castGauges(p, gauges)
		if now.Sub(lastFull) >= s.cfg.FullInterval {
			gauges = s.t.All(gauges[:0])
			s.castGauges(p, gauges)
			lastFull = now
		}
		s.castForwards(p)
	}
}

// castGauges casts gs, in as many bodies as they need.
func (s *Sync) castGauges(p *packer, gs []Gauge) {
	s.castEntries(p, kindGauges, len(gs), func(i int) (counter.Bucket, wireEntry) {
		return gs[i].Bucket, wireEntry{Key: gs[i].Key, N: gs[i].N}
	})
}

// castForwards casts the releases waiting to be forwarded.
func (s *Sync) castForwards(p *packer) {
	s.mu.Lock()
	fs := s.forwards
	s.forwards = nil
	s.mu.Unlock()
	n := s.castEntries(p, kindReleases, len(fs), func(i int) (counter.Bucket, wireEntry) {
		return fs[i].bucket, wireEntry{Key: fs[i].key, ID: fs[i].request}
	})
	s.m.forwarded.Add(float64(n))
}

// castEntries casts the n entries of kind that entry returns, in as many
// bodies as they need, and returns how many it packed; an entry of a
// bucket a reload removed is skipped, one larger than a body counted.
func (s *Sync) castEntries(p *packer, kind byte, n int, entry func(int) (counter.Bucket, wireEntry)) int {
	if n == 0 {
		return 0
	}
	names := s.names.Load()
	s.begin(p, kind)
	packed := 0
	for i := range n {
		b, e := entry(i)
		name, ok := names.names[b]
		if !ok {
			continue
		}
		if p.add(name, e) {
			packed++
		} else {
			s.m.castErrors.Inc()
		}
	}
	p.flush()
	return packed
}

func (s *Sync) begin(p *packer, kind byte) {
	p.max = s.cast.MaxCast()
	p.emit = func(b []byte) {
		if err := s.cast.Cast(b); err != nil {
			s.m.castErrors.Inc()
			s.log.Debug("cast in-flight gauges or releases", "err", err)
		}
	}
	p.start(kind)
}
