package counter

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// PeerID names a peer node to [Store.Merge]. The caller (replication)
// assigns them and must not reuse one for another peer while counts it
// merged under it may still be held (for as long as its longest window).
// [Self], 0, is this node.
type PeerID uint32

// Self is the PeerID of this node's own counts in a [PeerCount].
const Self PeerID = 0

// WindowCount is one node's running count of (Bucket, Key) in one window:
// what [Store.Changes] reports of this node and what [Store.Merge] takes
// from a peer. A running count only grows within its window (a Release may
// lower it a little; Merge keeps the higher), so merging the latest one by
// max repairs a lost report and ignores a duplicate or late one.
type WindowCount struct {
	Bucket    Bucket
	Key       string
	ScaleMS   int64 // the window length the count was made in
	Algorithm Algorithm
	Window    int64 // window number: unix ms / ScaleMS
	Count     int64 // 0 ≤ Count ≤ MaxCount
}

// PeerCount is a WindowCount with the node that made it, for warm starts:
// [Store.LiveCounts] lists this node's own counts (Peer == Self) and every
// peer count it merged.
type PeerCount struct {
	Peer PeerID
	WindowCount
}

// MergeStatus is what [Store.Merge] did with a count.
type MergeStatus uint8

const (
	// Merged: the count was above what the peer had reported for the
	// window, and the difference now counts in decisions.
	Merged MergeStatus = iota
	// Unchanged: not above what the peer had reported (a duplicate, a
	// reordered or repeated report, or a count of 0).
	Unchanged
	// Stale: the window has ended (Fixed: before now's window; Sliding:
	// before the previous one), is more than one window ahead of now, or
	// the key already holds newer windows.
	Stale
	// Deferred: the window is now's + 1 and storing it would drop the
	// previous window that a Sliding limit still reads at now. Offer the
	// count again once now has reached its window.
	Deferred
	// Mismatch: the key is counted here in another window length (the
	// nodes' configurations differ); the count is ignored.
	Mismatch
	// Refused: no room — a new key at the key bound (counted in Refused),
	// or the key already holds counts of MaxPeersPerKey peers.
	Refused
	// Invalid: a zero or out-of-range field, or Peer == Self.
	Invalid
)

var mergeStatusNames = [...]string{"merged", "unchanged", "stale", "deferred", "mismatch", "refused", "invalid"}

// String returns the lower-case name of st ("merged", "stale", …).
func (st MergeStatus) String() string {
	if int(st) < len(mergeStatusNames) {
		return mergeStatusNames[st]
	}
	return "MergeStatus(" + strconv.Itoa(int(st)) + ")"
}

// mark notes that the local count of window w of entry i changed. The
// shard lock must be held; k is the lookup key (its string is copied, not
// kept).
func (sh *shard) mark(i int, k mapKey, w int64) {
	e := &sh.entries[i]
	bit := uint8(1) << (w & 1)
	if e.marks&bit != 0 {
		return
	}
	e.marks |= bit
	if e.marks&listed != 0 {
		return
	}
	e.marks |= listed
	off := len(sh.keys)
	sh.keys = append(sh.keys, k.key...)
	sh.changed = append(sh.changed, changeRef{e: uint32(i), off: off, n: int32(len(k.key)), bucket: k.bucket})
}

// compactChanged drops the changed-list references of entries that sweep
// deleted (their marks are 0), so that the list, and the keys it copied,
// stay bounded by the live keys even when Changes is not called for a long
// time (NATS away). The shard lock must be held.
func (sh *shard) compactChanged() {
	out := sh.changed[:0]
	end := 0
	for _, c := range sh.changed {
		if sh.entries[c.e].marks&listed == 0 {
			continue
		}
		// Keys only move left: copy is safe within the buffer.
		copy(sh.keys[end:], sh.keys[c.off:c.off+int(c.n)])
		c.off = end
		end += int(c.n)
		out = append(out, c)
	}
	clear(sh.changed[len(out):])
	sh.changed, sh.keys = out, sh.keys[:end]
}

