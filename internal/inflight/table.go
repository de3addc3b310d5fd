package inflight

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// Config bounds a [Table]. A zero field means its default.
type Config struct {
	// Shards is the number of shards, rounded up to a power of two; 64.
	Shards int
	// MaxLeases bounds the live leases (released or swept ones do not
	// count); 262144. The bound is enforced per shard, so refusals may
	// begin slightly below it.
	MaxLeases int
	// MaxKeys bounds the (bucket, key) pairs held: those with a lease
	// here or a peer's gauge; 65536.
	MaxKeys int
	// MaxKeyBytes: a longer key is held as its digest
	// (counter.StoredKey); counter.DefaultMaxKeyBytes.
	MaxKeyBytes int
	// MaxRequestIDBytes: a longer request id is refused
	// (DeniedRequestID); 128. Envoy's ids are UUIDs, 36 bytes.
	MaxRequestIDBytes int
	// MaxPeersPerKey bounds the peers' gauges held per key; 64.
	MaxPeersPerKey int
	// GaugeExpiry: a peer's gauge not repeated for this long is dropped
	// (the peer stopped, or was cut off); 3 s.
	GaugeExpiry time.Duration
	// Observer, when set, is told of each acquisition admitted or denied
	// (the limit, a full table; not a refused request id) as one hit,
	// without a window (window and scale 0), as the counter tells it of
	// its decisions: the live view's top keys.
	Observer counter.Observer
}

// Defaults of Config.
const (
	DefaultShards            = 64
	DefaultMaxLeases         = 1 << 18
	DefaultMaxKeys           = 1 << 16
	DefaultMaxRequestIDBytes = 128
	DefaultMaxPeersPerKey    = 64
	DefaultGaugeExpiry       = 3 * time.Second
	maxShards                = 1 << 16
)

// ErrInvalidConfig is wrapped by [New] for an invalid Config.
var ErrInvalidConfig = errors.New("inflight: invalid config")

