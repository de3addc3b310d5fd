package wiring

import (
	"slices"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

var t0 = time.Unix(1_800_000_000, 0)

func plan(t *testing.T, a *IDs, at time.Time, keys ...BucketKey) Assignment {
	t.Helper()
	as, err := a.Plan(keys, at)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func commit(t *testing.T, a *IDs, as Assignment, at time.Time) {
	t.Helper()
	if err := a.Commit(as, at); err != nil {
		t.Fatal(err)
	}
}

func TestIDs(t *testing.T) {
	var a IDs
	x := BucketKey{Name: "x", ScaleMS: 1000}
	y := BucketKey{Name: "y", ScaleMS: 60_000, Algorithm: counter.Sliding}
	z := BucketKey{Name: "z", ScaleMS: 1000, Reserved: true}
	first := plan(t, &a, t0, x, y, z)
	if !slices.Equal(first.IDs, []counter.Bucket{0, 1, 2}) || len(first.Dropped) != 0 {
		t.Fatalf("first configuration: %v dropped %v, want 0..2 and none", first.IDs, first.Dropped)
	}
	commit(t, &a, first, t0)
	// Reordered, y's window changed, z's reserve dropped, w added.
	y2, z2 := y, z
	y2.ScaleMS, z2.Reserved = 1000, false
	w := BucketKey{Name: "w", ScaleMS: 1000}
	second := plan(t, &a, t0.Add(time.Second), w, z2, x, y2)
	if !slices.Equal(second.IDs, []counter.Bucket{3, 4, 0, 5}) || len(second.Reused) != 0 {
		t.Fatalf("second: %v reused %v, want x kept at 0 and fresh ids for the rest", second.IDs, second.Reused)
	}
	slices.Sort(second.Dropped)
	if !slices.Equal(second.Dropped, []counter.Bucket{1, 2}) {
		t.Fatalf("second dropped %v, want y's and z's old ids", second.Dropped)
	}
	// Planning changes nothing: a refused reload leaves the ids as they were.
	if again := plan(t, &a, t0.Add(time.Second), x, y, z); !slices.Equal(again.IDs, []counter.Bucket{0, 1, 2}) {
		t.Fatalf("after an uncommitted plan: %v", again.IDs)
	}
	commit(t, &a, second, t0.Add(time.Second))
	// A plan made before a commit cannot be committed after it.
	stale := plan(t, &a, t0.Add(2*time.Second), x)
	commit(t, &a, plan(t, &a, t0.Add(2*time.Second), x, w, y2, z2), t0.Add(2*time.Second))
	if err := a.Commit(stale, t0.Add(2*time.Second)); err == nil {
		t.Fatal("a stale plan committed")
	}
	// Within ReuseAfter of their drop, 1 and 2 are not given out again: y
	// back to its first window gets a fresh id.
	early := plan(t, &a, t0.Add(ReuseAfter), x, w, y2, z2, y.renamed("y1"))
	if early.IDs[4] != 6 || len(early.Reused) != 0 {
		t.Fatalf("a new bucket %v after %v: id %d reused %v, want a fresh 6", y, ReuseAfter, early.IDs[4], early.Reused)
	}
	// From then on they are, lowest first, and reported for dropping.
	late := plan(t, &a, t0.Add(time.Second+ReuseAfter), x, w, y2, z2, y.renamed("y1"), y.renamed("y2"))
	if late.IDs[4] != 1 || late.IDs[5] != 2 || !slices.Equal(late.Reused, []counter.Bucket{1, 2}) {
		t.Fatalf("after %v: ids %v reused %v, want 1 and 2 again", ReuseAfter, late.IDs, late.Reused)
	}
	commit(t, &a, late, t0.Add(time.Second+ReuseAfter))
	// Reused ids are no longer free.
	more := plan(t, &a, t0.Add(time.Hour), x, w, y2, z2, y.renamed("y1"), y.renamed("y2"), y.renamed("y3"))
	if more.IDs[6] != 6 || len(more.Reused) != 0 {
		t.Fatalf("ids %v reused %v: want a fresh 6", more.IDs, more.Reused)
	}
	if _, err := a.Plan([]BucketKey{x, x}, t0); err == nil {
		t.Fatal("a name given twice accepted")
	}
}

// Reloads that flip a configuration back and forth forever keep the ids
// in use bounded: dropped ids come back once ReuseAfter has passed.
func TestIDsBoundedUnderFlips(t *testing.T) {
	var a IDs
	keys := func(scale int64) []BucketKey {
		ks := make([]BucketKey, 100)
		for i := range ks {
			ks[i] = BucketKey{Name: string(rune('a'+i%26)) + string(rune('a'+i/26)), ScaleMS: scale}
		}
		return ks
	}
	now := t0
	var top counter.Bucket
	for i := range 2000 {
		as, err := a.Plan(keys(int64(1000+i%2)), now)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, &a, as, now)
		top = max(top, slices.Max(as.IDs))
		now = now.Add(time.Second)
	}
	// Ten seconds of flips at one a second hold at most 11 configurations'
	// ids: 1100.
	if top >= 1200 {
		t.Fatalf("ids reached %d after 2000 flips of 100 buckets", top)
	}
}

func (k BucketKey) renamed(name string) BucketKey { k.Name = name; return k }

// A dropped id waits ReuseAfter from the commit that dropped it — when its
// bucket stopped serving — however long before that it was planned.
func TestDroppedIDsWaitFromTheCommit(t *testing.T) {
	var a IDs
	x, y := BucketKey{Name: "x", ScaleMS: 1000}, BucketKey{Name: "y", ScaleMS: 1000}
	commit(t, &a, plan(t, &a, t0, x, y), t0)
	drop := plan(t, &a, t0, x)
	commit(t, &a, drop, t0.Add(time.Minute)) // the swap waited a minute
	early := plan(t, &a, t0.Add(time.Minute+ReuseAfter-time.Millisecond), x, y.renamed("y2"))
	if len(early.Reused) != 0 || !slices.Equal(early.Fresh, []counter.Bucket{2}) {
		t.Fatalf("within %v of the commit: reused %v fresh %v, want a fresh 2", ReuseAfter, early.Reused, early.Fresh)
	}
	late := plan(t, &a, t0.Add(time.Minute+ReuseAfter), x, y.renamed("y2"))
	if !slices.Equal(late.Reused, []counter.Bucket{1}) || !slices.Equal(late.Fresh, []counter.Bucket{1}) {
		t.Fatalf("%v after the commit: reused %v fresh %v, want 1", ReuseAfter, late.Reused, late.Fresh)
	}
}
