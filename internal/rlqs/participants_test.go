package rlqs

import (
	"math"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

func TestAttributed(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(1764547200000 + ms) }
	for _, tc := range []struct {
		n      int64
		span   time.Duration
		now    time.Time
		scale  int64
		want   int64
		reason string
	}{
		{10, 0, at(300), 1000, 10, "first report: all of it"},
		{10, 200 * time.Millisecond, at(300), 1000, 10, "the span is within the window"},
		{500, 5 * time.Second, at(300), 1000, 30, "0.3 s of a 5 s span"},
		{500, 5 * time.Second, at(301), 1000, 31, "rounded up"},
		{500, 5 * time.Second, at(0), 1000, 1, "the window's first ms"},
		{500, 5 * time.Second, at(30_000), 60_000, 500, "a long window holds the whole span"},
		{0, 5 * time.Second, at(300), 1000, 0, "nothing reported"},
		{1 << 31, 24 * time.Hour, at(86_399_999), 86_400_000, 1<<31 - 24, "large values do not overflow"},
	} {
		if got := attributed(tc.n, tc.span, tc.now, tc.scale); got != tc.want {
			t.Errorf("%s: attributed(%d, %v, +%d ms, %d) = %d, want %d", tc.reason, tc.n, tc.span, tc.now.UnixMilli()%tc.scale, tc.scale, got, tc.want)
		}
	}
}

// The registry over fixed windows: ranks follow the order the streams
// opened; each node announces its participants once per window; the count
// of the window before holds while the current one fills.
func TestRegistryPlace(t *testing.T) {
	r := newRegistry()
	k := groupKey{bucket: counter.Bucket(3), key: "acme"}
	a := &tracked{stream: 1, seq: 1}
	b := &tracked{stream: 2, seq: 1}
	r.join(k, b)
	if rank, local, ann := r.place(k, b, 100, 100*ParticipantsLimit.ScaleMS); rank != 0 || local != 1 || ann != 1 {
		t.Errorf("b alone: rank %d of %d, announce %d", rank, local, ann)
	}
	r.join(k, a)
	if rank, local, ann := r.place(k, a, 100, 100*ParticipantsLimit.ScaleMS); rank != 0 || local != 2 || ann != 1 {
		t.Errorf("a joins: rank %d of %d, announce %d; want 0 of 2, 1 more", rank, local, ann)
	}
	if rank, _, ann := r.place(k, b, 100, 100*ParticipantsLimit.ScaleMS); rank != 1 || ann != 0 {
		t.Errorf("b after a: rank %d, announce %d; want 1, 0", rank, ann)
	}
	// Another node has 3: the count of the window says 5.
	if n, _ := r.participants(k, 100, 5, 2, 100*ParticipantsLimit.ScaleMS, 200, 1); n != 5 {
		t.Errorf("participants %d, want 5", n)
	}
	// A new window: announced afresh; its count is still filling (only
	// ours, 2), so the whole count of the window before holds.
	if _, _, ann := r.place(k, a, 101, 101*ParticipantsLimit.ScaleMS); ann != 2 {
		t.Errorf("new window: announce %d, want 2", ann)
	}
	if n, _ := r.participants(k, 101, 2, 2, 101*ParticipantsLimit.ScaleMS, 200, 1); n != 5 {
		t.Errorf("new window: %d, want the previous window's 5", n)
	}
	// Two windows on, the other node having gone: ours only.
	r.place(k, a, 103, 103*ParticipantsLimit.ScaleMS)
	if n, _ := r.participants(k, 103, 2, 2, 103*ParticipantsLimit.ScaleMS, 200, 1); n != 2 {
		t.Errorf("two windows on: %d, want 2", n)
	}
	r.leave(k, b)
	r.leave(k, a)
	// Idle, it keeps the window's state for whoever comes back.
	if len(r.groups) != 1 || r.idle != 1 {
		t.Fatalf("groups %d, idle %d after the last left", len(r.groups), r.idle)
	}
	pw := ParticipantsLimit.ScaleMS
	r.sweep(104 * pw) // 103 is the window before: live
	if len(r.groups) != 1 {
		t.Fatal("swept a group whose window is live")
	}
	r.join(k, a)
	if r.idle != 0 {
		t.Fatalf("idle %d after a rejoin", r.idle)
	}
	r.leave(k, a)
	r.sweep(105 * pw)
	if len(r.groups) != 0 || r.idle != 0 {
		t.Errorf("groups %d, idle %d after the sweep", len(r.groups), r.idle)
	}
}

