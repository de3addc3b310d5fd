package counter

import (
	"fmt"
	"math/bits"
	"time"
)

// Shares tells a tracking Store (Config.Track) how the nodes of a cluster
// split each key's budget; see [Store.SetShares].
type Shares struct {
	// Nodes is how many live nodes count the keys, this one included. At
	// most 1 turns shares off.
	Nodes int
	// Rank is this node's place among them, in [0, Nodes), in an order
	// every node agrees on: it decides which nodes get the remainder when
	// a budget does not divide evenly.
	Rank int
	// Delay is how long after [Store.Changes] reported a count the peers
	// are taken to hold it: the time to publish and deliver a batch.
	Delay time.Duration
}

// Bounds of a Shares.
const (
	MaxShareNodes = 1<<16 - 1
	MaxShareDelay = time.Hour
)

// packShares packs sh into the Store's atomic word: nodes in bits 48–63,
// rank in 32–47, delay in ms in 0–31. 0 means no shares.
func packShares(sh Shares) uint64 {
	if sh.Nodes <= 1 {
		return 0
	}
	return uint64(sh.Nodes)<<48 | uint64(sh.Rank)<<32 | uint64(sh.Delay.Milliseconds())
}

// SetShares sets how this node splits budgets with its peers; Nodes ≤ 1
// (a node alone, or cut off from its peers) turns shares off. A Store
// without Track ignores it.
//
// With shares on, a Take or TakeN admits only while this node's hits that
// its peers have not been told of stay within its share of the budget
// that no node has been told is spent:
//
//	local − reported ≤ share of (Limit − estimate(reported + remote))
//
// where reported is this node's count as of a report at least Delay old
// and remote what the peers reported. The share is a part of what remains
// in proportion to this node's weight among all (see shareOf): each
// node's hits of the key that every node knows of — its count of the
// previous window once it reported some of it, and its reported count of
// this one — smoothed by a sixteenth of the limit spread over the nodes, so
// that a node with no hits known still gets some. When every node holds
// the same reports the shares add up to what remains, rounded up (a share
// of 0 counts as 1, so up to Nodes − 1 hits more than the limit may be
// admitted, as without shares), so the cluster admits at most the limit
// however the traffic is spread; a node that nears its share is told to
// publish ([Store.NearLimit]) and, once its report is Delay old, gets its
// share of what then remains, a share that grows with its reported hits.
// A node that carries all the traffic thus takes most of what remains each
// round of Delay plus the early-batch gap, as its peers, silent, have
// none of it.
//
// A key of which a node knows no count at all (a new key, or one whose
// hits no node has reported) has a first share of 3/(2 × Nodes) of what
// remains, its remainder going to the ranks whose turn it is in the
// window: a burst on one node admits half again an even share before its
// first report is answered, and a key that bursts on every node at once
// before any has heard of the others admits at most 1.5 × its limit in
// that window (plus the rounding), the price of the larger first share.
// Once a node hears of any count, the split above applies. Why this split
// and this first share, what else was weighed, and the figures:
// docs/design/budget-shares.md.
//
// Only keys near their share are marked for [Store.Changes], and keys a
// peer reports ([Store.Merge]) while this node's unreported hits of them
// are half its shrunk share or more: a key whose count stays well below its share and that no peer
// reports is never reported, so a flood of distinct keys costs no
// replication. Incr is not admission and marks
// every change as without shares.
func (s *Store) SetShares(sh Shares) error {
	if sh.Nodes > MaxShareNodes || (sh.Nodes > 1 && (sh.Rank < 0 || sh.Rank >= sh.Nodes)) ||
		sh.Delay < 0 || sh.Delay > MaxShareDelay {
		return fmt.Errorf("%w: shares %+v out of range", ErrInvalidConfig, sh)
	}
	s.shares.Store(packShares(sh))
	return nil
}

// ShareDenials returns how many hits were denied because this node had
// used its share while the cluster as this node knows it was under the
// limit. Such a denial lasts until this node's report is Delay old.
func (s *Store) ShareDenials() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.shareDenied
		sh.mu.Unlock()
	}
	return n
}

// takeShare decides, under the shard lock, whether n more local hits of
// entry i in window w (its newest, already prepared) fit in this node's
// share, given that they fit under the limit. It marks the entry for
// Changes when the hits would bring it near its share or when they do not
// fit and there is something unreported, and reports whether replication
// should publish now.
func (sh *shard) takeShare(i int, k mapKey, sv uint64, lim Limit, w, el, prev, n int64) (ok, near bool, retryMS int64) {
	e := &sh.entries[i]
	if w != e.newest {
		// A peer's report (its clock ahead) moved the key to the next
		// window while this node's is still w: what this node reported of
		// w is not kept. Admit on the limit, as without shares, and have
		// the count reported; it lasts as long as the clocks' skew.
		sh.mark(i, k, w)
		return true, true, 0
	}
	share, unreported := e.share(sv, lim, w, el, prev)
	delay := int64(uint32(sv))
	// n hits that can never fit in a share (a TakeN heavier than it) are
	// admitted on the limit alone once this node has nothing unreported:
	// otherwise they would be denied on every node for the whole window.
	if unreported+n <= share || (n > share && unreported <= 0) {
		// Near: at least half of the share used, counting these hits.
		if 2*(unreported+n) >= share {
			sh.mark(i, k, w)
			return true, true, 0
		}
		return true, false, 0
	}
	sh.shareDenied++
	// The share grows once the latest report is Delay old; a report still
	// to be made goes out within about Delay (the early-batch gap) first.
	retryMS = max(1, int64(e.pubAt)+delay-el)
	if e.local[w&1] > int64(e.pubNew) || e.marks&(1<<(w&1)) != 0 {
		sh.mark(i, k, w)
		return false, true, 2 * max(delay, 1)
	}
	return false, false, retryMS
}

