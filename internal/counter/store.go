package counter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Store is the sharded in-memory window counter store. It is safe for
// concurrent use. The zero value is not usable; create one with [New].
//
// All state, the hash seed included, lives in the Store rather than in
// package variables, so several stores (tests, or one per role) never share
// counts, locks or seeds.
type Store struct {
	seed        maphash.Seed // per Store, so an attacker cannot aim keys at one shard of every node
	shards      []shard
	shift       uint // 64 − log2(len(shards)): the shard index is the top bits of the hash
	maxKeyBytes int
	track       bool // note changed local counts for Changes
	maxPeers    int  // peer counts kept per key by Merge
	// reserved is the set of buckets that may use the shards' reserve
	// (Config.Reserved, then SetReserved): an immutable set swapped whole,
	// read without a lock on every insert.
	reserved atomic.Pointer[reservedSet]
	// maxKeys and reservedKeys are Config.MaxKeys and Config.ReservedKeys
	// with their defaults, for MaxKeys and ReservedKeys.
	maxKeys, reservedKeys int
	// near, buffered(1), gets a value (without blocking) when a tracked
	// local count leaves a key near its limit; nil unless track. See
	// [Store.NearLimit].
	near chan struct{}
	// spent is set, before near is signalled, when an Incr spends a key's
	// budget or this node's share of it; see [Store.Spent].
	spent atomic.Bool
	// shares is the Shares in effect, packed (see packShares) so that Take
	// reads it with one atomic load; 0: no shares.
	shares atomic.Uint64
	// obs is Config.Observer; nil: none.
	obs Observer
}

