// Package share is the budget-sharing policy of ratelimit-authz: how
// those who spend one budget at once, each without asking the others,
// split it so that together they spend about the budget. Two kinds of
// spender share a budget:
//
//   - the nodes of a cluster admitting a key's hits: package replicate
//     sets each node's [Split] (the live nodes, this node's rank, the
//     [Delay] before a report is in effect) and package counter admits up
//     to [Split.Of] what remains of the key's budget;
//   - the RLQS participants of a bucket: package rlqs assigns each
//     participant its [Participant] share as a token bucket.
//
// Invariants: a share depends on its arguments alone, so spenders that
// hold the same counts compute shares that fit together: the nodes'
// shares add up to what remains, rounded up (each is at least 1), or to
// 1.5 × what remains while no count of the key is known; the
// participants' add up to at most what remains. No state, no clock, no
// import of the server.
//
// Failure mode: none at run time. A Participant call whose inputs do not
// fit gets 0, nothing assigned; Split.Of takes a split the counter
// validated (counter.Store.SetShares).
//
// Why the nodes split as they do, the first share of a new key and the
// figures: docs/design/budget-shares.md.
package share

import (
	"math/bits"
	"time"
)

// Split is how the nodes of a cluster split each key's budget.
type Split struct {
	// Nodes is how many live nodes count the keys, this one included. At
	// most 1 turns shares off.
	Nodes int
	// Rank is this node's place among them, in [0, Nodes), in an order
	// every node agrees on: it decides which nodes get the remainder when
	// a budget does not divide evenly.
	Rank int
	// Delay is how long after a node reported a count its peers are taken
	// to hold it: the time to publish and deliver a batch (see [Delay]).
	Delay time.Duration
}

// Of is this node's share of rem, what remains of a key's budget of limit
// in window w (0 < rem ≤ limit ≤ counter.MaxLimit), given own, this
// node's hits of the key that every node knows of, and all, every node's
// hits known so (own included). Nodes must be at least 1 and Rank in
// [0, Nodes).
//
// The share is a part of rem in proportion to own among all, each
// node's weight smoothed by limit/(16 × Nodes) so that a node with no hits
// known still gets some; as every node computes it from the same counts,
// the shares add up to rem, rounded up. With nothing known (all ≤ 0) it
// is the first share, 3 × rem / (2 × Nodes), its remainder going to the
// ranks whose turn it is in window w, so that the first shares add up to
// exactly ⌊1.5 × rem⌋ and no rank gets the remainder in every window.
//
// A share of 0 counts as 1: otherwise a small limit could admit nothing
// at all on a node that carries all the traffic. The cluster may then
// admit up to Nodes − 1 hits over the limit, as without shares.
func (s Split) Of(limit, rem, own, all, w int64) int64 {
	nodes, rank := int64(s.Nodes), int64(s.Rank)
	if all <= 0 {
		turn := (w%nodes + nodes + rank) % nodes
		return max(1, even(rem*3/2, nodes, turn, true))
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

// Participant is the share of remaining that goes to participant rank
// (0 ≤ rank < local) of n participants sharing it cluster-wide, local of
// them on this node: an even split, 0 for inputs that do not fit.
//
// Unlike a node's share, a participant's may be 0 (DENY_ALL): Envoy
// enforces it for a TTL without asking again, and the shares a node hands
// out at one instant must add up to at most what remains. For the same
// reason the remainder goes one each to the lowest ranks only when every
// participant is on this node; otherwise each node rounds down, so that
// the nodes' shares, computed apart, never exceed what remains together.
func Participant(remaining, n, local, rank int64) int64 {
	if remaining <= 0 || n <= 0 || rank < 0 || rank >= local || local > n {
		return 0
	}
	return even(remaining, n, rank, n == local)
}

// even is slot's share (0 ≤ slot < n) of amount ≥ 0 split evenly over n.
// With spread the remainder goes one each to the slots below amount % n,
// so that the n shares add up to exactly amount: for spenders that all
// compute their shares from the same inputs. Without it every share is
// rounded down: for shares computed apart from a part of the spenders
// each, which must not add up to more than amount.
func even(amount, n, slot int64, spread bool) int64 {
	s := amount / n
	if spread && slot < amount%n {
		s++
	}
	return s
}

// Off, as the least delay of [Delay] (replicate.Config.ShareDelay), turns
// shares off: each node admits on its own view, up to the whole limit.
const Off time.Duration = -1

// minRoundTrip is the least round trip Delay assumes of a batch and its
// answer.
const minRoundTrip = 5 * time.Millisecond

// Delay is how long after publishing a count a node takes its peers to
// hold it and their answers to have arrived, at least least: a peer that
// holds unpublished hits of the key publishes them on receipt, within an
// early gap (gap, the least time between two early batches; ≤ 0 without
// early batches: then a sync interval, interval), so the node waits for
// the round trip to its slowest peer (roundTrip: the report's delivery and
// the answer's, at least minRoundTrip) and that gap. It follows the round
// trip however long: a slow network makes shares grow more slowly
// instead of handing out budget its peers may already have spent.
func Delay(least, gap, roundTrip, interval time.Duration) time.Duration {
	if gap <= 0 {
		gap = interval
	}
	return max(least, gap+max(roundTrip, minRoundTrip))
}