// share returns this node's share of what remains of e's budget in its
// newest window w, el ms into it (prev: the previous window's total, for a
// Sliding lim), and its local hits of w not yet reported as in effect.
func (e *entry) share(sv uint64, lim Limit, w, el, prev int64) (share, unreported int64) {
	nodes, rank, delay := int64(sv>>48), int64(sv>>32&0xffff), int64(uint32(sv))
	base := int64(e.pubOld)
	if el >= int64(e.pubAt)+delay {
		base = int64(e.pubNew)
	}
	if rem := lim.Limit - estimate(lim, el, prev, base+e.remote[w&1]); rem > 0 {
		share = shareOf(e, lim.Limit, rem, w, nodes, rank, base)
	}
	return share, e.local[w&1] - base
}

// shareOf is this node's share of rem, what remains of e's budget in
// window w (its newest), given base, this node's count of w that its peers
// hold. The weights are the counts every node knows of the same way (so
// that every node computes nearly the same split and the shares add up to
// about rem): this node's are base and, once it reported any of them, its
// hits of window w−1; the peers' are what they reported of both windows.
// A node's hits of w−1 that it never reported are left out, as its peers
// know nothing of them. Each weight is smoothed by limit/(16 × nodes), so
// that a node with no hits known still gets some. When nothing is known
// the share is the first share, 3 × rem / (2 × nodes), its remainder
// going to the ranks whose turn it is in window w, which every node
// computes alike. A share of 0 counts as 1: otherwise a small limit could
// admit nothing at all on a node that carries all the traffic.
func shareOf(e *entry, limit, rem, w, nodes, rank, base int64) int64 {
	p := (w - 1) & 1
	own := base
	if e.marks&(published<<p) != 0 {
		own += e.local[p]
	}
	all := own + e.remote[p] + e.remote[w&1]
	if all <= 0 {
		q := rem * 3 / 2 // rem ≤ MaxLimit: no overflow
		share := q / nodes
		if (w%nodes+nodes+rank)%nodes < q%nodes || share == 0 {
			share++
		}
		return share
	}
	smooth := max(1, limit/(16*nodes))
	own, all = min(own, 4*limit), min(all, 4*limit) // beyond 4× the limit, only the ratio matters
	num, den := uint64(own+smooth), uint64(all+nodes*smooth)
	// ⌈rem × num / den⌉ in 128 bits: rem × num may exceed 2^63. num ≤ den,
	// so the quotient is at most rem and Div64 cannot panic.
	hi, lo := bits.Mul64(uint64(rem), num)
	lo, c := bits.Add64(lo, den-1, 0)
	q, _ := bits.Div64(hi+c, lo, den)
	return max(1, int64(q))
}

// reported notes, under the shard lock, that Changes at ms reports count
// as the local count of e's newest window.
func (e *entry) reported(count, ms, delay int64) {
	scale := int64(e.scale)
	at := min(max(ms-e.newest*scale, 0), scale)
	if at >= int64(e.pubAt)+delay {
		e.pubOld = e.pubNew // in effect: the fallback while the new one is not
	}
	e.pubNew, e.pubAt = uint32(min(count, MaxLimit)), uint32(at)
}

// MarkUnreported marks for [Store.Changes] every key whose newest window
// holds at least min local hits not yet reported (and, for a Sliding key,
// whose previous window holds at least min local hits), and returns how
// many windows it marked: a node that leaves the cluster publishes them last, so its
// peers' shares grow to what it really left. A key hit once (a flood's)
// is left out with min = 2. It makes one pass over every shard, each locked
// in turn.
func (s *Store) MarkUnreported(min int64) int {
	if !s.track {
		return 0
	}
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := range sh.entries {
			e := &sh.entries[j]
			if e.scale == 0 {
				continue
			}
			k := mapKey{e.bucket, sh.keyView(e.key)}
			if e.local[e.newest&1]-int64(e.pubNew) >= max(min, 1) {
				sh.mark(j, k, e.newest)
				n++
			}
			// A Sliding key's previous window still weighs in the
			// estimates; what of it was reported is not kept, and
			// reporting it again changes nothing.
			if e.alg == Sliding && e.local[(e.newest-1)&1] >= max(min, 1) {
				sh.mark(j, k, e.newest-1)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}
