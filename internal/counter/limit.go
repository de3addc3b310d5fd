package counter

import (
	"errors"
	"fmt"
)

// Algorithm selects how a window is counted.
type Algorithm uint8

const (
	// Fixed counts hits in the wall-clock-aligned window
	// now_ms / ScaleMS; the count resets at each window boundary.
	Fixed Algorithm = iota
	// Sliding estimates previous × (1 − elapsed/scale) + current from the
	// same two fixed windows.
	Sliding
)

// String returns "fixed" or "sliding" (or "Algorithm(n)" for other values).
func (a Algorithm) String() string {
	switch a {
	case Fixed:
		return "fixed"
	case Sliding:
		return "sliding"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Bucket identifies a bucket in the store: any 32-bit value (package
// snapshot derives it from what makes a bucket's counts comparable, so a
// reload keeps the id of every bucket whose name, window, algorithm and
// reserve are unchanged). Nodes name buckets to each other by name, never
// by id. Counts of one key in different buckets never mix.
type Bucket uint32

// Bounds of a Limit. They are chosen so that every product the store
// computes stays far from int64 overflow: Limit×ScaleMS ≤ MaxProduct =
// 2^62, and previous×(ScaleMS−elapsed) is either computed below 2^62
// (previous < 2^30, ScaleMS < 2^32) or compared through a division.
const (
	// MaxLimit is the largest Limit.Limit: 2^31−1 hits per window (in
	// windows of at most MaxProduct/MaxLimit ms, about 24.8 days; longer
	// windows allow MaxLimitFor(ScaleMS)).
	MaxLimit = 1<<31 - 1
	// MaxScaleMS is the largest Limit.ScaleMS: 2^32−1 ms, about 49.7 days,
	// so that a 30-day month fits and the entry keeps its scale in 32
	// bits. A year does not fit.
	MaxScaleMS = 1<<32 - 1
	// MaxProduct bounds Limit×ScaleMS.
	MaxProduct = 1 << 62
	// MaxCount is where stored counts saturate (each of local and remote;
	// their sum saturates at 2×MaxCount). It is far above any Limit, so
	// saturation never changes a decision, and far below int64 overflow.
	MaxCount = 1 << 61
)

// ErrInvalidLimit is wrapped by [Limit.Validate] for an out-of-range Limit.
var ErrInvalidLimit = errors.New("counter: invalid limit")

// ErrInvalidConfig is wrapped by [New] for an invalid Config.
var ErrInvalidConfig = errors.New("counter: invalid config")

// Limit is what one bucket (or one tenant override of it) allows.
//
// The zero Limit is invalid. Store methods given an invalid Limit count
// nothing and return the zero Result (Allowed false); callers validate
// limits when they load them, with [Limit.Validate].
type Limit struct {
	Limit     int64 // hits admitted per window, 1 ≤ Limit ≤ MaxLimitFor(ScaleMS)
	ScaleMS   int64 // window length in ms, 1 ≤ ScaleMS ≤ MaxScaleMS
	Algorithm Algorithm
}

// Validate reports whether l is within bounds; the error wraps
// [ErrInvalidLimit].
func (l Limit) Validate() error {
	if l.Limit < 1 || l.Limit > MaxLimit {
		return fmt.Errorf("%w: limit %d hits per window is outside [1, %d]", ErrInvalidLimit, l.Limit, MaxLimit)
	}
	if l.ScaleMS < 1 || l.ScaleMS > MaxScaleMS {
		return fmt.Errorf("%w: scale %d ms is outside [1, %d]", ErrInvalidLimit, l.ScaleMS, MaxScaleMS)
	}
	if l.Limit > MaxProduct/l.ScaleMS {
		return fmt.Errorf("%w: limit %d hits per window of %d ms is above the most such a window can count, %d", ErrInvalidLimit, l.Limit, l.ScaleMS, MaxLimitFor(l.ScaleMS))
	}
	if l.Algorithm != Fixed && l.Algorithm != Sliding {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, uint8(l.Algorithm))
	}
	return nil
}

// MaxLimitFor is the largest Limit.Limit in windows of scaleMS (1 ≤
// scaleMS ≤ MaxScaleMS): MaxLimit, or less for windows longer than about
// 24.8 days so that Limit×ScaleMS ≤ MaxProduct.
func MaxLimitFor(scaleMS int64) int64 {
	if scaleMS < 1 {
		return MaxLimit
	}
	return min(MaxLimit, MaxProduct/scaleMS)
}

// valid is Validate without building an error, for the hot path.
func (l Limit) valid() bool {
	return l.Limit >= 1 && l.Limit <= MaxLimit &&
		l.ScaleMS >= 1 && l.ScaleMS <= MaxScaleMS &&
		l.Limit <= MaxProduct/l.ScaleMS &&
		l.Algorithm <= Sliding
}

// Result is the outcome of Take, Peek or Incr.
type Result struct {
	// Allowed: for Take, the hit was admitted and counted; for Peek, one
	// more hit would be admitted; for Incr, one more hit would still be
	// admitted after counting. Allowed is equivalent to Remaining > 0.
	// A Take or TakeN denied by this node's budget share under the limit
	// (see Store.SetShares) reports Remaining 0 and a RetryAfterMS of the
	// time until the share grows.
	Allowed bool
	// Overflow: the key was not tracked because its shard is at the key
	// bound with nothing reclaimable. Allowed is false, Count and Remaining
	// are 0, RetryAfterMS is ResetMS; the caller decides what to do. A
	// refusal by Take, Incr or Merge is counted in Store.Refused; Peek of an
	// untracked key in a full shard reports Overflow too (its count could
	// not be kept) without counting a refusal.
	Overflow bool
	// Count is the count in effect after the call: the current window's
	// total for Fixed, the weighted estimate rounded up for Sliding.
	Count int64
	// Remaining is max(0, Limit − Count).
	Remaining int64
	// Window is the current window number, now_ms / ScaleMS. Pass it to
	// Release to undo a Take.
	Window int64
	// ResetMS is the time until the current window ends, ≥ 1.
	ResetMS int64
	// RetryAfterMS is 0 when Allowed; otherwise the time until a hit would
	// be admitted if nothing else were counted meanwhile, ≥ 1. For Fixed
	// it is ResetMS; for Sliding it is when the estimate has fallen enough,
	// which may be in the next window or, for Limit 1, the one after.
	RetryAfterMS int64
}

// Config configures a Store. A zero field means its default.
type Config struct {
	// MaxKeys bounds the number of live keys over all shards;
	// 0 means 1_000_000.
	MaxKeys int
	// Shards is the number of shards, rounded up to a power of two,
	// at most 65536; 0 means 64.
	Shards int
	// MaxKeyBytes: longer keys are stored as a 33-byte digest;
	// 0 means 128.
	MaxKeyBytes int
	// Track makes the store note which of this node's own counts changed,
	// for [Store.Changes] (replication turns it on). Off, Changes returns
	// nothing and Take and Incr do no extra work.
	Track bool
	// MaxPeersPerKey bounds how many peers' counts [Store.Merge] keeps per
	// key; 0 means 64.
	MaxPeersPerKey int
	// Reserved are the buckets whose keys may fill the whole of MaxKeys;
	// the keys of every other bucket may fill only MaxKeys − ReservedKeys
	// (each shard keeps its share of the reserve). So a flood of distinct
	// keys in other buckets never leaves a reserved bucket without room:
	// the buckets that fail closed when the table is full (failure
	// counting) are full only when their own keys filled the reserve.
	Reserved []Bucket
	// ReservedKeys is the room kept for the Reserved buckets, below
	// MaxKeys; 0 means MaxKeys/10. It applies while a bucket is reserved
	// (Config.Reserved, or later Store.SetReserved).
	ReservedKeys int
	// Observer, when set, is told of every decision Take, TakeN and Incr
	// make; nil: none, at the cost of one nil check.
	Observer Observer
}

// Observer is told of the decisions on (bucket, key): n hits, admitted
// or denied, counted in window (of scaleMS ms) at ms, unix ms. The key is
// the form the store holds (a digest when too long) and is only valid for
// the call. Take and TakeN report their decision; Incr, which counts
// unconditionally (a cost or a failure reported after the response),
// reports its hits as admitted: they were spent; Peek reports a denial
// as one denied hit (a check refused on a budget Incr spends). An
// overflow (nothing counted) and a Peek that allows are not reported.
// Hit is called after the shard's lock is released, from the goroutine
// of the decision, and must be safe for concurrent use.
type Observer interface {
	Hit(bucket Bucket, key string, n int64, allowed bool, window, scaleMS, ms int64)
}

// Defaults for a zero Config field.
const (
	DefaultMaxKeys        = 1_000_000
	DefaultShards         = 64
	DefaultMaxKeyBytes    = 128
	DefaultMaxPeersPerKey = 64
	maxShards             = 1 << 16
	maxPeersPerKey        = 1 << 16
)

// withDefaults validates cfg and fills in defaults.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.MaxKeys < 0 {
		return cfg, fmt.Errorf("%w: MaxKeys %d is negative", ErrInvalidConfig, cfg.MaxKeys)
	}
	if cfg.Shards < 0 || cfg.Shards > maxShards {
		return cfg, fmt.Errorf("%w: Shards %d is outside [0, %d]", ErrInvalidConfig, cfg.Shards, maxShards)
	}
	if cfg.MaxKeyBytes < 0 {
		return cfg, fmt.Errorf("%w: MaxKeyBytes %d is negative", ErrInvalidConfig, cfg.MaxKeyBytes)
	}
	if cfg.MaxPeersPerKey < 0 || cfg.MaxPeersPerKey > maxPeersPerKey {
		return cfg, fmt.Errorf("%w: MaxPeersPerKey %d is outside [0, %d]", ErrInvalidConfig, cfg.MaxPeersPerKey, maxPeersPerKey)
	}
	if cfg.MaxPeersPerKey == 0 {
		cfg.MaxPeersPerKey = DefaultMaxPeersPerKey
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.ReservedKeys < 0 || cfg.ReservedKeys >= cfg.MaxKeys {
		return cfg, fmt.Errorf("%w: ReservedKeys %d is outside [0, MaxKeys %d)", ErrInvalidConfig, cfg.ReservedKeys, cfg.MaxKeys)
	}
	if cfg.ReservedKeys == 0 {
		cfg.ReservedKeys = cfg.MaxKeys / 10
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.MaxKeyBytes == 0 {
		cfg.MaxKeyBytes = DefaultMaxKeyBytes
	}
	n := 1
	for n < cfg.Shards {
		n <<= 1
	}
	cfg.Shards = n
	return cfg, nil
}
