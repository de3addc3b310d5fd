package top

import (
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// EpochMS is the length of one epoch of the last minute, and Epochs how
// many are kept: the current one and the six before it.
const (
	EpochMS = 10_000
	Epochs  = 7
)

// Defaults for a zero Config field, and the largest values allowed.
const (
	DefaultK           = 16
	DefaultBuckets     = 256
	DefaultMaxKeyBytes = 64
	MaxK               = 1024
	MaxBuckets         = 1 << 16
	MaxMaxKeyBytes     = 255
	maxShards          = 64
)

// Config sizes a Sketch. A zero field means its default.
type Config struct {
	// K is the entries of each summary: a key with more than 1/K of a
	// bucket's hits in a period is always listed. Default 16, at most
	// MaxK.
	K int
	// Buckets bounds the buckets recorded at once (any ids; a bucket
	// beyond them is not recorded until Forget frees room). Default 256,
	// at most MaxBuckets.
	Buckets int
	// MaxKeyBytes bounds the bytes kept of a key; a longer key is kept as
	// a prefix, "~" and 8 hex digits of a hash of the whole key, in
	// MaxKeyBytes bytes. Default 64, at least 16, at most MaxMaxKeyBytes.
	MaxKeyBytes int
	// Shards is the number of independently locked copies, rounded up to
	// a power of two; default twice GOMAXPROCS, at most 64.
	Shards int
}

func (c Config) withDefaults() (Config, error) {
	if c.K == 0 {
		c.K = DefaultK
	}
	if c.Buckets == 0 {
		c.Buckets = DefaultBuckets
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if c.Shards == 0 {
		c.Shards = min(2*runtime.GOMAXPROCS(0), maxShards)
	}
	switch {
	case c.K < 1 || c.K > MaxK:
		return c, fmt.Errorf("top: K %d is outside [1, %d]", c.K, MaxK)
	case c.Buckets < 1 || c.Buckets > MaxBuckets:
		return c, fmt.Errorf("top: Buckets %d is outside [1, %d]", c.Buckets, MaxBuckets)
	case c.MaxKeyBytes < 16 || c.MaxKeyBytes > MaxMaxKeyBytes:
		return c, fmt.Errorf("top: MaxKeyBytes %d is outside [16, %d]", c.MaxKeyBytes, MaxMaxKeyBytes)
	case c.Shards < 1 || c.Shards > maxShards:
		return c, fmt.Errorf("top: Shards %d is outside [1, %d]", c.Shards, maxShards)
	}
	c.Shards = 1 << bits.Len(uint(c.Shards-1))
	return c, nil
}

// Sketch holds the top keys of every bucket. It is safe for concurrent
// use; a nil *Sketch records nothing and reads empty. Create one with New.
type Sketch struct {
	shards     []shard
	mask       uint32
	k          int
	maxKey     int
	maxBuckets int // per shard
	seed       maphash.Seed
}

// shard is one independently locked copy of every bucket's summaries,
// padded so that neighbouring shards' locks do not share a cache line.
type shard struct {
	mu sync.Mutex
	b  map[counter.Bucket]*bucketSums // by bucket id, from the bucket's first hit here
	_  [128 - unsafe.Sizeof(sync.Mutex{}) - unsafe.Sizeof(map[counter.Bucket]*bucketSums{})]byte
}

// bucketSums is one shard's summaries of one bucket, by outcome
// (0 admitted, 1 denied): per epoch of the last minute (ring slot
// epoch%Epochs holds epoch[slot]) and for the newest window it counted,
// [winStart, winStart+winScale) in unix ms.
type bucketSums struct {
	epoch    [Epochs]int64
	ep       [Epochs][2]summary
	winStart int64
	winScale int64
	win      [2]summary
}

// summary is a Space-Saving summary of at most k keys, each field of the
// entries in an array of its own so that the lookup scans only hashes and
// the eviction only counts. The counts of its entries sum to total.
type summary struct {
	n     int
	total uint64
	h     []uint64 // len k: the key's hash
	count []uint64 // hits counted for the key, an overestimate by at most err
	err   []uint64 // the count the entry had when this key took it over
	klen  []uint8
	keys  []byte // k × maxKey: entry i's key is keys[i*maxKey:][:klen[i]]
}

// New returns an empty Sketch, or an error for a field out of range.
func New(cfg Config) (*Sketch, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Sketch{shards: make([]shard, cfg.Shards), mask: uint32(cfg.Shards - 1), k: cfg.K, maxKey: cfg.MaxKeyBytes, maxBuckets: cfg.Buckets, seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].b = make(map[counter.Bucket]*bucketSums)
	}
	return s, nil
}

func (s *Sketch) newBucketSums() *bucketSums {
	const n = 2 * (Epochs + 1)
	k := s.k
	words := make([]uint64, 3*n*k)
	klens := make([]uint8, n*k)
	keys := make([]byte, n*k*s.maxKey)
	bs := &bucketSums{winStart: math.MinInt64}
	i := 0
	next := func() summary {
		w := words[3*i*k : 3*(i+1)*k]
		sm := summary{h: w[:k:k], count: w[k : 2*k : 2*k], err: w[2*k:], klen: klens[i*k : (i+1)*k : (i+1)*k],
			keys: keys[i*k*s.maxKey : (i+1)*k*s.maxKey : (i+1)*k*s.maxKey]}
		i++
		return sm
	}
	for j := range bs.ep {
		bs.epoch[j] = math.MinInt64
		bs.ep[j] = [2]summary{next(), next()}
	}
	bs.win = [2]summary{next(), next()}
	return bs
}

// bucketBytes is the memory of one bucketSums.
func (s *Sketch) bucketBytes() int64 {
	const n = 2 * (Epochs + 1)
	return int64(unsafe.Sizeof(bucketSums{})) + int64(n*s.k)*(3*8+1+int64(s.maxKey))
}

// Hit records n hits of key in bucket at ms (unix ms), admitted or
// denied, counted in window number window of scaleMS ms (as the counter
// numbers them). n ≤ 0, a bucket beyond Config.Buckets or a nil Sketch
// records nothing. It does not allocate once the bucket's summaries exist in the
// shard it picks, and does not retain key.
func (s *Sketch) Hit(bucket counter.Bucket, key string, n int64, allowed bool, window, scaleMS, ms int64) {
	if s == nil || n <= 0 {
		return
	}
	var buf [MaxMaxKeyBytes]byte
	kb := s.keyBytes(&buf, key)
	h := maphash.Bytes(s.seed, kb)
	o := 1
	if allowed {
		o = 0
	}
	start := rand.Uint32()
	var sh *shard
	for i := range uint32(len(s.shards)) {
		if c := &s.shards[(start+i)&s.mask]; c.mu.TryLock() {
			sh = c
			break
		}
	}
	if sh == nil {
		sh = &s.shards[start&s.mask]
		sh.mu.Lock()
	}
	bs := sh.b[bucket]
	if bs == nil {
		if len(sh.b) >= s.maxBuckets {
			sh.mu.Unlock()
			return
		}
		bs = s.newBucketSums()
		sh.b[bucket] = bs
	}
	e := counter.WindowOf(ms, EpochMS)
	slot := int(((e % Epochs) + Epochs) % Epochs)
	if bs.epoch[slot] != e {
		bs.ep[slot][0].reset()
		bs.ep[slot][1].reset()
		bs.epoch[slot] = e
	}
	c := uint64(n)
	bs.ep[slot][o].add(kb, h, c, s.maxKey)
	if ws := window * scaleMS; ws > bs.winStart || (ws == bs.winStart && scaleMS != bs.winScale) {
		bs.win[0].reset()
		bs.win[1].reset()
		bs.winStart, bs.winScale = ws, scaleMS
	}
	if window*scaleMS == bs.winStart && scaleMS == bs.winScale {
		bs.win[o].add(kb, h, c, s.maxKey)
	}
	sh.mu.Unlock()
}

// keyBytes writes the form of key the sketch keeps into buf and returns
// it: key itself when it fits in maxKey bytes, else its first maxKey−9
// bytes, "~" and 8 hex digits of its FNV-1a hash (stable across nodes, so
// that a cluster's tops merge).
func (s *Sketch) keyBytes(buf *[MaxMaxKeyBytes]byte, key string) []byte {
	if len(key) <= s.maxKey {
		return buf[:copy(buf[:], key)]
	}
	p := s.maxKey - 9
	copy(buf[:p], key)
	f := fnv.New32a()
	_, _ = f.Write(unsafe.Slice(unsafe.StringData(key), len(key)))
	sum := f.Sum32()
	buf[p] = '~'
	const hex = "0123456789abcdef"
	for i := range 8 {
		buf[p+1+i] = hex[(sum>>(28-4*i))&0xf]
	}
	return buf[:s.maxKey]
}

func (sm *summary) reset() { sm.n, sm.total = 0, 0 }

func (sm *summary) key(i, maxKey int) []byte {
	return sm.keys[i*maxKey : i*maxKey+int(sm.klen[i])]
}

// add counts c hits of kb (hash h): the Space-Saving update. A listed key
// gains c; an unlisted one takes a free entry, or the entry of the
// smallest count, keeping that count as its error.
func (sm *summary) add(kb []byte, h, c uint64, maxKey int) {
	sm.total = satAdd(sm.total, c)
	for i, x := range sm.h[:sm.n] {
		if x == h && string(sm.key(i, maxKey)) == string(kb) {
			sm.count[i] = satAdd(sm.count[i], c)
			return
		}
	}
	i, floor := sm.n, uint64(0)
	if sm.n < len(sm.h) {
		sm.n++
	} else {
		i, floor = 0, sm.count[0]
		for j, x := range sm.count[:sm.n] {
			if x < floor {
				i, floor = j, x
			}
		}
	}
	sm.h[i], sm.count[i], sm.err[i], sm.klen[i] = h, satAdd(floor, c), floor, uint8(len(kb))
	copy(sm.keys[i*maxKey:], kb)
}

// min is the smallest count of a full summary, 0 of one with room: the
// most hits any key it does not list can have had.
func (sm *summary) min() uint64 {
	if sm.n < len(sm.h) {
		return 0
	}
	return slices.Min(sm.count[:sm.n])
}

func satAdd(a, b uint64) uint64 {
	if s, c := bits.Add64(a, b, 0); c == 0 {
		return s
	}
	return math.MaxUint64
}

// mapEntryBytes is what a shard's map holds per bucket beside its
// summaries: the id, the pointer and the map's overhead, roughly.
const mapEntryBytes = 24

// Forget drops what the sketch holds of the buckets ids (a reload removed
// them), so that their room serves others.
func (s *Sketch) Forget(ids []counter.Bucket) {
	if s == nil || len(ids) == 0 {
		return
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, id := range ids {
			delete(sh.b, id)
		}
		sh.mu.Unlock()
	}
}

// MemoryBytes is the memory the sketch holds: its shards and the
// summaries of the buckets that have been hit, which are fixed in size.
func (s *Sketch) MemoryBytes() int64 {
	if s == nil {
		return 0
	}
	n := int64(len(s.shards)) * int64(unsafe.Sizeof(shard{}))
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += int64(len(sh.b)) * (mapEntryBytes + s.bucketBytes())
		sh.mu.Unlock()
	}
	return n
}
