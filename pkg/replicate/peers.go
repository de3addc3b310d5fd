package replicate

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

type peerKey struct {
	node string
	inc  uint64
}

// peer is one other process: a node id and its incarnation.
type peer struct {
	id       counter.PeerID
	key      peerKey
	lastSeen time.Time // under peerTable.mu

	// skewMS is receive time minus send time of its latest batch.
	skewMS atomic.Int64

	// Read and written by the batch handler only (one goroutine).
	lastSeq    uint64
	haveSeq    bool
	skewLogged time.Time
}

// peerTable maps peers to the counter's PeerIDs. It holds at most max
// peers; ids are never reused for another peer (the counter may still
// hold counts under an expired peer's id until their windows end, and
// those must never be attributed to another peer). A peer that expired
// and speaks again gets its old id back, so its counts are not counted a
// second time: the table remembers the last retiredMax expired peers.
// Only authenticated, validated messages reach it.
type peerTable struct {
	mu      sync.Mutex
	byKey   map[peerKey]*peer
	byID    map[counter.PeerID]*peer
	next    counter.PeerID
	max     int
	retired map[peerKey]counter.PeerID
	order   []peerKey // retired keys, oldest first
}

// retiredPerPeer bounds the remembered expired peers: retiredPerPeer × max.
const retiredPerPeer = 4

func newPeerTable(max int) *peerTable {
	return &peerTable{
		byKey: map[peerKey]*peer{}, byID: map[counter.PeerID]*peer{}, next: 1, max: max,
		retired: map[peerKey]counter.PeerID{},
	}
}

// get returns the peer (node, inc), adding it if there is room, and notes
// it was heard from at now. It returns nil when the table is full or the
// ids are exhausted.
func (t *peerTable) get(node string, inc uint64, now time.Time) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := peerKey{node, inc}
	if p := t.byKey[k]; p != nil {
		if now.After(p.lastSeen) {
			p.lastSeen = now
		}
		return p
	}
	if len(t.byKey) >= t.max {
		return nil
	}
	id, back := t.retired[k]
	if back {
		delete(t.retired, k) // its place in order is skipped when reached
	} else {
		if t.next == 0 {
			return nil
		}
		id = t.next
		t.next++ // wraps to 0 after 2^32−1 peers: then no new ones
	}
	p := &peer{id: id, key: k, lastSeen: now}
	t.byKey[k] = p
	t.byID[p.id] = p
	return p
}

// identity returns the peer known under id.
func (t *peerTable) identity(id counter.PeerID) (origin, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byID[id]
	if p == nil {
		return origin{}, false
	}
	return origin{Node: p.key.node, Incarnation: p.key.inc}, true
}

// expire forgets the peers not heard from since now − ttl, remembering
// their ids in case they speak again.
func (t *peerTable) expire(now time.Time, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cutoff := now.Add(-ttl)
	for k, p := range t.byKey {
		if !p.lastSeen.Before(cutoff) {
			continue
		}
		delete(t.byKey, k)
		delete(t.byID, p.id)
		t.retired[k] = p.id
		t.order = append(t.order, k)
	}
	for len(t.retired) > retiredPerPeer*t.max && len(t.order) > 0 {
		delete(t.retired, t.order[0])
		t.order = t.order[1:]
	}
	if len(t.order) > 2*retiredPerPeer*t.max { // keys of peers that came back
		live := t.order[:0]
		for _, k := range t.order {
			if _, ok := t.retired[k]; ok {
				live = append(live, k)
			}
		}
		t.order = append([]peerKey(nil), live...)
	}
}

// liveNodes appends to dst the node ids of the peers heard from since
// since (a restarted node may appear once per incarnation).
func (t *peerTable) liveNodes(dst []string, since time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, p := range t.byKey {
		if !p.lastSeen.Before(since) {
			dst = append(dst, k.node)
		}
	}
	return dst
}

func (t *peerTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// maxSkew returns the largest absolute clock skew of the known peers.
func (t *peerTable) maxSkew() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var m int64
	for _, p := range t.byKey {
		s := p.skewMS.Load()
		if s < 0 {
			s = -s
		}
		m = max(m, s)
	}
	return time.Duration(m) * time.Millisecond
}
