package replicate

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// peer is one other process: a node id and its incarnation. The pair is
// its identity everywhere (the peer table, the counter's peer ids, shares,
// sync replies); the node id alone is a name, which processes may share.
type peer struct {
	id  counter.PeerID
	key origin
	// Under peerTable.mu: lastSeen is when it was last heard from or
	// named as the origin of counts (expiry); first and last when it was
	// first and last heard from itself (liveness).
	lastSeen    time.Time
	first, last time.Time
	heard       time.Time // first, on the monotonic clock probes are timed on

	// ageMS is receive time minus send time of its latest batch: the
	// delivery delay, clock skew included.
	ageMS atomic.Int64
	// minAgeMS is the least ageMS over this clock period and the previous
	// one (see receiver.observe): the clock skew plus the least delivery
	// delay; noAge: none yet.
	minAgeMS atomic.Int64

	// What the link probes tell (see probe.go).
	link

	// Read and written by the batch handler only (one goroutine).
	lastSeq                uint64
	haveSeq                bool
	ages                   lately // of its batches, ms, over clock periods
	skewLogged, lateLogged time.Time

	// Read and written by the cast handler only: the number of the last
	// cast delivered.
	castSeq     uint64
	haveCastSeq bool
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
	byKey   map[origin]*peer
	byID    map[counter.PeerID]*peer
	next    counter.PeerID
	max     int
	retired map[origin]counter.PeerID
	order   []origin // retired keys, oldest first
}

// retiredPerPeer bounds the remembered expired peers: retiredPerPeer × max.
const retiredPerPeer = 4

func newPeerTable(max int) *peerTable {
	return &peerTable{
		byKey: map[origin]*peer{}, byID: map[counter.PeerID]*peer{}, next: 1, max: max,
		retired: map[origin]counter.PeerID{},
	}
}

// get returns the peer (node, inc), adding it if there is room, and notes
// it was seen at now: heard from, when heard (a message it sent), else
// named as the origin of counts in another's sync reply, which keeps it
// from expiry but not live (it may have stopped long ago). It returns nil
// when the table is full or the ids are exhausted.
func (t *peerTable) get(node string, inc uint64, now time.Time, heard bool) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := origin{node, inc}
	p := t.byKey[k]
	if p == nil {
		if p = t.add(k); p == nil {
			return nil
		}
	}
	if now.After(p.lastSeen) {
		p.lastSeen = now
	}
	if heard {
		p.heardAt(now)
	}
	return p
}

// heardAt notes, under peerTable.mu, that the peer sent a message itself
// at now.
func (p *peer) heardAt(now time.Time) {
	if p.first.IsZero() {
		p.first = now
		p.heard = time.Now()
	}
	if now.After(p.last) {
		p.last = now
	}
	if now.After(p.lastSeen) {
		p.lastSeen = now
	}
}

// heardFrom returns the known peer (node, inc) and notes it was heard
// from at now, or nil: unlike get, it never adds one.
func (t *peerTable) heardFrom(node string, inc uint64, now time.Time) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byKey[origin{node, inc}]
	if p != nil {
		p.heardAt(now)
	}
	return p
}

// add adds the peer k under its old id, if it had one, else a new one. It
// returns nil when the table is full or the ids are exhausted.
func (t *peerTable) add(k origin) *peer {
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
	p := &peer{id: id, key: k}
	p.minAgeMS.Store(noAge)
	p.rttMS.Store(noAge)
	p.rttMinMS.Store(noAge)
	p.rttMaxMS.Store(noAge)
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
	return p.key, true
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
		t.order = append([]origin(nil), live...)
	}
}

// member is a process taking part in the cluster: its identity, and when
// it was first and last heard from.
type member struct {
	id          origin
	first, last time.Time
}

// live appends to dst the peers heard from since since.
func (t *peerTable) live(dst []member, since time.Time) []member {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, p := range t.byKey {
		if !p.last.IsZero() && !p.last.Before(since) {
			dst = append(dst, member{k, p.first, p.last})
		}
	}
	return dst
}