// Until the cluster's participants of a key are known, every live node
// counts as one: participants that join on several nodes at once, before
// any of them has heard of the others', would otherwise each be handed
// the whole budget.
func TestRegistryCountsEveryNodeUntilKnown(t *testing.T) {
	const settle = 200
	scale := ParticipantsLimit.ScaleMS
	r := newRegistry()
	k := groupKey{bucket: counter.Bucket(3), key: "acme"}
	a := &tracked{stream: 1, seq: 1}
	pw := int64(100)
	at := pw*scale + 1000 // 1 s into the participants window
	r.join(k, a)
	r.place(k, a, pw, at)
	if n, b := r.participants(k, pw, 1, 1, at, settle, 3); n != 3 || !b {
		t.Errorf("a new group on a 3-node cluster: %d participants (bounded %v), want 3 (every node may have one)", n, b)
	}
	if n, _ := r.participants(k, pw, 1, 1, at+50, settle, 1); n != 1 {
		t.Errorf("a node alone: %d, want 1", n)
	}
	// A replication round trip on, the count holds the others': 2.
	r.place(k, a, pw, at+settle)
	if n, b := r.participants(k, pw, 2, 1, at+settle, settle, 3); n != 2 || b {
		t.Errorf("settled: %d (bounded %v), want the count, 2", n, b)
	}
	// The next window: the others have not announced theirs afresh yet
	// (the count says 1), and the window before's, read once settled,
	// holds.
	next := (pw + 1) * scale
	r.place(k, a, pw+1, next+10)
	if n, b := r.participants(k, pw+1, 1, 1, next+10, settle, 3); n != 2 || b {
		t.Errorf("next window: %d (bounded %v), want the window before's 2", n, b)
	}
	// A group whose first participant came just before a window ended: the
	// window before's count was read only then, the new one is filling.
	k2 := groupKey{bucket: counter.Bucket(3), key: "globex"}
	c := &tracked{stream: 2, seq: 1}
	r.join(k2, c)
	r.place(k2, c, pw, next-100)
	r.participants(k2, pw, 1, 1, next-100, settle, 3)
	r.place(k2, c, pw+1, next+10)
	if n, b := r.participants(k2, pw+1, 1, 1, next+10, settle, 3); n != 3 || !b {
		t.Errorf("a window's start, the window before read too early: %d (bounded %v), want 3", n, b)
	}
	if n, b := r.participants(k2, pw+1, 2, 1, next+settle, settle, 3); n != 2 || b {
		t.Errorf("settled in the new window: %d (bounded %v), want 2", n, b)
	}
	// The last participant leaves and another comes in the next window:
	// the count of the window before is known.
	r.leave(k, a)
	d := &tracked{stream: 3, seq: 1}
	r.join(k, d)
	r.place(k, d, pw+2, (pw+2)*scale+10)
	if n, b := r.participants(k, pw+2, 1, 1, (pw+2)*scale+10, settle, 3); n != 3 || !b {
		t.Errorf("back after leaving, the window before read before it: %d (bounded %v), want 3", n, b)
	}
}

// A refill of tokens a window, in Envoy's terms: whole seconds, at least
// the window, and never tokens_per_fill 1 (Envoy takes two buckets that
// differ only in fill_interval seconds for one).
func TestRefillEvery(t *testing.T) {
	for _, tc := range []struct {
		tokens  uint32
		scaleMS int64
		every   time.Duration
		perFill uint32
	}{
		{100, 1000, time.Second, 100},
		{5, 60_000, time.Minute, 5},
		{10, 500, time.Second, 20},
		{30, 1500, 2 * time.Second, 40},
		{1, 1000, 2 * time.Second, 2},
		{1, 1, time.Second, 1000},
		{math.MaxUint32, 1, time.Second, math.MaxUint32},
		{math.MaxUint32, 31 * 86_400_000, 31 * 86_400 * time.Second, math.MaxUint32},
	} {
		every, perFill := refillEvery(tc.tokens, tc.scaleMS)
		if every != tc.every || perFill != tc.perFill {
			t.Errorf("refillEvery(%d, %d ms) = %d per %v, want %d per %v", tc.tokens, tc.scaleMS, perFill, every, tc.perFill, tc.every)
		}
	}
}