// shard owns a slice of the key space behind one mutex, padded so that
// neighbouring shards' locks do not share a cache line (or an adjacent-line
// prefetch pair).
type shard struct {
	shardState
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

type shardState struct {
	mu sync.Mutex
	// The keys: see table.go. n is the number of live entries.
	entries []entry
	slots   []uint64
	arena   []byte
	n       int
	free    uint32 // index+1 of the first free entry, 0 if none
	// liveKeyBytes is the arena bytes of live keys (length prefixes
	// included); the rest are dead until compactArena.
	liveKeyBytes     int
	arenaCompactions uint64 // lets tests check the arena is reclaimed
	seed             maphash.Seed
	// capacity is the most live keys this shard may hold; keys of buckets
	// not reserved may fill only capacity − reserve.
	capacity, reserve int
	// minExpiry is a lower bound (unix ms) on the expiry of every entry in
	// m, exact right after a sweep. A full shard sweeps itself on insert
	// only once now has reached it, so a flood of live distinct keys costs
	// one O(n) pass per expiry instant, not one per insert.
	minExpiry   int64
	refused     uint64 // keys refused at the bound; per shard so a flood does not contend on one cache line
	shareDenied uint64 // hits denied by this node's share, not by the limit; see Store.ShareDenials
	sweeps      uint64 // passes over m; lets tests check a full shard does not sweep per insert
	// high and peersHigh are the most entries the slab and peers have held
	// since they were made: neither the slab nor a Go map shrinks, so this
	// is what they are sized for. Only sweep and DropBuckets delete, so the
	// count at the start of either is the most since the previous one and
	// Take's path does not have to track it. See rebuild.
	high      int
	peersHigh int

	// changed lists the entries whose local counts changed since the last
	// Changes (each at most once: the entry's listed mark), with their keys
	// copied into keys so that no caller's string (perhaps a substring of a
	// large header) is retained. Both keep their capacity between calls, so
	// marking an entry does not allocate in steady state.
	changed []changeRef
	keys    []byte
	// peers holds, per key that peers reported, each peer's latest count of
	// the windows the entry holds (see Merge); nil until the first.
	peers map[mapKey][]peerCount
}

// changeRef is one entry of shard.changed: the entry's index in the
// slab; its key is keys[off:off+n].
type changeRef struct {
	e      uint32
	off    int
	n      int32
	bucket Bucket
}

// peerCount is one peer's running counts of one key, per slot like the
// entry's: n[i] counts window win[i]. It is valid only while gen equals the
// entry's gen (a reset entry forgets every peer count).
type peerCount struct {
	peer PeerID
	gen  uint16
	win  [2]int64
	n    [2]int64
}

// mapKey is the key of the peers map: a struct of a small int and a
// string, which the runtime hashes and compares without allocating.
type mapKey struct {
	bucket Bucket
	key    string
}

// entry holds the counts of one (bucket, key): its newest window and the one
// before it, indexed by window&1. A window that is not held reads as zero,
// so no "valid" flags are needed. 72 bytes, no pointers (the garbage
// collector does not scan the slab).
type entry struct {
	newest int64    // newest window held; slot newest&1 is it, the other slot is newest−1
	local  [2]int64 // this node's hits (Take/Incr minus Release), saturating at MaxCount
	remote [2]int64 // hits merged from peers (Merge), saturating at MaxCount
	scale  uint32   // ScaleMS the windows were counted in (≤ MaxScaleMS < 2^32); 0: a free entry
	bucket Bucket
	key    uint32 // offset of the key in the shard's arena; for a free entry, the next free one (index+1)
	gen    uint16 // bumped by reset, so peer counts recorded before it no longer apply
	alg    Algorithm
	marks  uint8 // changed, published (per slot) and listed bits: see the constants
	// What Changes last reported of the newest window's local count
	// (pubNew, at pubAt ms into the window) and the report before it that
	// was already in effect (pubOld); see shares.go. Zero when the newest
	// window has not been reported. The counts saturate at MaxLimit: a
	// count above any limit admits nothing whatever its share.
	pubNew, pubOld, pubAt uint32
	// limit is the Limit of the latest local write (0: none yet), so that
	// Merge can tell whether a peer's report shrank this node's share below
	// its unreported hits. It fills what was padding.
	limit uint32
}

// Bits of entry.marks: changed<<slot, local[slot] changed since the last
// Changes; published<<slot, Changes reported local[slot]'s window (see
// Reported); listed, the entry is on its shard's changed list.
const (
	changed   = 1 << 0
	published = 1 << 2
	listed    = 1 << 7
)

// New returns an empty Store, or an error wrapping [ErrInvalidConfig] for a
// negative field or too many shards.
func New(cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := cfg.Shards
	s := &Store{
		seed:        maphash.MakeSeed(),
		shards:      make([]shard, n),
		shift:       uint(64 - bits.TrailingZeros(uint(n))),
		maxKeyBytes: cfg.MaxKeyBytes,
		track:       cfg.Track,
		maxPeers:    cfg.MaxPeersPerKey,
		obs:         cfg.Observer,

		maxKeys:      cfg.MaxKeys,
		reservedKeys: cfg.ReservedKeys,
	}
	if cfg.Track {
		s.near = make(chan struct{}, 1)
	}
	s.reserved.Store(newReservedSet(cfg.Reserved))
	capacity := (cfg.MaxKeys + n - 1) / n
	// At least one key of a bucket not reserved fits in every shard. The
	// reserve is kept whether or not buckets are reserved now, so that a
	// reload may reserve some; room ignores it while none is.
	reserve := min((cfg.ReservedKeys+n-1)/n, capacity-1)
	for i := range s.shards {
		s.shards[i].slots = make([]uint64, minSlots)
		s.shards[i].seed = s.seed
		s.shards[i].capacity = capacity
		s.shards[i].reserve = reserve
		s.shards[i].minExpiry = math.MaxInt64
	}
	return s, nil
}

// digestLen is the length of a stored digest key: "#" + 32 hex digits.
const digestLen = 1 + 2*16

// storedKey returns the form of key the store holds: StoredKey under
// Config.MaxKeyBytes.
func (s *Store) storedKey(key string) string { return StoredKey(key, s.maxKeyBytes) }

// StoredKey returns the form of key a store bounded to maxBytes per key
// holds: key itself, or its digest ("#" and 32 hex digits) when it is
// longer than maxBytes or starts with the digest marker '#'. Digesting
// '#'-keys too makes the mapping injective (barring SHA-256 collisions): a
// raw key can never equal the digest of another key. A key kept as it is
// is returned without allocating.
func StoredKey(key string, maxBytes int) string {
	if len(key) <= maxBytes && (len(key) == 0 || key[0] != '#') {
		return key
	}
	return digest(key)
}

// digest returns "#" + 32 hex digits of key's SHA-256 (128 bits: no
// collision is to be expected among any number of keys a store can hold).
func digest(key string) string {
	// Sum256 only reads its input, so the string's bytes are passed as they
	// are rather than copied.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(key), len(key)))
	var b [digestLen]byte
	b[0] = '#'
	hex.Encode(b[1:], sum[:16])
	return string(b[:])
}

// shardFor picks the shard of k from a seeded hash of (bucket, key), and
// returns the tag of k within it.
func (s *Store) shardFor(k mapKey) (*shard, uint32) {
	h := hashKey(s.seed, k.bucket, k.key)
	// With one shard the shift is 64, and a Go shift ≥ width yields 0.
	return &s.shards[h>>s.shift], uint32(h)
}

// expiry is the unix ms from which e can no longer matter: the end of its
// newest window for Fixed, the end of the window after it for Sliding
// (where the newest window is still the previous one).
func (e *entry) expiry() int64 {
	end := e.newest + 1
	if e.alg == Sliding {
		end++
	}
	return end * int64(e.scale)
}

// total is local + remote of window w, 0 when w is not held.
func (e *entry) total(w int64) int64 {
	if w != e.newest && w != e.newest-1 {
		return 0
	}
	return e.local[w&1] + e.remote[w&1]
}

// reset empties e and makes w its newest window. It keeps the listed mark
// (the entry is still on its shard's changed list) and bumps gen, which
// invalidates the peer counts recorded for e.
func (e *entry) reset(w int64) {
	*e = entry{newest: w, scale: e.scale, bucket: e.bucket, key: e.key, alg: e.alg, marks: e.marks & listed, gen: e.gen + 1}
}

// advance makes w the newest window, dropping windows older than w−1. It
// reports whether a Sliding entry's window before w holds local hits that
// Changes has not reported: they still weigh in every node's estimate, so
// the caller has them reported when shares are on.
func (e *entry) advance(w int64) (prevUnreported bool) {
	switch {
	case w == e.newest+1:
		prevUnreported = e.alg == Sliding && e.local[e.newest&1] > int64(e.pubNew)
		e.local[w&1], e.remote[w&1] = 0, 0
		e.marks &^= (changed | published) << (w & 1)
		e.newest = w
		e.pubNew, e.pubOld, e.pubAt = 0, 0, 0
	case w > e.newest+1:
		e.reset(w)
	}
	return prevUnreported
}

// prepare readies e for a local write in window w under lim and reports
// whether e's expiry may have decreased (the shard's minExpiry must then be
// lowered). A changed scale resets e. A window older than newest−1 means the
// local clock stepped back by a whole window or more: the local clock is
// authoritative, so e is reset to w.
func (e *entry) prepare(w int64, lim Limit) (expiryMayDrop, prevUnreported bool) {
	if int64(e.scale) != lim.ScaleMS {
		e.scale = uint32(lim.ScaleMS)
		e.reset(w)
		expiryMayDrop = true
	} else if w < e.newest-1 {
		e.reset(w)
		expiryMayDrop = true
	} else {
		prevUnreported = e.advance(w)
	}
	if e.alg != lim.Algorithm {
		e.alg = lim.Algorithm
		expiryMayDrop = true
	}
	e.limit = uint32(lim.Limit) // ≤ MaxLimit < 2^32
	return expiryMayDrop, prevUnreported
}

func satAdd(a, n int64) int64 {
	if n > MaxCount-a {
		return MaxCount
	}
	return a + n
}

// reservedSet is an immutable set of buckets, by id (ids are hashes,
// spread over the whole range: a map, not a slice by id).
type reservedSet struct {
	in  map[Bucket]bool
	any bool
}

func newReservedSet(bs []Bucket) *reservedSet {
	rs := &reservedSet{in: make(map[Bucket]bool, len(bs)), any: len(bs) > 0}
	for _, b := range bs {
		rs.in[b] = true
	}
	return rs
}

// SetReserved replaces the set of reserved buckets (Config.Reserved) for
// the keys inserted from now on; keys already held stay. Safe to call
// while the store is in use.
func (s *Store) SetReserved(bs []Bucket) { s.reserved.Store(newReservedSet(bs)) }

// room is how many keys sh may hold when a key of bucket is added.
func (s *Store) room(sh *shard, bucket Bucket) int {
	rs := s.reserved.Load()
	if !rs.any || rs.in[bucket] {
		return sh.capacity
	}
	return sh.capacity - sh.reserve
}

// DropBuckets deletes every entry of the given buckets, and the peer
// counts merged for them, so that a bucket a reload removed, or whose
// window or algorithm changed (it then has a new id), frees its keys at
// once. Each shard is locked in turn, for one pass over its entries; a
// Take racing the call may recreate a key of a dropped bucket, which then
// expires like any other. It returns how many entries it deleted.
func (s *Store) DropBuckets(bs []Bucket) int {
	if len(bs) == 0 {
		return 0
	}
	drop := newReservedSet(bs).in
	gone := func(b Bucket) bool { return drop[b] }
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.high = max(sh.high, sh.n)
		sh.peersHigh = max(sh.peersHigh, len(sh.peers))
		d := 0
		for j := range sh.entries {
			if e := &sh.entries[j]; e.scale != 0 && gone(e.bucket) {
				sh.remove(j) // marks 0: dropped from the changed list below
				d++
			}
		}
		for k := range sh.peers {
			if gone(k.bucket) {
				delete(sh.peers, k)
			}
		}
		if d > 0 {
			if len(sh.changed) > 0 {
				sh.compactChanged()
			}
			sh.rebuild()
		}
		sh.mu.Unlock()
		n += d
	}
	return n
}

