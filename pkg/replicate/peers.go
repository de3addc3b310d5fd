package replicate

import (
	"sync"
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

	// Read and written by the batch handler only (one goroutine).
	lastSeq    uint64
	haveSeq    bool
	skewLogged time.Time
}

// peerTable maps peers to the counter's PeerIDs. It holds at most max
// peers; ids are never reused (the counter may still hold counts under an
// expired peer's id until their windows end, and those must never be
// attributed to another peer).
type peerTable struct {
	mu       sync.Mutex
	byKey    map[peerKey]*peer
	byID     map[counter.PeerID]*peer
	next     counter.PeerID
	max      int
	onForget func(node string) // the last peer of a node id is gone
}

func newPeerTable(max int, onForget func(string)) *peerTable {
	return &peerTable{byKey: map[peerKey]*peer{}, byID: map[counter.PeerID]*peer{}, next: 1, max: max, onForget: onForget}
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
	if len(t.byKey) >= t.max || t.next == 0 {
		return nil
	}
	p := &peer{id: t.next, key: k, lastSeen: now}
	t.next++ // wraps to 0 after 2^32−1 peers: then no new ones
	t.byKey[k] = p
	t.byID[p.id] = p
	return p
}

// identity returns the peer known under id.
func (t *peerTable) identity(id counter.PeerID) (Origin, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byID[id]
	if p == nil {
		return Origin{}, false
	}
	return Origin{Node: p.key.node, Incarnation: p.key.inc}, true
}

// expire forgets the peers not heard from since now − ttl.
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
		last := true
		for o := range t.byKey {
			if o.node == k.node {
				last = false
				break
			}
		}
		if last && t.onForget != nil {
			t.onForget(k.node)
		}
	}
}

func (t *peerTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}
