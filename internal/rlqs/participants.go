package rlqs

import (
	"slices"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// ParticipantsWindow is the window of the participants counts: every node
// adds its participants of a (bucket, key) to the count of the window once
// (a counter bucket of its own per quota bucket, replicated like any
// count), so that the count of a window that has ended is the cluster's
// participants during it. It is a few Envoy reporting periods long so that
// the count is steady, and short enough that a node gone away stops
// counting within two of them.
const ParticipantsWindow = 5 * time.Second

// ParticipantsLimit is the limit of the participants buckets: never
// reached, a count only.
var ParticipantsLimit = counter.Limit{Limit: counter.MaxLimitFor(ParticipantsWindow.Milliseconds()), ScaleMS: ParticipantsWindow.Milliseconds()}

// MaxIdleGroups bounds the groups kept without participants. A group
// outlives its last participant for as long as its windows do, so that a
// participant that comes back (Envoy reopening its stream, a bucket id
// reported again after abandon) finds the node's state of the window.
const MaxIdleGroups = 1 << 16

// groupKey names the participants' shared count.
type groupKey struct {
	bucket counter.Bucket // counter id
	key    string
}

// group is the participants of one (bucket, key) on this node.
type group struct {
	members []*tracked // sorted by (stream, seq)
	// announced[w&1] is how many participants this node added to the
	// participants count of window pwin[w&1]; seen[w&1] the largest
	// count of that window read since.
	pwin, announced, seen [2]int64
	// seenMS[w&1] is when a count of window pwin[w&1] was last read.
	seenMS [2]int64
	// firstMS is when the group got its first participant since it was
	// last without any (0: not placed yet).
	firstMS int64
}

// registry holds every group of the node. Safe for concurrent use.
type registry struct {
	mu     sync.Mutex
	groups map[groupKey]*group
	idle   int // groups without members
}

func newRegistry() *registry { return &registry{groups: map[groupKey]*group{}} }

// join adds t to the group of k.
func (r *registry) join(k groupKey, t *tracked) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[k]
	if g == nil {
		g = &group{}
		r.groups[k] = g
	} else if len(g.members) == 0 {
		r.idle--
	}
	i, _ := slices.BinarySearchFunc(g.members, t, cmpTracked)
	g.members = slices.Insert(g.members, i, t)
}

// leave removes t from the group of k. The group stays, idle, until sweep
// finds its windows over, or goes at once when MaxIdleGroups are idle.
func (r *registry) leave(k groupKey, t *tracked) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[k]
	if g == nil {
		return
	}
	i, ok := slices.BinarySearchFunc(g.members, t, cmpTracked)
	if !ok {
		return
	}
	g.members = slices.Delete(g.members, i, i+1)
	if len(g.members) == 0 {
		g.firstMS = 0
		if r.idle >= MaxIdleGroups {
			delete(r.groups, k)
			return
		}
		r.idle++
	}
}

// sweep deletes the groups without participants whose participants
// windows have ended at nowMS.
func (r *registry) sweep(nowMS int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := nowMS / ParticipantsLimit.ScaleMS
	for k, g := range r.groups {
		if len(g.members) == 0 && g.pwin[0] < w-1 && g.pwin[1] < w-1 {
			delete(r.groups, k)
			r.idle--
		}
	}
}

func cmpTracked(a, b *tracked) int {
	switch {
	case a.stream < b.stream:
		return -1
	case a.stream > b.stream:
		return 1
	case a.seq < b.seq:
		return -1
	case a.seq > b.seq:
		return 1
	}
	return 0
}

// place is t's rank among this node's participants of k and their number,
// at nowMS. announce is how many participants this node has yet to add to
// the participants count of window pw (0 when it has added them all).
func (r *registry) place(k groupKey, t *tracked, pw, nowMS int64) (rank, local, announce int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[k]
	if g == nil {
		return 0, 1, 0
	}
	if g.firstMS == 0 {
		g.firstMS = nowMS
	}
	idx, _ := slices.BinarySearchFunc(g.members, t, cmpTracked)
	local = int64(len(g.members))
	i := pw & 1
	if g.pwin[i] != pw {
		g.pwin[i], g.announced[i], g.seen[i], g.seenMS[i] = pw, 0, 0, 0
	}
	if local > g.announced[i] {
		announce = local - g.announced[i]
		g.announced[i] = local
	}
	return int64(idx), local, announce
}

// participants records count, the participants count of window pw read
// at nowMS after place, and returns the cluster's participants of k: the
// largest count seen of this window and the one before (whose count is
// whole), and at least this node's own. It is at least nodes (every live
// node may have a participant, and each would otherwise hand out the
// whole budget) while neither count is known to hold the participants
// other nodes got at about the same time as this one's first: the
// current window's, until settleMS after both this group's first
// participant and the window's start (the others announce theirs afresh
// in each window); the previous window's, unless read settleMS after the
// first participant. bounded reports that nodes raised the count.
func (r *registry) participants(k groupKey, pw, count, local, nowMS, settleMS int64, nodes int) (n int64, bounded bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[k]
	if g == nil {
		return max(local, count), false
	}
	i := pw & 1
	if g.pwin[i] == pw {
		g.seen[i] = max(g.seen[i], count)
		g.seenMS[i] = nowMS
	}
	n = max(local, count)
	p := (pw - 1) & 1
	prev := g.pwin[p] == pw-1
	if prev {
		n = max(n, g.seen[p])
	}
	settled := g.firstMS + settleMS
	known := nowMS >= max(settled, pw*ParticipantsLimit.ScaleMS+settleMS) || prev && g.seenMS[p] >= settled
	if !known && int64(nodes) > n {
		return int64(nodes), true
	}
	return n, false
}

// attributed is the part of n requests reported at now, after a span
// since the previous report of the bucket id (0: none), that falls in the
// window of length scaleMS holding now, taking them as spread evenly over
// the span and rounding up: Envoy reports every few seconds, and usage of
// windows that have ended no longer decides anything.
func attributed(n int64, span time.Duration, now time.Time, scaleMS int64) int64 {
	spanMS := span.Milliseconds()
	in := now.UnixMilli() % scaleMS // ms of the window so far
	if n <= 0 || spanMS <= in || spanMS <= 0 {
		return max(n, 0)
	}
	// ceil(n × in / spanMS); n is bounded by math.MaxInt32, in and spanMS
	// by a day's ms: no overflow.
	if in == 0 {
		in = 1 // the first ms of the window: at least a sliver
	}
	return (n*in + spanMS - 1) / spanMS
}
