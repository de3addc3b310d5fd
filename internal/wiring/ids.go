package wiring

import (
	"fmt"
	"sync"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
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
// an unchanged BucketKey and get fresh ids, never reused, for the others.
// Plan and Commit are separate so that a reload refused after planning
// changes nothing. Safe for concurrent use; the zero value is ready.
type IDs struct {
	mu   sync.Mutex
	next counter.Bucket
	cur  map[BucketKey]counter.Bucket
	gen  uint64 // commits so far
}

// Assignment is the ids of one configuration's buckets, planned by
// IDs.Plan.
type Assignment struct {
	// IDs are the buckets' ids, by index.
	IDs []counter.Bucket
	// Dropped are the ids of the current configuration that this one no
	// longer has: their counts are to be dropped once it serves.
	Dropped []counter.Bucket

	gen  uint64 // IDs.gen when planned
	next counter.Bucket
	keys map[BucketKey]counter.Bucket
}

// maxIDs bounds the ids a node hands out over its life: far above any
// configuration (every reload that changes every bucket of a large one
// takes its size), far below where an id could wrap.
const maxIDs = 1 << 24

// Plan assigns ids to keys (one configuration, every name once) without
// changing a. Several parts of one generation (the ext_authz buckets, the
// RLS rules) are one call, their keys concatenated, so that no two share
// an id.
func (a *IDs) Plan(keys []BucketKey) (Assignment, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	as := Assignment{IDs: make([]counter.Bucket, len(keys)), gen: a.gen, next: a.next, keys: make(map[BucketKey]counter.Bucket, len(keys))}
	names := make(map[string]bool, len(keys))
	for i, k := range keys {
		if names[k.Name] {
			return Assignment{}, fmt.Errorf("bucket %q is named twice", k.Name)
		}
		names[k.Name] = true
		id, ok := a.cur[k]
		if !ok {
			if as.next >= maxIDs {
				return Assignment{}, fmt.Errorf("out of bucket ids after %d reloads' changes: restart the node", maxIDs)
			}
			id = as.next
			as.next++
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

// Commit makes as the current configuration's ids. It fails when another
// Commit came between as's Plan and this one.
func (a *IDs) Commit(as Assignment) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if as.gen != a.gen {
		return fmt.Errorf("bucket ids: the assignment was planned against an older configuration")
	}
	a.cur, a.next = as.keys, as.next
	a.gen++
	return nil
}
