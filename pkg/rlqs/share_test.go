package rlqs

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

func TestShareOf(t *testing.T) {
	for _, tc := range []struct {
		remaining, n int64
		want         []int64 // by rank
	}{
		{100, 1, []int64{100}},
		{100, 2, []int64{50, 50}},
		{100, 3, []int64{34, 33, 33}},
		{2, 3, []int64{1, 1, 0}},
		{0, 2, []int64{0, 0}},
		{-5, 2, []int64{0, 0}},
		{7, 0, nil},
	} {
		var sum int64
		for rank, w := range tc.want {
			got := shareOf(tc.remaining, tc.n, int64(rank))
			if got != w {
				t.Errorf("shareOf(%d, %d, %d) = %d, want %d", tc.remaining, tc.n, rank, got, w)
			}
			sum += got
		}
		if tc.remaining > 0 && tc.n > 0 && sum != tc.remaining {
			t.Errorf("shares of %d over %d add up to %d", tc.remaining, tc.n, sum)
		}
		// Ranks outside [0, n) (remote participants) get nothing here.
		if s := shareOf(tc.remaining, tc.n, tc.n); s != 0 {
			t.Errorf("rank n got %d", s)
		}
		if s := shareOf(tc.remaining, tc.n, -1); s != 0 {
			t.Errorf("rank -1 got %d", s)
		}
	}
}

func TestRemoteEstimate(t *testing.T) {
	for _, tc := range []struct {
		local, total, participants, want int64
	}{
		{10, 10, 1, 0},      // all of it ours
		{10, 5, 1, 0},       // a peer's count arrived late: never negative
		{10, 20, 1, 1},      // a peer spent as much as we did
		{10, 30, 1, 2},      // two peers' worth
		{10, 31, 1, 3},      // rounded up
		{10, 20, 2, 2},      // two here, as much elsewhere
		{0, 5, 1, 1},        // we spent nothing yet, someone did
		{1, 1 << 40, 1, 64}, // capped
		{1, 1 << 62, 1 << 20, 64},
	} {
		if got := remoteEstimate(tc.local, tc.total, tc.participants); got != tc.want {
			t.Errorf("remoteEstimate(%d, %d, %d) = %d, want %d", tc.local, tc.total, tc.participants, got, tc.want)
		}
	}
}

// The registry's split over fixed instants: ranks follow the order the
// streams opened, reports accumulate per window, and the previous
// window's remote estimate carries into the next.
func TestRegistrySplit(t *testing.T) {
	r := newRegistry()
	k := groupKey{bucket: counter.Bucket(3), key: "acme"}
	a := &tracked{stream: 1, seq: 1}
	b := &tracked{stream: 2, seq: 1}
	r.join(k, b)
	r.join(k, a)
	if rank, n := r.split(k, a, 100, 1000, 5, 5); rank != 0 || n != 2 {
		t.Errorf("a: rank %d of %d, want 0 of 2", rank, n)
	}
	if rank, n := r.split(k, b, 100, 1000, 5, 10); rank != 1 || n != 2 {
		t.Errorf("b: rank %d of %d, want 1 of 2", rank, n)
	}
	// 10 of ours, 30 in all: another node spent twice as much.
	if _, n := r.split(k, a, 100, 1000, 0, 30); n != 2+4 {
		t.Errorf("with peers spending 20: %d participants, want 6", n)
	}
	// The next window starts with no peer counts yet: the estimate holds.
	if _, n := r.split(k, a, 101, 1000, 1, 1); n != 6 {
		t.Errorf("next window: %d participants, want the carried 6", n)
	}
	// Two windows on, it is gone.
	if _, n := r.split(k, a, 103, 1000, 1, 1); n != 2 {
		t.Errorf("two windows on: %d participants, want 2", n)
	}
	// A new window length (a reload) starts over.
	if _, n := r.split(k, a, 103, 60000, 0, 50); n != 2+1 {
		t.Errorf("after a scale change: %d participants, want 3", n)
	}
	r.leave(k, b)
	if rank, n := r.split(k, a, 103, 60000, 0, 0); rank != 0 || n != 1+1 {
		t.Errorf("after b left: rank %d of %d", rank, n)
	}
	r.leave(k, a)
	// Idle, it keeps this node's usage of the window for whoever comes back.
	if len(r.groups) != 1 || r.idle != 1 {
		t.Fatalf("groups %d, idle %d after the last left", len(r.groups), r.idle)
	}
	r.sweep(104 * 60000) // window 104 of the 1-minute scale: 103 is the previous, still live
	if len(r.groups) != 1 {
		t.Fatal("swept a group whose window is live")
	}
	r.join(k, a)
	if r.idle != 0 {
		t.Fatalf("idle %d after a rejoin", r.idle)
	}
	r.leave(k, a)
	r.sweep(105 * 60000)
	if len(r.groups) != 0 || r.idle != 0 {
		t.Errorf("groups %d, idle %d after the sweep", len(r.groups), r.idle)
	}
	// A group that never counted goes at once.
	k2 := groupKey{bucket: 1, key: "x"}
	r.join(k2, a)
	r.leave(k2, a)
	if len(r.groups) != 0 || r.idle != 0 {
		t.Errorf("groups %d, idle %d", len(r.groups), r.idle)
	}
}