func (c Config) withDefaults() (Config, error) {
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"Shards", &c.Shards, DefaultShards}, {"MaxLeases", &c.MaxLeases, DefaultMaxLeases},
		{"MaxKeys", &c.MaxKeys, DefaultMaxKeys}, {"MaxKeyBytes", &c.MaxKeyBytes, counter.DefaultMaxKeyBytes},
		{"MaxRequestIDBytes", &c.MaxRequestIDBytes, DefaultMaxRequestIDBytes},
		{"MaxPeersPerKey", &c.MaxPeersPerKey, DefaultMaxPeersPerKey},
	} {
		if *f.v < 0 {
			return c, fmt.Errorf("%w: %s %d is negative", ErrInvalidConfig, f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Shards > maxShards {
		return c, fmt.Errorf("%w: Shards %d is above %d", ErrInvalidConfig, c.Shards, maxShards)
	}
	c.Shards = 1 << bits.Len(uint(c.Shards-1))
	if c.GaugeExpiry < 0 {
		return c, fmt.Errorf("%w: GaugeExpiry %v is negative", ErrInvalidConfig, c.GaugeExpiry)
	}
	if c.GaugeExpiry == 0 {
		c.GaugeExpiry = DefaultGaugeExpiry
	}
	return c, nil
}

// Outcome is what Acquire decided.
type Outcome uint8

const (
	// Acquired: the lease is held until released or expired.
	Acquired Outcome = iota
	// DeniedLimit: the key has limit requests in flight (here and at the
	// peers, as last heard).
	DeniedLimit
	// DeniedFull: the table holds MaxLeases leases or MaxKeys keys, none
	// expired: fail closed.
	DeniedFull
	// DeniedRequestID: the request id is empty, longer than
	// MaxRequestIDBytes, or already holds a lease of this bucket and key
	// (a repeated id must not hold one slot for many requests).
	DeniedRequestID
	// DeniedInvalid: a limit below 1 or a time to live that is not
	// positive.
	DeniedInvalid
)

// Result is the answer of Acquire.
type Result struct {
	Outcome Outcome
	// InFlight is the key's requests in flight after the call: this
	// node's leases and the peers' gauges.
	InFlight int64
}

// Allowed reports whether the lease was acquired.
func (r Result) Allowed() bool { return r.Outcome == Acquired }

// Table is a sharded table of leases, one per (request id, bucket, key)
// in flight, and of the in-flight gauge per (bucket, key): this node's
// leases and what each peer last reported. It is safe for concurrent use;
// the zero value is not usable: create one with [New].
type Table struct {
	cfg      Config
	seed     maphash.Seed // shard and map hashing: per Table
	idSeeds  [2]maphash.Seed
	shards   []shard
	shift    uint
	leaseCap int // per shard
	keyCap   int // per shard
	// shares is the split in effect (SetShares): nodes<<48 | rank<<32 |
	// delay ms; 0: none.
	shares atomic.Uint64
}

type shard struct {
	shardState
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

type shardState struct {
	mu     sync.Mutex
	leases map[leaseID]int64 // expiry, unix ms
	keys   map[keyID]*gauge
	// changed lists the keys whose local count changed since the last
	// Changes (each once: gauge.listed).
	changed []*gauge
	// minExpiry is a lower bound on every lease's expiry, exact after a
	// sweep; lastSweep when Acquire last swept (it sweeps at most once
	// per sweepGap).
	minExpiry, lastSweep int64
	highLeases           int
	expired              uint64
	denied               [3]uint64 // by deniedLimit, deniedFull, deniedID
	refusedGauges        uint64
}

// Indices of shardState.denied.
const (
	deniedLimit = iota
	deniedFull
	deniedID
)

// sweepGap is the least time between two sweeps of a shard that Acquire
// runs, so that a flood of leases at the bound costs one pass over the
// shard per gap, not per request; a slot is then back at most sweepGap
// after its lease expired (never before).
const sweepGap = 50

type keyID struct {
	bucket counter.Bucket
	key    string
}

// leaseID names a lease by its key and a 128-bit hash of the request id
// under the Table's secret seeds: a release can name another request's
// lease only by naming its request id.
type leaseID struct {
	keyID
	req [2]uint64
}

// gauge is one key's requests in flight: local leases, and the sum of
// the peers' reports in remote.
type gauge struct {
	key    string // owned copy: the map's key and every lease's share it
	bucket counter.Bucket
	local  int64
	remote int64
	peers  []peerGauge
	listed bool
	// What Changes last reported of local (pubNew, at pubAt ms) and the
	// report before it that was already in effect (pubOld); see admits.
	pubNew, pubOld, pubAt int64
}

type peerGauge struct {
	peer uint32
	n    int64
	at   int64 // unix ms it was last reported
}

func (g *gauge) empty() bool { return g.local == 0 && len(g.peers) == 0 && !g.listed }

// New returns an empty Table, or an error wrapping [ErrInvalidConfig].
func New(cfg Config) (*Table, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := cfg.Shards
	t := &Table{
		cfg:      cfg,
		seed:     maphash.MakeSeed(),
		idSeeds:  [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		shards:   make([]shard, n),
		shift:    uint(64 - bits.TrailingZeros(uint(n))),
		leaseCap: (cfg.MaxLeases + n - 1) / n,
		keyCap:   (cfg.MaxKeys + n - 1) / n,
	}
	for i := range t.shards {
		t.shards[i].leases = map[leaseID]int64{}
		t.shards[i].keys = map[keyID]*gauge{}
		t.shards[i].minExpiry = math.MaxInt64
	}
	return t, nil
}

func (t *Table) shardFor(k keyID) *shard {
	h := maphash.String(t.seed, k.key) ^ uint64(k.bucket)*0x9e3779b97f4a7c15
	h *= 0xbf58476d1ce4e5b9
	return &t.shards[h>>t.shift]
}

// lease returns the id of requestID's lease of k, false for an id that
// is empty or too long.
func (t *Table) lease(requestID string, k keyID) (leaseID, bool) {
	if len(requestID) == 0 || len(requestID) > t.cfg.MaxRequestIDBytes {
		return leaseID{}, false
	}
	return leaseID{k, [2]uint64{maphash.String(t.idSeeds[0], requestID), maphash.String(t.idSeeds[1], requestID)}}, true
}

// SetShares sets how the live nodes split each key's free slots (see
// admits): how many, this node's rank among them, and how long after
// Changes reported a gauge the peers are taken to hold it. Nodes ≤ 1, or
// a split out of range, turns shares off. Safe to call while the table
// is in use.
func (t *Table) SetShares(sp share.Split) {
	if sp.Nodes <= 1 || sp.Nodes > math.MaxUint16 || sp.Rank < 0 || sp.Rank >= sp.Nodes || sp.Delay < 0 {
		t.shares.Store(0)
		return
	}
	t.shares.Store(uint64(sp.Nodes)<<48 | uint64(sp.Rank)<<32 | uint64(min(sp.Delay.Milliseconds(), math.MaxUint32)))
}

// Shares is the split SetShares set (Nodes 1: none).
func (t *Table) Shares() share.Split {
	sv := t.shares.Load()
	if sv == 0 {
		return share.Split{Nodes: 1}
	}
	return share.Split{Nodes: int(sv >> 48), Rank: int(uint16(sv >> 32)), Delay: time.Duration(uint32(sv)) * time.Millisecond}
}

// admits reports whether g admits one more request under limit at ms.
//
// Always: local + remote < limit. With shares (SetShares), also: the
// requests this node admitted beyond what its peers are known to hold of
// it stay within its share of the slots no node is known to hold,
//
//	local − reported < share of (limit − reported − remote)
//
// where reported is this node's gauge as every peer is known to hold it:
// its latest report once that is the delay old, before then the lower of
// it and the report before. While no node is known to hold a slot of the key the share is an
// even split of the free slots (share.Participant over every node: the
// shares add up to them exactly); then it is share.Split.Of, weighed by
// the slots each node is known to hold, so that a node carrying all the
// traffic takes most of what is free each round of the delay. When the
// nodes hold the same reports their shares add up to the free slots
// (rounded up: at most nodes − 1 over), so a burst on every node at once
// holds about the limit instead of nodes × limit
// (docs/design/inflight.md).
func (t *Table) admits(g *gauge, limit, ms int64) bool {
	if g.local+g.remote >= limit {
		return false
	}
	sv := t.shares.Load()
	if sv == 0 {
		return true
	}
	sp := share.Split{Nodes: int(sv >> 48), Rank: int(uint16(sv >> 32))}
	// What every peer is known to hold of this node: the latest report
	// once it is the delay old; before, the lower of it and the one
	// before, since a peer may hold either. The lower: a report of
	// released slots lets the peers admit into them at once, so this node
	// must not count them as its own any more.
	reported := min(g.pubOld, g.pubNew)
	if ms-g.pubAt >= int64(uint32(sv)) {
		reported = g.pubNew
	}
	free := min(limit-reported-g.remote, limit)
	if free <= 0 {
		return false
	}
	var n int64
	if all := reported + g.remote; all <= 0 {
		n = max(1, share.Participant(free, int64(sp.Nodes), int64(sp.Nodes), int64(sp.Rank)))
	} else {
		n = sp.Of(limit, free, reported, all, 0)
	}
	return g.local-reported < n
}

// Acquire takes a lease for requestID on (bucket, key) when the key
// admits one more request under limit (see admits: this node's leases
// and the peers' gauges, and this node's share of the free slots); the
// lease is released by Release or expires ttl after now. A denial takes
// nothing.
func (t *Table) Acquire(bucket counter.Bucket, key, requestID string, limit int64, ttl time.Duration, now time.Time) Result {
	if limit < 1 || ttl <= 0 {
		return Result{Outcome: DeniedInvalid}
	}
	k := keyID{bucket, counter.StoredKey(key, t.cfg.MaxKeyBytes)}
	r := t.acquire(k, requestID, limit, ttl, now)
	if obs := t.cfg.Observer; obs != nil && (r.Outcome == Acquired || r.Outcome == DeniedLimit || r.Outcome == DeniedFull) {
		obs.Hit(bucket, k.key, 1, r.Outcome == Acquired, 0, 0, now.UnixMilli())
	}
	return r
}

// acquire is Acquire of the stored key k, under its shard's lock.
func (t *Table) acquire(k keyID, requestID string, limit int64, ttl time.Duration, now time.Time) Result {
	bucket := k.bucket
	lid, ok := t.lease(requestID, k)
	if !ok {
		sh := t.shardFor(k)
		sh.mu.Lock()
		sh.denied[deniedID]++
		sh.mu.Unlock()
		return Result{Outcome: DeniedRequestID}
	}
	ms := now.UnixMilli()
	sh := t.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := sh.keys[k]
	if g != nil {
		// A repeated id is refused whatever the load, before the limit.
		if _, dup := sh.leases[lid]; dup {
			sh.denied[deniedID]++
			return Result{Outcome: DeniedRequestID, InFlight: g.local + g.remote}
		}
	}
	if g != nil && !t.admits(g, limit, ms) && sh.sweepIfDue(ms, t.cfg.GaugeExpiry) {
		g = sh.keys[k]
	}
	if g != nil && !t.admits(g, limit, ms) {
		sh.denied[deniedLimit]++
		return Result{Outcome: DeniedLimit, InFlight: g.local + g.remote}
	}
	if len(sh.leases) >= t.leaseCap || (g == nil && len(sh.keys) >= t.keyCap) {
		if sh.sweepIfDue(ms, t.cfg.GaugeExpiry) {
			g = sh.keys[k]
		}
		if len(sh.leases) >= t.leaseCap || (g == nil && len(sh.keys) >= t.keyCap) {
			sh.denied[deniedFull]++
			return Result{Outcome: DeniedFull}
		}
	}
	if g == nil {
		g = &gauge{key: strings.Clone(k.key), bucket: bucket}
		sh.keys[keyID{bucket, g.key}] = g
	}
	lid.key = g.key // the owned copy, not the caller's string
	exp := ms + ttl.Milliseconds()
	sh.leases[lid] = exp
	sh.minExpiry = min(sh.minExpiry, exp)
	g.local++
	sh.list(g)
	return Result{Outcome: Acquired, InFlight: g.local + g.remote}
}

// Release frees requestID's lease of (bucket, key) and reports whether
// there was one: a lease that expired, was released already, or is of
// another request, bucket or key is not touched.
func (t *Table) Release(bucket counter.Bucket, key, requestID string) bool {
	k := keyID{bucket, counter.StoredKey(key, t.cfg.MaxKeyBytes)}
	lid, ok := t.lease(requestID, k)
	if !ok {
		return false
	}
	sh := t.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, held := sh.leases[lid]; !held {
		return false
	}
	delete(sh.leases, lid)
	g := sh.keys[k]
	g.local--
	sh.list(g)
	return true
}

// list puts g on the changed list, once.
func (sh *shard) list(g *gauge) {
	if !g.listed {
		g.listed = true
		sh.changed = append(sh.changed, g)
	}
}

// sweepIfDue sweeps the shard when a lease may have expired and the last
// sweep is sweepGap old, and reports whether it did.
func (sh *shard) sweepIfDue(ms int64, gaugeExpiry time.Duration) bool {
	if ms < sh.minExpiry || ms-sh.lastSweep < sweepGap {
		return false
	}
	sh.lastSweep = ms
	sh.sweep(ms, gaugeExpiry, false)
	return true
}

// sweep deletes the leases expired at ms (counting each as expired
// unreleased) and, with gauges, the peers' gauges older than expiry and
// the keys left empty. The lock must be held.
func (sh *shard) sweep(ms int64, expiry time.Duration, gauges bool) {
	sh.highLeases = max(sh.highLeases, len(sh.leases))
	if ms >= sh.minExpiry {
		low := int64(math.MaxInt64)
		for lid, exp := range sh.leases {
			if ms < exp {
				low = min(low, exp)
				continue
			}
			delete(sh.leases, lid)
			sh.expired++
			g := sh.keys[lid.keyID]
			g.local--
			sh.list(g)
		}
		sh.minExpiry = low
		// A map does not shrink: one sized for a flood is replaced once
		// it holds a quarter of that.
		if sh.highLeases >= 1024 && len(sh.leases) < sh.highLeases/4 {
			m := make(map[leaseID]int64, len(sh.leases))
			for k, v := range sh.leases {
				m[k] = v
			}
			sh.leases, sh.highLeases = m, len(m)
		}
	}
	if !gauges {
		return
	}
	old := ms - expiry.Milliseconds()
	for k, g := range sh.keys {
		if len(g.peers) > 0 {
			g.peers = slicesDeleteOld(g.peers, old)
			g.remote = 0
			for _, p := range g.peers {
				g.remote += p.n
			}
		}
		if g.empty() {
			delete(sh.keys, k)
		}
	}
}

func slicesDeleteOld(ps []peerGauge, old int64) []peerGauge {
	j := 0
	for _, p := range ps {
		if p.at > old {
			ps[j] = p
			j++
		}
	}
	clear(ps[j:])
	if j == 0 {
		return nil
	}
	return ps[:j]
}

// Sweep deletes the leases expired at now, counting each as expired
// unreleased, and the peers' gauges not repeated within
// Config.GaugeExpiry. Each shard is locked in turn.
func (t *Table) Sweep(now time.Time) {
	ms := now.UnixMilli()
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.sweep(ms, t.cfg.GaugeExpiry, true)
		sh.mu.Unlock()
	}
}

// Gauge is one key's requests in flight on one node.
type Gauge struct {
	Bucket counter.Bucket
	Key    string
	N      int64
}

// Changes appends to dst this node's gauge of every key whose leases
// changed since it was last reported (0 for a key with none left),
// noting that it is reported at now, and returns it. A key reported less
// than the shares' delay ago waits for a later call: two reports of a
// key are never closer than the delay, so what a peer may hold of it is
// its last report in effect or the one after (pubOld, pubNew; see
// admits). The keys are the table's own immutable strings.
func (t *Table) Changes(dst []Gauge, now time.Time) []Gauge {
	ms := now.UnixMilli()
	delay := int64(uint32(t.shares.Load()))
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		waiting := sh.changed[:0]
		for _, g := range sh.changed {
			if g.pubAt != 0 && ms >= g.pubAt && ms-g.pubAt < delay { // a clock stepped back reports at once
				waiting = append(waiting, g)
				continue
			}
			dst = append(dst, Gauge{g.bucket, g.key, g.local})
			g.pubOld, g.pubNew, g.pubAt = g.pubNew, g.local, ms
			g.listed = false
			if g.empty() {
				delete(sh.keys, keyID{g.bucket, g.key})
			}
		}
		clear(sh.changed[len(waiting):])
		sh.changed = waiting
		sh.mu.Unlock()
	}
	return dst
}

// All appends to dst this node's last report (Changes) of every key it
// reported holding leases of: a repeat, which keeps the peers' gauges
// from expiring, never a report admits does not know of.
func (t *Table) All(dst []Gauge) []Gauge {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, g := range sh.keys {
			if g.pubNew > 0 {
				dst = append(dst, Gauge{g.bucket, g.key, g.pubNew})
			}
		}
		sh.mu.Unlock()
	}
	return dst
}

// SetPeer records that peer has n requests of (bucket, key) in flight as
// of now, replacing what it reported before; n = 0 removes its gauge. It
// reports false, keeping nothing, for a negative n or when there is no
// room (MaxKeys, MaxPeersPerKey): the key then counts without it.
func (t *Table) SetPeer(peer uint32, bucket counter.Bucket, key string, n int64, now time.Time) bool {
	if n < 0 {
		return false
	}
	k := keyID{bucket, counter.StoredKey(key, t.cfg.MaxKeyBytes)}
	sh := t.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := sh.keys[k]
	if g == nil {
		if n == 0 {
			return true
		}
		if len(sh.keys) >= t.keyCap {
			sh.refusedGauges++
			return false
		}
		g = &gauge{key: strings.Clone(k.key), bucket: bucket}
		sh.keys[keyID{bucket, g.key}] = g
	}
	for i := range g.peers {
		if p := &g.peers[i]; p.peer == peer {
			g.remote += n - p.n
			if n == 0 {
				g.peers = append(g.peers[:i], g.peers[i+1:]...)
				if g.empty() {
					delete(sh.keys, k)
				}
				return true
			}
			p.n, p.at = n, now.UnixMilli()
			return true
		}
	}
	if n == 0 {
		return true
	}
	if len(g.peers) >= t.cfg.MaxPeersPerKey {
		sh.refusedGauges++
		return false
	}
	g.peers = append(g.peers, peerGauge{peer: peer, n: n, at: now.UnixMilli()})
	g.remote += n
	return true
}

// InFlight returns the key's requests in flight: this node's leases and
// the peers' gauges.
func (t *Table) InFlight(bucket counter.Bucket, key string) (local, remote int64) {
	k := keyID{bucket, counter.StoredKey(key, t.cfg.MaxKeyBytes)}
	sh := t.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if g := sh.keys[k]; g != nil {
		return g.local, g.remote
	}
	return 0, 0
}

// EachHeld calls f with every key of bucket that has leases on this
// node, and their number: one pass over the keys the table holds,
// bounded by MaxKeys, each shard's lock held while its keys are visited
// (f must not call the table).
func (t *Table) EachHeld(bucket counter.Bucket, f func(key string, leases int64)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, g := range sh.keys {
			if k.bucket == bucket && g.local > 0 {
				f(g.key, g.local)
			}
		}
		sh.mu.Unlock()
	}
}