// insert adds an entry for k (hash tag) in window w if the shard holds
// fewer than room keys, reclaiming the shard's expired entries first when
// it does not and something can have expired. It returns the entry's
// index, or noEntry, counting the refusal, when there is no room. The
// shard lock must be held and k must not be in the table.
func (sh *shard) insert(k mapKey, tag uint32, lim Limit, w, ms int64, room int) int {
	if sh.n >= room {
		if ms >= sh.minExpiry {
			sh.sweep(ms)
		}
		if sh.n >= room {
			sh.refused++
			return noEntry
		}
	}
	i := sh.add(tag, k.key, entry{newest: w, scale: uint32(lim.ScaleMS), bucket: k.bucket, alg: lim.Algorithm})
	if i == noEntry {
		sh.refused++
		return noEntry
	}
	sh.noteExpiry(&sh.entries[i])
	return i
}

func (sh *shard) noteExpiry(e *entry) {
	if x := e.expiry(); x < sh.minExpiry {
		sh.minExpiry = x
	}
}

// sweep deletes the entries expired at ms, makes minExpiry exact and
// rebuilds the arrays and maps that have shrunk far below their high-water
// mark. The shard lock must be held.
func (sh *shard) sweep(ms int64) int {
	sh.sweeps++
	sh.high = max(sh.high, sh.n)
	sh.peersHigh = max(sh.peersHigh, len(sh.peers))
	n := 0
	low := int64(math.MaxInt64)
	for j := range sh.entries {
		e := &sh.entries[j]
		if e.scale == 0 {
			continue
		}
		x := e.expiry()
		if ms >= x {
			if len(sh.peers) > 0 {
				delete(sh.peers, mapKey{e.bucket, sh.keyView(e.key)})
			}
			sh.remove(j) // marks 0: dropped from the changed list below
			n++
		} else if x < low {
			low = x
		}
	}
	sh.minExpiry = low
	if n > 0 && len(sh.changed) > 0 {
		sh.compactChanged()
	}
	if n > 0 {
		sh.rebuild()
	}
	return n
}

