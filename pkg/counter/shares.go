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
// and remote what the peers reported. The share follows the key's hits in
// its previous window, this node's against all (see shareOf), and is an
// even split, its remainder going to the ranks whose turn it is in the
// window, for a key without a previous window. Shares are rounded up and a
// share of 0 counts as 1, so up to Nodes − 1 hits more than the limit may
// be admitted, as without shares. When every node holds the same reports, the
// shares add up to exactly what remains, so the cluster admits at most the
// limit however the traffic is spread, before any node has heard of the
// others' hits; a node that nears its share is told to publish
// ([Store.NearLimit]) and, once its report is Delay old, gets its share of
// what then remains. A node that carries all the traffic thus reaches the
// limit in a few rounds of Delay plus the early-batch gap, each taking
// 1/Nodes of what remains.
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
		share = shareOf(e, lim.Limit, rem, w, nodes, rank)
	}
	return share, e.local[w&1] - base
}

// shareOf is this node's share of rem, what remains of e's budget in
// window w. The split follows the key's traffic in the previous window,
// as this node knows it: this node's own hits there against every node's,
// each count smoothed by a quarter of an even share of the limit, so that
// a node that carried 90% of a key's hits gets most of what remains and a
// node that carried none still gets some. Every node computes the split
// from nearly the same counts (a key's busy nodes publish theirs, and a
// report makes the others publish), so the shares add up to about what
// remains. Without a previous window the split is even, its remainder
// going to the ranks whose turn it is in window w, which every node
// computes alike. A share of 0 counts as 1: otherwise a small limit could
// admit nothing at all on a node that carries all the traffic.
func shareOf(e *entry, limit, rem, w, nodes, rank int64) int64 {
	own, all := e.local[(w-1)&1], e.total(w-1) // w is e's newest window
	if all <= 0 {
		share := rem / nodes
		if (w%nodes+nodes+rank)%nodes < rem%nodes || share == 0 {
			share++
		}
		return share
	}
	smooth := max(1, limit/(4*nodes))
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
