package wiring

import (
	"slices"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

func plan(t *testing.T, a *IDs, keys ...BucketKey) Assignment {
	t.Helper()
	as, err := a.Plan(keys)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func TestIDs(t *testing.T) {
	var a IDs
	x := BucketKey{Name: "x", ScaleMS: 1000}
	y := BucketKey{Name: "y", ScaleMS: 60_000, Algorithm: counter.Sliding}
	z := BucketKey{Name: "z", ScaleMS: 1000, Reserved: true}
	first := plan(t, &a, x, y, z)
	if !slices.Equal(first.IDs, []counter.Bucket{0, 1, 2}) || len(first.Dropped) != 0 {
		t.Fatalf("first configuration: %v dropped %v, want 0..2 and none", first.IDs, first.Dropped)
	}
	if err := a.Commit(first); err != nil {
		t.Fatal(err)
	}
	// Reordered, y's window changed, z's reserve dropped, w added.
	y2, z2 := y, z
	y2.ScaleMS, z2.Reserved = 1000, false
	w := BucketKey{Name: "w", ScaleMS: 1000}
	second := plan(t, &a, w, z2, x, y2)
	if !slices.Equal(second.IDs, []counter.Bucket{3, 4, 0, 5}) {
		t.Fatalf("second: %v, want x kept at 0 and fresh ids for the rest", second.IDs)
	}
	slices.Sort(second.Dropped)
	if !slices.Equal(second.Dropped, []counter.Bucket{1, 2}) {
		t.Fatalf("second dropped %v, want y's and z's old ids", second.Dropped)
	}
	// Planning changes nothing: a refused reload leaves the ids as they were.
	if again := plan(t, &a, x, y, z); !slices.Equal(again.IDs, []counter.Bucket{0, 1, 2}) {
		t.Fatalf("after an uncommitted plan: %v", again.IDs)
	}
	if err := a.Commit(second); err != nil {
		t.Fatal(err)
	}
	// A plan made before a commit cannot be committed after it.
	stale := plan(t, &a, x)
	if err := a.Commit(plan(t, &a, x, w)); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(stale); err == nil {
		t.Fatal("a stale plan committed")
	}
	// Ids are never reused: y back to its first window gets a new one.
	if third := plan(t, &a, x, y); third.IDs[1] != 6 {
		t.Fatalf("y returned: id %d, want 6", third.IDs[1])
	}
	if _, err := a.Plan([]BucketKey{x, x}); err == nil {
		t.Fatal("a name given twice accepted")
	}
}