// A shard whose high-water mark is at least rebuildFloor entries is rebuilt
// once its live entries fall below 1/rebuildFactor of that mark.
const (
	rebuildFloor  = 1024
	rebuildFactor = 4
)

// rebuild copies the entries (slab, table and key arena), and peers, into
// fresh arrays and maps sized for their live entries when they hold fewer
// than a quarter of the most they held, so that what a flood of distinct
// keys grew becomes garbage instead of staying allocated until the process
// restarts. It also keeps sweeps cheap: a sweep iterates the whole slab.
// Short of that, it compacts the key arena once its dead bytes outweigh its
// live ones. The shard lock must be held, and the changed list must hold
// live entries only (compactChanged).
//
// The cost is amortised O(1) per deleted entry: a rebuild costs O(live)
// with live < high/4, and since the slab last held high entries more than
// high − live > 3 × live of them were deleted. The mark is reset to live
// at a rebuild, so those deletions all came after the previous one and pay
// for one rebuild only. The floor spares small shards, which cost little.
func (sh *shard) rebuild() {
	if sh.high >= rebuildFloor && sh.n < sh.high/rebuildFactor {
		sh.compactEntries()
		sh.high = sh.n
	} else {
		sh.reclaimArena()
	}
	if sh.peersHigh >= rebuildFloor && len(sh.peers) < sh.peersHigh/rebuildFactor {
		var p map[mapKey][]peerCount // nil until the next Merge, as in a new shard
		if len(sh.peers) > 0 {
			p = make(map[mapKey][]peerCount, len(sh.peers))
			maps.Copy(p, sh.peers)
		}
		sh.peers, sh.peersHigh = p, len(p)
	}
}