// Changes appends to dst this node's current count of every (bucket, key,
// window) whose local count changed since the previous call, and forgets
// the changes. Windows that have ended at now are left out and counted in
// stale. It returns nothing unless Config.Track is set.
//
// Each shard is locked in turn, for time proportional to its changes.
func (s *Store) Changes(dst []WindowCount, now time.Time) (out []WindowCount, stale int) {
	ms, delay := now.UnixMilli(), int64(uint32(s.shares.Load()))
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if len(sh.changed) == 0 {
			sh.mu.Unlock()
			continue
		}
		for _, c := range sh.changed {
			e := &sh.entries[c.e]
			marks := e.marks
			e.marks &= published | published<<1 // off the list, nothing changed
			var key string
			for slot := int64(0); slot < 2; slot++ {
				if marks&(1<<slot) == 0 {
					continue
				}
				w := e.newest
				if w&1 != slot {
					w--
				}
				scale := int64(e.scale)
				if !Live(e.alg, scale, w, now) {
					stale++
					continue
				}
				if e.local[slot] == 0 {
					continue
				}
				if key == "" {
					key = string(sh.keys[c.off : c.off+int(c.n)])
				}
				dst = append(dst, WindowCount{
					Bucket: c.bucket, Key: key, ScaleMS: scale, Algorithm: e.alg,
					Window: w, Count: e.local[slot],
				})
				e.marks |= published << slot
				if w == e.newest {
					e.reported(e.local[slot], ms, delay)
				}
			}
		}
		// Keep the capacity for the next interval, unless a burst of
		// distinct keys grew it far beyond what is in use.
		if cap(sh.changed) > 4096 && len(sh.changed) < cap(sh.changed)/4 {
			sh.changed, sh.keys = nil, nil
		} else {
			clear(sh.changed) // drop the entry pointers
			sh.changed, sh.keys = sh.changed[:0], sh.keys[:0]
		}
		sh.mu.Unlock()
	}
	return dst, stale
}

// nearMargin is the remaining budget at or below which a key counts as
// near its limit. See [Store.NearLimit]. Half, not a tenth: with 3 nodes
// and a key offered 6× its limit per window, each node sees 60% used
// after the first tick and the cluster passes the limit before the next
// one, so a small margin is reached only after the overshoot, while half
// is reached at once.
func nearMargin(limit int64) int64 { return max(1, limit/2) }

// isNear reports whether a key with these counts has at most nearMargin
// of its limit left (Result.Remaining ≤ nearMargin).
func isNear(lim Limit, elapsed, prev, cur int64) bool {
	return lim.Limit-estimate(lim, elapsed, prev, cur) <= nearMargin(lim.Limit)
}

// signalNear notes, without blocking, that a key came near its limit.
func (s *Store) signalNear() {
	select {
	case s.near <- struct{}{}:
	default: // one is already waiting to be read
	}
}

// NearLimit returns a channel that receives a value when a local Take
// admits a hit, or an Incr counts, that leaves the key's remaining budget
// ([Result.Remaining], which counts the hits merged from peers) at or
// below max(1, Limit/2) — with shares on ([Store.SetShares]), when a
// Take or TakeN brings this node's unreported hits to half its share, or
// is denied by its share with hits unreported; nil, which never receives,
// unless Config.Track is set. A denied Take changes nothing and does not signal. The channel has
// a buffer of one and is sent to without blocking, so signals coalesce
// until the reader takes one: the reader (replication) is told "publish
// now", not which key, and gets the counts from [Store.Changes] as usual.
// The send happens after the shard lock is released; the hot path pays
// one comparison, and inside the margin one non-blocking send.
//
// The margin is half the limit because this node's view of a key lags the
// cluster by what peers admitted since their last report, up to (N−1)/N
// of the cluster's hits in one sync interval: a smaller margin is often
// reached only once the cluster is already past the limit.
func (s *Store) NearLimit() <-chan struct{} {
	if s.near == nil {
		return nil
	}
	return s.near
}

// Spent reports whether, since the previous call, an Incr took a key from
// admitting to denying (in this node's view: its own count and what its
// peers reported) or, with shares on, took this node's unreported hits of
// a key past its share (where a TakeN would have been denied), and clears
// the note. Such an Incr also signals [Store.NearLimit], after setting
// the note. A charge is not admission: the peers that peek at the key
// deny only once they hear of it, so replication publishes it without
// waiting for its early-batch gap. Always false unless Config.Track is
// set.
func (s *Store) Spent() bool { return s.spent.Swap(false) }

// Pending returns how many entries have changes that Changes has not yet
// reported.
func (s *Store) Pending() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.changed)
		sh.mu.Unlock()
	}
	return n
}