// Stats are a Table's totals since New.
type Stats struct {
	Leases, Keys int // held now
	// Expired counts leases swept unreleased; DeniedLimit, DeniedFull
	// and DeniedRequestID the denials of each Outcome; RefusedGauges,
	// peers' gauges not kept for want of room.
	Expired, DeniedLimit, DeniedFull, DeniedRequestID, RefusedGauges uint64
}

// Stats returns the totals, locking each shard in turn.
func (t *Table) Stats() Stats {
	var s Stats
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		s.Leases += len(sh.leases)
		s.Keys += len(sh.keys)
		s.Expired += sh.expired
		s.DeniedLimit += sh.denied[deniedLimit]
		s.DeniedFull += sh.denied[deniedFull]
		s.DeniedRequestID += sh.denied[deniedID]
		s.RefusedGauges += sh.refusedGauges
		sh.mu.Unlock()
	}
	return s
}

// ByBucket calls f with this node's leases per bucket.
func (t *Table) ByBucket(f func(b counter.Bucket, n int64)) {
	sum := map[counter.Bucket]int64{}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, g := range sh.keys {
			if g.local > 0 {
				sum[g.bucket] += g.local
			}
		}
		sh.mu.Unlock()
	}
	for b, n := range sum {
		f(b, n)
	}
}
