package share

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSplitOfFirstShare: with no count known, each node gets 3/(2 × Nodes)
// of what remains; the remainder goes to the ranks whose turn it is in
// the window, so the first shares add up to ⌊1.5 × rem⌋ and every rank
// gets the remainder in some windows; a share of 0 counts as 1.
func TestSplitOfFirstShare(t *testing.T) {
	for _, tc := range []struct {
		nodes    int
		rem, w   int64
		want     []int64 // by rank
		wantNote string
	}{
		{3, 100, 7, []int64{50, 50, 50}, "150 over 3"},
		{4, 100, 0, []int64{38, 38, 37, 37}, "150 = 37×4 + 2: ranks 0 and 1 in window 0"},
		{4, 100, 1, []int64{38, 37, 37, 38}, "ranks 3 and 0 in window 1"},
		{4, 100, 2, []int64{37, 37, 38, 38}, "ranks 2 and 3 in window 2"},
		{4, 100, -1, []int64{37, 38, 38, 37}, "ranks 1 and 2 in window −1"},
		{3, 1, 0, []int64{1, 1, 1}, "⌊1.5⌋ = 1: one rank's turn, the others' 0 counts as 1"},
		{2, MaxRem, 5, []int64{MaxRem * 3 / 4, MaxRem * 3 / 4}, "the largest rem: no overflow"},
	} {
		var sum int64
		for rank, want := range tc.want {
			got := Split{Nodes: tc.nodes, Rank: rank}.Of(1000, tc.rem, 0, 0, tc.w)
			if got != want {
				t.Errorf("%s: rank %d of %d, rem %d, window %d: %d, want %d", tc.wantNote, rank, tc.nodes, tc.rem, tc.w, got, want)
			}
			sum += got
		}
		if q := tc.rem * 3 / 2; q >= int64(tc.nodes) && sum != q {
			t.Errorf("%s: first shares add up to %d, want ⌊1.5 × %d⌋ = %d", tc.wantNote, sum, tc.rem, q)
		}
	}
}

// MaxRem is the largest rem Of takes: counter.MaxLimit.
const MaxRem = 1<<31 - 1

// TestSplitOfFollowsWeights: once counts are known, a node's share is
// what remains in proportion to its weight, smoothed by limit/(16 ×
// Nodes) (at least 1), rounded up, and at least 1.
func TestSplitOfFollowsWeights(t *testing.T) {
	three := func(rank int) Split { return Split{Nodes: 3, Rank: rank} }
	for _, tc := range []struct {
		sp                   Split
		limit, rem, own, all int64
		want                 int64
		why                  string
	}{
		// Smoothing 100/48 = 2: (25 + 2)/(25 + 6) of 75, rounded up.
		{three(0), 100, 75, 25, 25, 66, "the node that reported 25"},
		{three(1), 100, 75, 0, 25, 5, "a silent peer: 2/31 of 75"},
		{three(0), 100, 75, 10, 30, 25, "10 of 30: 12/36 of 75"},
		{three(0), 100, 76, 10, 30, 26, "12/36 of 76, rounded up"},
		// Smoothing 10/48 rounds to 0: at least 1.
		{three(1), 10, 10, 0, 9, 1, "a silent peer of a small limit: 1/12 of 10"},
		{three(0), 10, 1, 9, 9, 1, "the node holding every count, 1 left"},
		{three(1), 10, 1, 0, 9, 1, "a silent peer, 1 left: rounded up"},
		// Counts beyond 4× the limit are cut there.
		{three(0), 100, 50, 1000, 2000, 50, "own and all cut at 400: 402/406 of 50"},
		{Split{Nodes: 2}, MaxRem, MaxRem, 1 << 40, 1 << 41, 2130964543, "huge counts cut at 4× the limit: (4L + L/32)/(4L + L/16) of L, in 128 bits"},
	} {
		if got := tc.sp.Of(tc.limit, tc.rem, tc.own, tc.all, 0); got != tc.want {
			t.Errorf("%s: %+v.Of(limit %d, rem %d, own %d, all %d) = %d, want %d", tc.why, tc.sp, tc.limit, tc.rem, tc.own, tc.all, got, tc.want)
		}
	}
}

// TestSplitsAddUp: when every node computes its share from the same
// counts (none beyond 4× the limit), the nodes' shares add up to what
// remains, rounded up: at least rem, less than rem + Nodes; their first
// shares to ⌊1.5 × rem⌋, or one each when that is fewer than the nodes.
// The participants' shares on one node add up to at most its part of
// what remains, and to exactly what remains when all are there.
func TestSplitsAddUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		nodes := 1 + rng.IntN(40)
		limit := 1 + rng.Int64N(MaxRem)
		if rng.IntN(2) == 0 {
			limit = 1 + rng.Int64N(1000)
		}
		rem := 1 + rng.Int64N(limit)
		w := rng.Int64N(1<<40) - 1<<39
		weights := make([]int64, nodes)
		var all int64
		if rng.IntN(4) != 0 {
			for i := range weights {
				if rng.IntN(3) != 0 {
					weights[i] = rng.Int64N(4*limit/int64(nodes) + 1)
					all += weights[i]
				}
			}
		}
		var sum int64
		for rank, own := range weights {
			sum += Split{Nodes: nodes, Rank: rank}.Of(limit, rem, own, all, w)
		}
		if all > 0 && (sum < rem || sum >= rem+int64(nodes)) {
			t.Fatalf("%d nodes, limit %d, weights %v: shares of %d add up to %d", nodes, limit, weights, rem, sum)
		}
		if want := max(rem*3/2, int64(nodes)); all == 0 && sum != want {
			t.Fatalf("%d nodes, window %d: first shares of %d add up to %d, want %d", nodes, w, rem, sum, want)
		}

		n := int64(nodes)
		local := 1 + rng.Int64N(n)
		var part int64
		for rank := range local {
			part += Participant(rem, n, local, rank)
		}
		if part*n > rem*local || (local == n && part != rem) {
			t.Fatalf("%d of %d participants: shares of %d add up to %d", local, n, rem, part)
		}
	}
}