// Merge records c.Count as peer's running count of (c.Bucket, c.Key) in
// c.Window. Per peer, key and window, the highest count reported wins: the
// decisions of this node then count the difference between it and what the
// peer had reported before. So reports may be lost (the next one carries
// the running count), repeated or reordered without changing the outcome,
// and the remote total of a window is the sum over peers of each one's
// latest count.
//
// A count for a key the node does not know creates the key (bounded by
// MaxKeys like a Take). A key counted here in another window length is
// left alone (Mismatch): the local configuration is authoritative.
func (s *Store) Merge(peer PeerID, c WindowCount, now time.Time) MergeStatus {
	if peer == Self || c.Count < 0 || c.Count > MaxCount ||
		c.ScaleMS < 1 || c.ScaleMS > MaxScaleMS || c.Algorithm > Sliding {
		return Invalid
	}
	ms := now.UnixMilli()
	w, _ := windowSplit(ms, c.ScaleMS)
	// A count of the previous window is merged whatever the algorithm: a
	// fixed window's no longer limits anything, but it weighs in the
	// split of the next (entry.share), and on a slow network the last
	// reports of a window arrive after it ended.
	if !Live(c.Algorithm, c.ScaleMS, c.Window, now) && c.Window != w-1 {
		return Stale
	}
	if c.Count == 0 {
		return Unchanged
	}
	k := mapKey{c.Bucket, s.storedKey(c.Key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var e *entry
	ei := sh.find(tag, c.Bucket, k.key)
	if ei != noEntry {
		if e = &sh.entries[ei]; int64(e.scale) != c.ScaleMS {
			return Mismatch
		}
	} else if ei = sh.insert(k, tag, Limit{Limit: 1, ScaleMS: c.ScaleMS, Algorithm: c.Algorithm}, c.Window, ms, s.room(sh, c.Bucket)); ei == noEntry {
		return Refused
	} else {
		e = &sh.entries[ei]
	}
	if c.Window < e.newest-1 {
		return Stale
	}
	if c.Algorithm == Sliding || e.alg == Sliding {
		e.alg = Sliding // a longer life: the shard's minExpiry stays a lower bound
		if c.Window > e.newest && c.Window == w+1 && e.total(w-1) != 0 {
			return Deferred
		}
	}
	recs := sh.peers[k]
	i := -1
	for j := range recs {
		if recs[j].peer == peer {
			i = j
			break
		}
	}
	slot := c.Window & 1
	var old int64
	if i >= 0 && recs[i].gen == e.gen && recs[i].win[slot] == c.Window {
		old = recs[i].n[slot]
	}
	if c.Count <= old {
		return Unchanged
	}
	if i < 0 {
		if recs, i = s.addPeer(sh, k, e, recs, peer); i < 0 {
			return Refused
		}
	}
	if c.Window > e.newest {
		if e.advance(c.Window) && s.track && s.shares.Load() != 0 {
			sh.mark(ei, k, c.Window-1) // see advance
			s.signalNear()
		}
	}
	r := &recs[i]
	if r.gen != e.gen {
		*r = peerCount{peer: peer, gen: e.gen, win: [2]int64{math.MinInt64, math.MinInt64}}
	}
	r.win[slot], r.n[slot] = c.Window, c.Count
	e.remote[slot] = satAdd(e.remote[slot], c.Count-old)
	if s.track && s.shares.Load() != 0 && c.Window == e.newest && e.limit != 0 && e.local[slot] > int64(e.pubNew) {
		s.reportIfShrunk(sh, ei, k, ms)
	}
	return Merged
}

// addPeer adds peer to recs, k's peer counts, dropping the outdated ones
// first, and returns them with peer's index; -1 when k has as many peers
// as it may. The caller holds sh's lock.
func (s *Store) addPeer(sh *shard, k mapKey, e *entry, recs []peerCount, peer PeerID) ([]peerCount, int) {
	recs = pruneOutdated(recs, e)
	if len(recs) >= s.maxPeers {
		sh.setPeers(k, recs)
		return recs, -1
	}
	recs = append(recs, peerCount{peer: peer, gen: e.gen, win: [2]int64{math.MinInt64, math.MinInt64}})
	sh.setPeers(k, recs)
	return recs, len(recs) - 1
}

// reportIfShrunk marks k, which has hits not yet reported in its newest
// window, for the next report when a peer's count of that window, just
// merged, shrank this node's share so far that those hits, admitted
// against the larger one, are now half the share or more: so that the
// peers' shares do not spend them a second time. Fewer stay within the
// share as a Take would leave them. The caller holds sh's lock.
func (s *Store) reportIfShrunk(sh *shard, ei int, k mapKey, ms int64) {
	e := &sh.entries[ei]
	sv := s.shares.Load()
	if sv == 0 {
		return
	}
	lim := Limit{Limit: int64(e.limit), ScaleMS: int64(e.scale), Algorithm: e.alg}
	var prev int64
	if e.alg == Sliding {
		prev = e.total(e.newest - 1)
	}
	el := min(max(ms-e.newest*lim.ScaleMS, 0), lim.ScaleMS-1)
	if share, unreported := e.share(sv, lim, e.newest, el, prev); 2*unreported >= share {
		sh.mark(ei, k, e.newest)
		s.signalNear()
	}
}

// setPeers stores recs as the peer counts of k, cloning k's string when k
// is new to the map (the caller's may be a view of a message buffer).
func (sh *shard) setPeers(k mapKey, recs []peerCount) {
	if sh.peers == nil {
		sh.peers = make(map[mapKey][]peerCount)
	}
	if _, ok := sh.peers[k]; !ok {
		k.key = strings.Clone(k.key)
	}
	sh.peers[k] = recs
}

// pruneOutdated drops the peer counts of recs that no longer count any
// window e holds, in place.
func pruneOutdated(recs []peerCount, e *entry) []peerCount {
	out := recs[:0]
	for _, r := range recs {
		if r.gen == e.gen && (r.holds(e.newest) || r.holds(e.newest-1)) {
			out = append(out, r)
		}
	}
	clear(recs[len(out):])
	return out
}

func (r *peerCount) holds(w int64) bool { return r.win[w&1] == w && r.n[w&1] > 0 }

// LiveCounts appends to dst every count of a window still live at now that
// the store holds: this node's own (Peer == Self) and each peer's latest
// (Peer as given to Merge), for a node that warm-starts from this one.
//
// It makes one pass over every shard, each locked in turn.
func (s *Store) LiveCounts(dst []PeerCount, now time.Time) []PeerCount {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := range sh.entries {
			e := &sh.entries[j]
			if e.scale == 0 {
				continue
			}
			scale := int64(e.scale)
			var recs []peerCount
			if len(sh.peers) > 0 {
				recs = sh.peers[mapKey{e.bucket, sh.keyView(e.key)}]
			}
			key := "" // a copy of the key, made once it is reported
			for w := e.newest - 1; w <= e.newest; w++ {
				if !Live(e.alg, scale, w, now) {
					continue
				}
				if key == "" {
					key = string(sh.keyBytes(e.key))
				}
				wc := WindowCount{Bucket: e.bucket, Key: key, ScaleMS: scale, Algorithm: e.alg, Window: w}
				if n := e.local[w&1]; n > 0 {
					wc.Count = n
					dst = append(dst, PeerCount{Self, wc})
				}
				for j := range recs {
					if r := &recs[j]; r.gen == e.gen && r.holds(w) {
						wc.Count = r.n[w&1]
						dst = append(dst, PeerCount{r.peer, wc})
					}
				}
			}
		}
		sh.mu.Unlock()
	}
	return dst
}

// Reported appends to dst this node's own count of every window, still
// live at now, that [Store.Changes] reported: what replication publishes
// again to repair a lost batch (for a Sliding key, the previous window
// too, which still weighs in every estimate). With shares on, a window
// never reported is one whose count stayed far below its share, which the
// peers need not know. It makes one pass over every shard, each locked in
// turn.
func (s *Store) Reported(dst []WindowCount, now time.Time) []WindowCount {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := range sh.entries {
			e := &sh.entries[j]
			if e.scale == 0 || e.marks&(published|published<<1) == 0 {
				continue
			}
			scale := int64(e.scale)
			key := ""
			for w := e.newest - 1; w <= e.newest; w++ {
				slot := w & 1
				if e.marks&(published<<slot) == 0 || e.local[slot] == 0 || !Live(e.alg, scale, w, now) {
					continue
				}
				if key == "" {
					key = string(sh.keyBytes(e.key))
				}
				dst = append(dst, WindowCount{
					Bucket: e.bucket, Key: key, ScaleMS: scale, Algorithm: e.alg, Window: w, Count: e.local[slot],
				})
			}
		}
		sh.mu.Unlock()
	}
	return dst
}