// admits reports whether one more hit is admitted given the totals of the
// previous and current windows, elapsed ms into the current one.
func admits(lim Limit, elapsed, prev, cur int64) bool {
	if cur >= lim.Limit {
		return false
	}
	if lim.Algorithm == Fixed || prev == 0 {
		return true
	}
	// prev×(scale−elapsed) + (cur+1)×scale ≤ limit×scale
	room := (lim.Limit - cur - 1) * lim.ScaleMS // < MaxProduct = 2^62
	d := lim.ScaleMS - elapsed                  // in [1, scale], < 2^32
	if prev < 1<<30 {
		return prev*d <= room // < 2^30 × 2^32 = 2^62
	}
	return prev <= room/d
}

// estimate is the count in effect: cur for Fixed, the weighted estimate
// rounded up for Sliding.
func estimate(lim Limit, elapsed, prev, cur int64) int64 {
	if lim.Algorithm == Fixed || prev == 0 {
		return cur
	}
	s, d := lim.ScaleMS, lim.ScaleMS-elapsed
	var w int64
	if prev < 1<<30 { // prev×d < 2^62, as in admits
		w = (prev*d + s - 1) / s
	} else {
		// prev×d may exceed 2^63: compute ceil(prev×d/s) in 128 bits. The
		// quotient is ≤ prev, so it fits and Div64 cannot panic.
		hi, lo := bits.Mul64(uint64(prev), uint64(d))
		lo, c := bits.Add64(lo, uint64(s-1), 0)
		q, _ := bits.Div64(hi+c, lo, uint64(s))
		w = int64(q)
	}
	return w + cur
}