// TestEven: spread hands the remainder out one each to the lowest slots,
// so the shares add up to the amount; without it every share is rounded
// down.
func TestEven(t *testing.T) {
	for _, tc := range []struct {
		amount, n int64
		spread    bool
		want      []int64
	}{
		{10, 4, true, []int64{3, 3, 2, 2}},
		{10, 4, false, []int64{2, 2, 2, 2}},
		{3, 4, true, []int64{1, 1, 1, 0}},
		{3, 4, false, []int64{0, 0, 0, 0}},
		{8, 4, true, []int64{2, 2, 2, 2}},
		{0, 2, true, []int64{0, 0}},
	} {
		for slot, want := range tc.want {
			if got := even(tc.amount, tc.n, int64(slot), tc.spread); got != want {
				t.Errorf("even(%d, %d, %d, spread %v) = %d, want %d", tc.amount, tc.n, slot, tc.spread, got, want)
			}
		}
	}
}

// TestDelay: the early gap (a sync interval without early batches) plus
// the round trip, at least 5 ms and however long; at least the configured
// least.
func TestDelay(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		least, gap, roundTrip, interval, want time.Duration
	}{
		{0, 10 * ms, 0, 100 * ms, 15 * ms},
		{0, 10 * ms, -60 * ms, 100 * ms, 15 * ms},
		{0, 10 * ms, 6 * ms, 100 * ms, 16 * ms},
		{0, 10 * ms, 80 * ms, 100 * ms, 90 * ms},
		{0, 10 * ms, 5 * time.Second, 100 * ms, 5010 * ms},
		{0, 0, 0, 100 * ms, 105 * ms},
		{0, -1, 0, 100 * ms, 105 * ms},
		{500 * ms, 10 * ms, 0, 100 * ms, 500 * ms},
		{Off, 10 * ms, 0, 100 * ms, 15 * ms},
	} {
		if got := Delay(tc.least, tc.gap, tc.roundTrip, tc.interval); got != tc.want {
			t.Errorf("Delay(%v, %v, %v, %v) = %v, want %v", tc.least, tc.gap, tc.roundTrip, tc.interval, got, tc.want)
		}
	}
}

// TestParticipant: an even split of what remains; the remainder goes to
// the lowest ranks when every participant is on this node, else each node
// rounds down; a share may be 0.
func TestParticipant(t *testing.T) {
	for _, tc := range []struct {
		remaining, n, local int64
		want                []int64 // by rank
	}{
		{100, 1, 1, []int64{100}},
		{100, 2, 2, []int64{50, 50}},
		{100, 3, 3, []int64{34, 33, 33}},
		{2, 3, 3, []int64{1, 1, 0}},
		{0, 2, 2, []int64{0, 0}},
		{-5, 2, 2, []int64{0, 0}},
		// Participants elsewhere: round down, so that the nodes together
		// never hand out more than remains.
		{100, 3, 1, []int64{33}},
		{100, 3, 2, []int64{33, 33}},
		{2, 3, 1, []int64{0}},
		// Inconsistent inputs give nothing.
		{7, 0, 0, nil},
		{7, 1, 2, []int64{0, 0}},
	} {
		var sum int64
		for rank, w := range tc.want {
			got := Participant(tc.remaining, tc.n, tc.local, int64(rank))
			if got != w {
				t.Errorf("Participant(%d, %d, %d, %d) = %d, want %d", tc.remaining, tc.n, tc.local, rank, got, w)
			}
			sum += got
		}
		if tc.remaining > 0 && tc.n > 0 && tc.n == tc.local && sum != tc.remaining {
			t.Errorf("shares of %d over %d add up to %d", tc.remaining, tc.n, sum)
		}
		if tc.remaining > 0 && tc.n > 0 && tc.local <= tc.n && sum*tc.n > tc.remaining*tc.local+tc.local*tc.n {
			t.Errorf("local shares %d exceed this node's part of %d", sum, tc.remaining)
		}
		if s := Participant(tc.remaining, tc.n, tc.local, tc.local); s != 0 {
			t.Errorf("rank local got %d", s)
		}
		if s := Participant(tc.remaining, tc.n, tc.local, -1); s != 0 {
			t.Errorf("rank -1 got %d", s)
		}
	}
}
