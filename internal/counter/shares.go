package counter

import (
	"fmt"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// Bounds of a [share.Split] the Store takes.
const (
	MaxShareNodes = 1<<16 - 1
	MaxShareDelay = time.Hour
)

// packShares packs sh into the Store's atomic word: nodes in bits 48–63,
// rank in 32–47, delay in ms in 0–31. 0 means no shares.
func packShares(sh share.Split) uint64 {
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
// and remote what the peers reported. The share is [share.Split.Of] what
// remains, weighed by the hits of the key every node knows of (see
// entry.share): 1.5/Nodes of it while no count of the key is known, then a
// part that follows the reported hits. When every node holds the same
// reports the shares add up to what remains (rounded up: up to Nodes − 1
// hits over), so the cluster admits at most the limit however the traffic
// is spread; a node that nears its share is told to publish
// ([Store.NearLimit]) and, once its report is Delay old, gets its share
// of what then remains, a share that grows with its reported hits. A node
// that carries all the traffic thus takes most of what remains each round
// of Delay plus the early-batch gap, as its peers, silent, have none of
// it. A key that bursts on every node at once, before any has heard of
// the others, admits at most 1.5 × its limit in that window: the price of
// the larger first share (docs/design/budget-shares.md).
//
// Only keys near their share are marked for [Store.Changes], and keys a
// peer reports ([Store.Merge]) while this node's unreported hits of them
// are half its shrunk share or more: a key whose count stays well below its share and that no peer
// reports is never reported, so a flood of distinct keys costs no
// replication. Incr is not admission and marks
// every change as without shares; it signals NearLimit as a TakeN would,
// and notes [Store.Spent] where a TakeN would have been denied.
func (s *Store) SetShares(sh share.Split) error {
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
// The weights [share.Split.Of] splits by are the counts every node knows
// of the same way, so that every node computes nearly the same split:
// this node's are its count of w that its peers hold (base) and, once it
// reported any of them, its hits of window w−1; the peers' are what they
// reported of both windows. A node's hits of w−1 that it never reported
// are left out, as its peers know nothing of them.
func (e *entry) share(sv uint64, lim Limit, w, el, prev int64) (n, unreported int64) {
	nodes, rank, delay := int(sv>>48), int(sv>>32&0xffff), int64(uint32(sv))
	base := int64(e.pubOld)
	if el >= int64(e.pubAt)+delay {
		base = int64(e.pubNew)
	}
	unreported = e.local[w&1] - base
	rem := lim.Limit - estimate(lim, el, prev, base+e.remote[w&1])
	if rem <= 0 {
		return 0, unreported
	}
	p := (w - 1) & 1
	own := base
	if e.marks&(published<<p) != 0 {
		own += e.local[p]
	}
	all := own + e.remote[p] + e.remote[w&1]
	// Its peers' reports of w−1 may still be on their way until a share
	// delay (a round trip, the longest lately seen) into w: with none of
	// them yet, its own hits of w−1 alone would weigh as every node's, and
	// every node would take most of what remains at once. So until then it
	// takes a first share, as for a key no count of is known.
	if e.remote[p] == 0 && e.remote[w&1] == 0 && el < delay {
		all = 0
	}
	return share.Split{Nodes: nodes, Rank: rank}.Of(lim.Limit, rem, own, all, w), unreported
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
