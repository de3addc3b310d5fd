package rlqs

import (
	"slices"
	"sync"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

// MaxRemoteParticipants caps the estimate of the participants on other
// nodes of one (bucket, key).
const MaxRemoteParticipants = 64

// shareOf is participant rank's (0 ≤ rank < n) share of remaining: an even
// split, the remainder going one each to the lowest ranks, so that the
// shares of the n participants add up to exactly remaining. Ranks n and
// above (the estimated participants on other nodes) are never assigned
// here; they stand for budget this node leaves to its peers.
func shareOf(remaining, n, rank int64) int64 {
	if remaining <= 0 || n <= 0 || rank < 0 || rank >= n {
		return 0
	}
	s := remaining / n
	if rank < remaining%n {
		s++
	}
	return s
}

// remoteEstimate is how many participants other nodes are taken to have
// of a (bucket, key): none when the whole count is this node's; otherwise
// this node's participants scaled by how much more the rest of the
// cluster spent than this node did (so a peer spending as much as this
// node counts as many participants as this node has), at least one and
// at most MaxRemoteParticipants. local is what this node's streams
// reported in the window, total the count the counter holds (replicated
// peers' counts, and Check's hits on any node, included).
func remoteEstimate(local, total, participants int64) int64 {
	remote := total - local
	if remote <= 0 {
		return 0
	}
	if local <= 0 || participants <= 0 {
		return 1
	}
	if remote/local >= MaxRemoteParticipants {
		return MaxRemoteParticipants
	}
	// ceil(participants × remote / local); participants is bounded by the
	// streams, remote/local by the cap: no overflow.
	est := (participants*remote + local - 1) / local
	return min(max(est, 1), MaxRemoteParticipants)
}

// groupKey names the participants' shared count.
type groupKey struct {
	bucket counter.Bucket // counter id
	key    string
}

// group is the participants of one (bucket, key) on this node.
type group struct {
	members []*tracked // sorted by (stream, seq)
	// local[w&1] is what this node's streams reported in window win[w&1]
	// (of the bucket's window length scale).
	win, local [2]int64
	scale      int64
	// est[w&1] is the estimate of remote participants made in window
	// win[w&1]; the previous window's carries over, since a new window's
	// peer counts arrive one sync interval late.
	est [2]int64
}

// MaxIdleGroups bounds the groups kept without participants. A group
// outlives its last participant for as long as its windows do, so that a
// participant that comes back (Envoy reopening its stream, a bucket id
// reported again after abandon) finds this node's usage of the window
// still counted as this node's, not taken for other nodes'.
const MaxIdleGroups = 1 << 16

// registry holds every group of the node. Safe for concurrent use.
type registry struct {
	mu     sync.Mutex
	groups map[groupKey]*group
	idle   int // groups without members
}

func newRegistry() *registry { return &registry{groups: map[groupKey]*group{}} }

// sweep deletes the groups without participants whose windows have ended
// at nowMS.
func (r *registry) sweep(nowMS int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, g := range r.groups {
		if len(g.members) == 0 && !g.live(nowMS) {
			delete(r.groups, k)
			r.idle--
		}
	}
}

// live reports whether g holds a count of the window of nowMS or the one
// before.
func (g *group) live(nowMS int64) bool {
	if g.scale <= 0 {
		return false
	}
	w := nowMS / g.scale
	return g.win[0] >= w-1 || g.win[1] >= w-1
}

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

// leave removes t from the group of k. The group stays, idle, until
// sweep finds its windows over, or at once when MaxIdleGroups are idle.
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
		if r.idle >= MaxIdleGroups || g.scale == 0 {
			delete(r.groups, k)
			return
		}
		r.idle++
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

// split is t's place in the group of k after it reported reported
// requests (0: none, or no report) in window w of length scale, the
// counter holding total for the window: its rank among this node's
// participants and the number of participants the remainder is split
// over, remote estimate included.
func (r *registry) split(k groupKey, t *tracked, w, scale, reported, total int64) (rank, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[k]
	if g == nil {
		return 0, 1
	}
	if g.scale != scale { // a reload changed the window: start over
		g.scale, g.win, g.local, g.est = scale, [2]int64{}, [2]int64{}, [2]int64{}
	}
	i := w & 1
	if g.win[i] != w {
		g.win[i], g.local[i], g.est[i] = w, 0, 0
	}
	g.local[i] += reported
	local := int64(len(g.members))
	e := remoteEstimate(g.local[i], total, local)
	g.est[i] = max(g.est[i], e)
	est := g.est[i]
	if p := (w - 1) & 1; g.win[p] == w-1 {
		est = max(est, g.est[p])
	}
	idx, _ := slices.BinarySearchFunc(g.members, t, cmpTracked)
	return int64(idx), local + est
}