// retryAfter is the time in ms until admits would hold if nothing else were
// counted, for a state where it does not hold now. ≥ 1.
func retryAfter(lim Limit, elapsed, prev, cur int64) int64 {
	s, l := lim.ScaleMS, lim.Limit
	toEnd := s - elapsed
	if lim.Algorithm == Fixed {
		return toEnd
	}
	// Still in this window: prev×(s−e) ≤ (l−cur−1)×s holds from
	// e = s − floor(room/prev) on.
	if cur < l && prev > 0 {
		if q := (l - cur - 1) * s / prev; q > 0 {
			return max(1, s-q-elapsed)
		}
	}
	// In the next window the current one becomes the previous and the new
	// one is empty: cur×(s−e) + s ≤ l×s holds from e = s − floor((l−1)×s/cur)
	// on; e = s (l = 1, or a huge cur) means the start of the window after.
	if cur == 0 {
		return toEnd
	}
	return toEnd + max(0, s-(l-1)*s/cur)
}

// result builds a Result for the state after the call.
func result(lim Limit, w, elapsed, prev, cur int64, allowed bool) Result {
	r := Result{
		Allowed: allowed,
		Count:   estimate(lim, elapsed, prev, cur),
		Window:  w,
		ResetMS: lim.ScaleMS - elapsed,
	}
	r.Remaining = max(0, lim.Limit-r.Count)
	if !allowed {
		r.RetryAfterMS = retryAfter(lim, elapsed, prev, cur)
	}
	return r
}

func overflow(lim Limit, w, elapsed int64) Result {
	reset := lim.ScaleMS - elapsed
	return Result{Overflow: true, Window: w, ResetMS: reset, RetryAfterMS: reset}
}

