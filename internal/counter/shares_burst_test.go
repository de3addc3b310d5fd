package counter

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// burstLoad offers per hits, perMS a ms (all in the first ms when perMS is
// 0), to each node of on, from ms from on.
func burstLoad(on []int, per, perMS int, from int64) func(int, int64) int {
	done := map[int]int{}
	return func(i int, ms int64) int {
		if ms < from || !slices.Contains(on, i) {
			return 0
		}
		n := per - done[i]
		if perMS > 0 {
			n = min(n, perMS)
		}
		done[i] += n
		return n
	}
}

// TestSharesBurstOnANewKey: bursts on a key that no node has counted, on
// three nodes with a limit of 100: twice the limit back to back on one node
// (5 hits a ms, 40 ms: what one client sends through Envoy) while the
// others spend nothing of it, paced one a ms, in turn over the nodes; then
// on every node at once, paced and all in one ms, the first window's worst
// case; and one node's burst in the key's second window.
func TestSharesBurstOnANewKey(t *testing.T) {
	const limit = 100
	lim := Limit{Limit: limit, ScaleMS: 1000}
	w0 := int64(1_000_000_000_000) // a window start
	from := w0 + 50
	for _, tc := range []struct {
		name     string
		on       []int
		per      int
		perMS    int
		second   bool
		min, max int
	}{
		{name: "one node, back to back", on: []int{0}, per: 200, perMS: 5, min: 90, max: limit},
		{name: "one node, paced", on: []int{0}, per: 200, perMS: 1, min: 95, max: limit},
		{name: "round-robin", on: []int{0, 1, 2}, per: 67, perMS: 2, min: 90, max: limit + 2},
		{name: "every node, back to back", on: []int{0, 1, 2}, per: 200, perMS: 5, min: limit, max: 150},
		{name: "every node at once", on: []int{0, 1, 2}, per: 200, min: limit, max: 150},
		{name: "one node, second window", on: []int{0}, per: 200, perMS: 5, second: true, min: 90, max: limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := newSimNet(lim, 3)
			start, load := from, burstLoad(tc.on, tc.per, tc.perMS, from)
			if tc.second {
				first := burstLoad(tc.on, tc.per, tc.perMS, from)
				second := burstLoad(tc.on, tc.per, tc.perMS, from+lim.ScaleMS)
				load = func(i int, ms int64) int { return first(i, ms) + second(i, ms) }
				from += lim.ScaleMS
			}
			at := net.run(t, start, from+lim.ScaleMS-50, load)
			got, perNode, reach := 0, make([]int, len(at)), []int64{}
			for i, node := range at {
				for _, ms := range node {
					if ms >= from {
						got++
						perNode[i]++
						reach = append(reach, ms-from)
					}
				}
			}
			t.Logf("%s: admitted %d %v of %d offered", tc.name, got, perNode, tc.per*len(tc.on))
			if got < tc.min || got > tc.max {
				t.Errorf("%s: admitted %d, want %d to %d", tc.name, got, tc.min, tc.max)
			}
			if testing.Verbose() {
				slices.Sort(reach)
				t.Logf("admitted at (ms from the burst's start): %v", fmt.Sprint(reach))
			}
		})
	}
}

// TestSharesUnreportedPreviousWindowWeighsNothing: hits a node took of a
// key's previous window without reporting them (below half its share)
// weigh nothing in its split, as its peers know nothing of them: three
// nodes that each took 20 such hits and then burst at once, before
// hearing of each other, admit their first shares, 1.5 × the limit in
// all, not 3 × ⌈100 × (20 + 2)/(20 + 3×2)⌉ = 255.
func TestSharesUnreportedPreviousWindowWeighsNothing(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000) // a window start
	total := 0
	for rank := range 3 {
		s := shareStore(t, share.Split{Nodes: 3, Rank: rank, Delay: 10 * time.Millisecond})
		for range 20 {
			if !s.Take(0, "k", lim, w0.Add(-500*time.Millisecond)).Allowed {
				t.Fatal("denied within the first share")
			}
		}
		if out, _ := s.Changes(nil, w0.Add(-500*time.Millisecond)); len(out) != 0 {
			t.Fatalf("20 hits of a first share of 50 reported: %+v", out)
		}
		total += admitAll(s, "k", lim, w0.Add(time.Millisecond))
	}
	if total != 150 {
		t.Errorf("the three nodes admitted %d in the next window before hearing of each other, want their first shares, 150", total)
	}
}