func (t *peerTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// lately holds the least and the largest of the values noted over the
// current period and the previous one: a figure that lasts through a
// period with nothing noted, and forgets what is two periods old.
type lately struct {
	start                      time.Time
	min, prevMin, max, prevMax int64 // noAge and -noAge: none
}

// roll starts a new period at now when the current one is period old or
// more, and reports whether it did (start, then, is the ended one's
// beginning); the first call starts the first.
func (l *lately) roll(now time.Time, period time.Duration) (ended bool, start time.Time) {
	if l.start.IsZero() {
		l.start, l.min, l.prevMin, l.max, l.prevMax = now, noAge, noAge, -noAge, -noAge
		return false, now
	}
	if start = l.start; now.Sub(start) < period {
		return false, start
	}
	l.start, l.prevMin, l.min, l.prevMax, l.max = now, l.min, noAge, l.max, -noAge
	return true, start
}

func (l *lately) note(v int64) { l.min, l.max = min(l.min, v), max(l.max, v) }

// least and most are the least and the largest values noted in the two
// periods: noAge and -noAge when none was.
func (l *lately) least() int64 { return min(l.min, l.prevMin) }
func (l *lately) most() int64  { return max(l.max, l.prevMax) }

// skew is the peer's clock skew, ms: the least age of its batches lately
// less the least one-way delivery delay its probes' echoes tell (none
// from a peer that echoes no probes: then the least age itself).
func (p *peer) skew() int64 {
	a := p.minAgeMS.Load()
	if a == noAge {
		return 0
	}
	if rtt := p.rttMinMS.Load(); rtt != noAge {
		return a - rtt/2
	}
	return a
}

// oneWay is the delivery delay to and from the peer at now, ms: half the
// larger of the longest round trip of its probes lately (the delays of a
// jittery or lossy link recur) and, while it was heard from since fresh,
// the time its oldest unanswered probe has waited (a delay that grew
// shows at once, not when a late answer arrives; a peer silent longer has
// more likely stopped, and its shares go to the others once it is out of
// the live nodes). A peer that echoes no probes has its latest batch's
// age, taken as at most interval: that age holds the clock skew too,
// which must not make shares wait.
//
// A peer that has echoed nothing yet is given probeGrace to: meanwhile
// the probes sent since it was first heard from wait for it.
func (p *peer) oneWay(pr *prober, now, fresh time.Time, interval time.Duration) int64 {
	rtt := p.rttMaxMS.Load()
	if rtt == noAge {
		d := min(abs(p.ageMS.Load()), interval.Milliseconds())
		if now.Sub(p.heard) < probeGrace {
			d = max(d, pr.waiting(p.heard.Sub(pr.epoch), now)/2)
		}
		return d
	}
	if p.last.Before(fresh) {
		return rtt / 2
	}
	return max(rtt, pr.waiting(time.Duration(p.echoed.Load()), now)) / 2
}

// roundTrip returns the largest round trip at now to a peer heard from
// since live (twice its oneWay; fresh as there), the share delay's
// input: a peer gone silent for longer is out of the split, and of the
// delay.
func (t *peerTable) roundTrip(pr *prober, now, live, fresh time.Time, interval time.Duration) time.Duration {
	return 2 * t.largest(func(p *peer) int64 {
		if p.last.Before(live) {
			return 0
		}
		return p.oneWay(pr, now, fresh, interval)
	})
}

// maxSkew returns the largest absolute clock skew of the known peers.
func (t *peerTable) maxSkew() time.Duration {
	return t.largest((*peer).skew)
}

func (t *peerTable) largest(ms func(*peer) int64) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var m int64
	for _, p := range t.byKey {
		s := ms(p)
		if s < 0 {
			s = -s
		}
		m = max(m, s)
	}
	return time.Duration(m) * time.Millisecond
}

// PeerInfo is what this node knows of one peer.
type PeerInfo struct {
	Node        string
	Incarnation uint64
	// LastHeard is when it last sent a message itself; zero when it was
	// only named as the origin of counts in another's sync reply.
	LastHeard time.Time
	// DelayMS is receive time minus send time of its latest batch: the
	// delivery delay, clock skew included; SkewMS the clock skew alone
	// (see peer.skew); RoundTripMS the latest probe's round trip, -1
	// before the first echo.
	DelayMS, SkewMS, RoundTripMS int64
}

// Peers returns the peers this node knows, ordered by node id then
// incarnation. Safe for concurrent use.
func (r *Replicator) Peers() []PeerInfo {
	t := r.peers
	t.mu.Lock()
	out := make([]PeerInfo, 0, len(t.byKey))
	for k, p := range t.byKey {
		rtt := p.rttMS.Load()
		if rtt == noAge {
			rtt = -1
		}
		out = append(out, PeerInfo{Node: k.Node, Incarnation: k.Incarnation, LastHeard: p.last, DelayMS: p.ageMS.Load(), SkewMS: p.skew(), RoundTripMS: rtt})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b PeerInfo) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Incarnation, b.Incarnation))
	})
	return out
}

// Sealed reports whether this node seals its messages with a cluster key.
func (r *Replicator) Sealed() bool { return r.seal != nil }
