package wiring

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// BucketKey is what decides whether a bucket keeps its counter id across a
// reload: a bucket whose name, window, algorithm and reserve are all
// unchanged keeps its id and its counts; any change gives it a new id, and
// the old id's counts are dropped (counts made in another window or
// algorithm would mislead).
type BucketKey struct {
	Name      string
	ScaleMS   int64
	Algorithm counter.Algorithm
	Reserved  bool
}

// IDs allocates counter ids for a node's lifetime. The first
// configuration's buckets get 0..n−1 in order; later ones keep the id of
// an unchanged BucketKey and get other ids for the others: first an id
// dropped at least ReuseAfter ago (a check still in flight on the
// configuration that had it may write under it for a moment after the
// drop, never for that long), then a fresh one. So the ids in use stay
// below the buckets the configurations of the last ReuseAfter had, however
// many reloads come, and the tables indexed by id stay small. The caller
// drops the entries of Reused before the new configuration serves, so no
// late write of the previous bucket counts in the new one. Plan and
// Commit are separate so that a reload refused after planning changes
// nothing. Safe for concurrent use; the zero value is ready.
type IDs struct {
	mu      sync.Mutex
	next    counter.Bucket
	cur     map[BucketKey]counter.Bucket
	dropped []droppedID // by drop time
	gen     uint64      // commits so far
}

// ReuseAfter is how long a dropped id waits before another bucket gets it.
const ReuseAfter = 10 * time.Second

type droppedID struct {
	id counter.Bucket
	at time.Time
}

// Assignment is the ids of one configuration's buckets, planned by
// IDs.Plan.
type Assignment struct {
	// IDs are the buckets' ids, by index.
	IDs []counter.Bucket
	// Dropped are the ids of the current configuration that this one no
	// longer has: their counts are to be dropped once it serves.
	Dropped []counter.Bucket
	// Reused are ids of earlier configurations given to new buckets here:
	// their entries are to be dropped before it serves.
	Reused []counter.Bucket
	// Fresh are the ids this configuration gives to buckets the current
	// one does not have (Reused among them): if it never comes to serve,
	// what was counted under them meanwhile is to be dropped, since a
	// later plan may give them to other buckets.
	Fresh []counter.Bucket

	gen  uint64 // IDs.gen when planned
	next counter.Bucket
	keys map[BucketKey]counter.Bucket
}

// maxIDs bounds the ids in use at once: far above any configuration, far
// below where an id could wrap or a table by id grow large.
const maxIDs = 1 << 24

// Plan assigns ids to keys (one configuration, every name once) at now
// without changing a. Several parts of one generation (the ext_authz
// buckets, the RLS rules) are one call, their keys concatenated, so that
// no two share an id.
func (a *IDs) Plan(keys []BucketKey, now time.Time) (Assignment, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	as := Assignment{IDs: make([]counter.Bucket, len(keys)), gen: a.gen, next: a.next, keys: make(map[BucketKey]counter.Bucket, len(keys))}
	var free []counter.Bucket
	for _, d := range a.dropped {
		if now.Sub(d.at) >= ReuseAfter {
			free = append(free, d.id)
		}
	}
	slices.Sort(free)
	names := make(map[string]bool, len(keys))
	for i, k := range keys {
		if names[k.Name] {
			return Assignment{}, fmt.Errorf("bucket %q is named twice", k.Name)
		}
		names[k.Name] = true
		id, ok := a.cur[k]
		switch {
		case ok:
		case len(free) > 0:
			id, free = free[0], free[1:]
			as.Reused = append(as.Reused, id)
			as.Fresh = append(as.Fresh, id)
		default:
			if as.next >= maxIDs {
				return Assignment{}, fmt.Errorf("out of bucket ids: %d in use or dropped within %v", maxIDs, ReuseAfter)
			}
			id = as.next
			as.next++
			as.Fresh = append(as.Fresh, id)
		}
		as.IDs[i] = id
		as.keys[k] = id
	}
	for k, id := range a.cur {
		if _, kept := as.keys[k]; !kept {
			as.Dropped = append(as.Dropped, id)
		}
	}
	return as, nil
}

// Commit makes as the current configuration's ids, serving since now. It
// fails when another Commit came between as's Plan and this one. The ids
// as drops wait ReuseAfter from now, not from the plan: the configuration
// that had them serves until the swap, and its last calls are in flight
// until then.
func (a *IDs) Commit(as Assignment, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if as.gen != a.gen {
		return fmt.Errorf("bucket ids: the assignment was planned against an older configuration")
	}
	dropped := slices.DeleteFunc(a.dropped, func(d droppedID) bool { return slices.Contains(as.Reused, d.id) })
	for _, id := range as.Dropped {
		dropped = append(dropped, droppedID{id, now})
	}
	a.cur, a.next, a.dropped = as.keys, as.next, dropped
	a.gen++
	return nil
}