// Take admits and counts one hit for (bucket, key) if it is under lim at
// now, atomically. A denied hit is not counted. It creates the key if it is
// unknown (or reports Overflow when there is no room).
func (s *Store) Take(bucket Bucket, key string, lim Limit, now time.Time) Result {
	if !lim.valid() {
		return Result{}
	}
	ms := now.UnixMilli()
	w, el := windowSplit(ms, lim.ScaleMS)
	k := mapKey{bucket, s.storedKey(key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	i := sh.find(tag, bucket, k.key)
	if i == noEntry {
		if i = sh.insert(k, tag, lim, w, ms, s.room(sh, bucket)); i == noEntry {
			sh.mu.Unlock()
			return overflow(lim, w, el)
		}
	}
	e := &sh.entries[i]
	drop, prevUnreported := e.prepare(w, lim)
	if drop {
		sh.noteExpiry(e)
	}
	var prev int64
	if lim.Algorithm == Sliding {
		prev = e.total(w - 1)
	}
	cur := e.total(w)
	ok := admits(lim, el, prev, cur)
	near, shareRetry := false, int64(0)
	if s.track {
		sv := s.shares.Load()
		if prevUnreported && sv != 0 {
			sh.mark(i, k, w-1)
		}
		if sv != 0 && ok {
			ok, near, shareRetry = sh.takeShare(i, k, sv, lim, w, el, prev, 1)
		} else if ok {
			sh.mark(i, k, w)
			near = isNear(lim, el, prev, cur+1)
		}
		near = near || (prevUnreported && sv != 0)
	}
	if ok {
		e.local[w&1] = satAdd(e.local[w&1], 1)
		cur++
	}
	sh.mu.Unlock()
	if near {
		s.signalNear()
	}
	if s.obs != nil {
		s.obs.Hit(bucket, k.key, 1, ok, w, lim.ScaleMS, ms)
	}
	r := result(lim, w, el, prev, cur, ok)
	if shareRetry > 0 { // denied by this node's share, under the limit
		r.Remaining, r.RetryAfterMS = 0, shareRetry
	}
	return r
}

// Peek reports what Take would decide without counting anything. It never
// creates a key: an unknown key, or one counted in another scale, reads as
// 0 and is Allowed — unless the key is unknown and its shard has no room
// for a key of its bucket (see Config.Reserved) with nothing reclaimable,
// when Peek reports Overflow as Take would: a count
// for that key could not be kept, so "0" would be a guess. (That refusal
// is not counted in Refused: nothing was refused storage.)
//
// A Peek is a decision (a check of a budget spent from the response, a
// lockout): the Observer is told of a denial, as one denied hit.
func (s *Store) Peek(bucket Bucket, key string, lim Limit, now time.Time) Result {
	if !lim.valid() {
		return Result{}
	}
	k := mapKey{bucket, s.storedKey(key)}
	r := s.peek(k, lim, now)
	if s.obs != nil && !r.Allowed && !r.Overflow {
		s.obs.Hit(bucket, k.key, 1, false, r.Window, lim.ScaleMS, now.UnixMilli())
	}
	return r
}

// peek is Peek of the stored key k under a valid lim, not observed.
func (s *Store) peek(k mapKey, lim Limit, now time.Time) Result {
	bucket := k.bucket
	ms := now.UnixMilli()
	w, el := windowSplit(ms, lim.ScaleMS)
	sh, tag := s.shardFor(k)
	var prev, cur int64
	sh.mu.Lock()
	var e *entry
	if i := sh.find(tag, bucket, k.key); i != noEntry {
		e = &sh.entries[i]
	}
	if room := s.room(sh, bucket); e == nil && sh.n >= room {
		if ms >= sh.minExpiry {
			sh.sweep(ms)
		}
		if sh.n >= room {
			sh.mu.Unlock()
			return overflow(lim, w, el)
		}
	}
	if e != nil && int64(e.scale) == lim.ScaleMS {
		if lim.Algorithm == Sliding {
			prev = e.total(w - 1)
		}
		cur = e.total(w)
	}
	sh.mu.Unlock()
	return result(lim, w, el, prev, cur, admits(lim, el, prev, cur))
}

// Incr counts n hits for (bucket, key) at now unconditionally (failed logins
// are counted whether or not they were over the limit). Allowed reports
// whether one more hit would still be admitted afterwards. n ≤ 0 counts
// nothing and returns what Peek would (and is no decision to observe).
func (s *Store) Incr(bucket Bucket, key string, lim Limit, n int64, now time.Time) Result {
	if !lim.valid() {
		return Result{}
	}
	if n <= 0 {
		return s.peek(mapKey{bucket, s.storedKey(key)}, lim, now)
	}
	// The lookup repeats Take's on purpose: a shared helper is not inlined,
	// and Take is the hot path.
	ms := now.UnixMilli()
	w, el := windowSplit(ms, lim.ScaleMS)
	k := mapKey{bucket, s.storedKey(key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	i := sh.find(tag, bucket, k.key)
	if i == noEntry {
		if i = sh.insert(k, tag, lim, w, ms, s.room(sh, bucket)); i == noEntry {
			sh.mu.Unlock()
			return overflow(lim, w, el)
		}
	}
	e := &sh.entries[i]
	drop, prevUnreported := e.prepare(w, lim)
	if drop {
		sh.noteExpiry(e)
	}
	e.local[w&1] = satAdd(e.local[w&1], n)
	var prev int64
	if lim.Algorithm == Sliding {
		prev = e.total(w - 1)
	}
	cur := e.total(w)
	near := false
	if s.track {
		sh.mark(i, k, w)
		sv := s.shares.Load()
		if prevUnreported && sv != 0 {
			sh.mark(i, k, w-1)
		}
		// A charge is not admission: the peers, which admit and peek on
		// what they were told, learn of it as of a TakeN: it is published
		// once this node's unreported hits reach half its share, and at
		// once (Spent) where a TakeN would have been denied, their share
		// exceeded. Without shares, at once when it spent the budget.
		near = isNear(lim, el, prev, cur)
		before := admits(lim, el, prev, cur-n)
		spent := before && !admits(lim, el, prev, cur)
		if sv != 0 && w == e.newest {
			share, unreported := e.share(sv, lim, w, el, prev)
			near = near || 2*unreported >= share
			spent = spent || before && unreported > share
		}
		if spent {
			s.spent.Store(true)
			near = true
		}
	}
	sh.mu.Unlock()
	if near {
		s.signalNear()
	}
	if s.obs != nil {
		s.obs.Hit(bucket, k.key, n, true, w, lim.ScaleMS, ms) // spent, whatever it leaves
	}
	return result(lim, w, el, prev, cur, admits(lim, el, prev, cur))
}

// Release undoes one Take of (bucket, key) in window (Result.Window), for
// rolling back when a later bucket of the same request denies. It is a
// no-op when the window is no longer held, the key is unknown, its scale
// is not lim.ScaleMS, or nothing local is left to undo in that window.
func (s *Store) Release(bucket Bucket, key string, lim Limit, window int64) {
	s.ReleaseN(bucket, key, lim, window, 1)
}

// ReleaseN undoes one TakeN of n hits as Release undoes a Take: it takes
// back at most what is local in that window, never below 0; n ≤ 0 does
// nothing.
func (s *Store) ReleaseN(bucket Bucket, key string, lim Limit, window, n int64) {
	if !lim.valid() || n <= 0 {
		return
	}
	k := mapKey{bucket, s.storedKey(key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	if i := sh.find(tag, bucket, k.key); i != noEntry {
		if e := &sh.entries[i]; int64(e.scale) == lim.ScaleMS &&
			(window == e.newest || window == e.newest-1) && e.local[window&1] > 0 {
			e.local[window&1] -= min(n, e.local[window&1])
		}
	}
	sh.mu.Unlock()
}

// Sweep deletes the entries whose windows can no longer matter at now: a
// Fixed entry once its newest window has ended, a Sliding entry once the
// window after its newest has ended (until then the newest is the previous
// window of the estimate). It returns how many it removed. Each shard is
// locked in turn, for one pass over its entries.
func (s *Store) Sweep(now time.Time) int {
	ms := now.UnixMilli()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if ms >= sh.minExpiry {
			n += sh.sweep(ms)
		}
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of live keys (expired ones not yet swept included).
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// MemoryBytes returns the bytes the store's per-shard arrays hold
// (entries, table, key arena and the changed list, at their capacities):
// its memory, but for the per-peer counts of a cluster node, which live in
// maps. The arrays hold no pointers, so the garbage collector marks them
// without scanning them. Each shard is locked in turn, briefly.
func (s *Store) MemoryBytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += int64(cap(sh.entries))*int64(unsafe.Sizeof(entry{})) + int64(cap(sh.slots))*8 + int64(cap(sh.arena)) +
			int64(cap(sh.changed))*int64(unsafe.Sizeof(changeRef{})) + int64(cap(sh.keys))
		sh.mu.Unlock()
	}
	return n
}

// MaxKeys is the configured bound on live keys (Config.MaxKeys, default
// DefaultMaxKeys). The bound is enforced per shard, so refusals may begin
// slightly below it.
func (s *Store) MaxKeys() int { return s.maxKeys }

// ReservedKeys is the room within MaxKeys kept for the reserved buckets
// (Config.ReservedKeys with its default); 0 while no bucket is reserved.
func (s *Store) ReservedKeys() int {
	if !s.reserved.Load().any {
		return 0
	}
	return s.reservedKeys
}

// Refused returns how many new keys were refused at the key bound since
// the Store was created.
func (s *Store) Refused() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.refused
		sh.mu.Unlock()
	}
	return n
}

// Run sweeps the store every interval, using time.Now, until ctx is done;
// it then returns nil. It returns an error at once if interval is not
// positive.
func (s *Store) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("counter: sweep interval %v is not positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			s.Sweep(now)
		}
	}
}
