package counter

import (
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// TestSharesOfHugeCountsDoNotOverflow: a previous window counted far past
// a huge limit (Incr counts without admission) still leaves this node its
// share; rem × num exceeds 2^63 there.
func TestSharesOfHugeCountsDoNotOverflow(t *testing.T) {
	lim := Limit{Limit: MaxLimit, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000)
	s := shareStore(t, share.Split{Nodes: 2, Rank: 0, Delay: 10 * time.Millisecond})
	s.Incr(0, "k", lim, 5*MaxLimit/2, w0.Add(-500*time.Millisecond)) // previous window
	n := 0
	for n < 1000 && s.Take(0, "k", lim, w0.Add(5*time.Millisecond)).Allowed {
		n++
	}
	t.Logf("admitted %d of a fresh window with limit %d, 2 nodes", n, int64(MaxLimit))
	if n < 1000 {
		t.Errorf("admitted %d, want >=1000 (share should be ~all of %d)", n, int64(MaxLimit))
	}
}

// TestSharesSlidingPreviousWindowIsReported: hits of a Sliding key's
// previous window that stayed below half a share are reported once the key
// moves on, since they still weigh in every node's estimate: with every
// report exchanged at once, two nodes admit no more than the limit.
func TestSharesSlidingPreviousWindowIsReported(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000, Algorithm: Sliding}
	w0 := time.UnixMilli(1_000_000_000_000)
	a := shareStore(t, share.Split{Nodes: 2, Rank: 0, Delay: 10 * time.Millisecond})
	b := shareStore(t, share.Split{Nodes: 2, Rank: 1, Delay: 10 * time.Millisecond})
	exchange := func(now time.Time) {
		ca, _ := a.Changes(nil, now)
		cb, _ := b.Changes(nil, now)
		for _, c := range ca {
			b.Merge(1, c, now)
		}
		for _, c := range cb {
			a.Merge(2, c, now)
		}
	}
	prevAt := w0.Add(-10 * time.Millisecond)
	for i := 0; i < 24; i++ {
		a.Take(0, "k", lim, prevAt)
		exchange(prevAt)
		b.Take(0, "k", lim, prevAt)
		exchange(prevAt)
	}
	at := w0.Add(1 * time.Millisecond)
	got := 0
	for i := 0; i < 200; i++ {
		for _, s := range []*Store{a, b} {
			if s.Take(0, "k", lim, at).Allowed {
				got++
			}
			exchange(at)
		}
	}
	// the previous window held 48 hits; weight 999/1000: ~52 remain.
	t.Logf("previous window 48 hits; admitted %d more at 1 ms into the next window (limit 100)", got)
	if got > 52+1 {
		t.Errorf("cluster admitted %d, estimate now %d > limit 100", got, 48+got)
	}
}

// TestSharesPeerAheadDoesNotStarve: a peer whose clock is ahead reports the
// next window, which moves the key on while this node's window is still the
// one before; the node keeps admitting under the limit.
func TestSharesPeerAheadDoesNotStarve(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000)
	w := w0.UnixMilli() / 1000
	a := shareStore(t, share.Split{Nodes: 2, Rank: 0, Delay: 10 * time.Millisecond})
	at := w0.Add(100 * time.Millisecond)
	n := 0
	for i := 0; i < 45; i++ {
		if a.Take(0, "k", lim, at).Allowed {
			n++
		}
	}
	a.Changes(nil, at) // reported 45 hits
	t.Logf("admitted %d before", n)
	// a peer whose clock is ahead reports 1 hit in window w+1
	if st := a.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: w + 1, Count: 1}, at); st != Merged {
		t.Fatal(st)
	}
	later := at.Add(50 * time.Millisecond)
	m := 0
	for i := 0; i < 20; i++ {
		r := a.Take(0, "k", lim, later)
		if r.Allowed {
			m++
		}
		a.Changes(nil, later)
		later = later.Add(30 * time.Millisecond)
	}
	t.Logf("window w: 45 admitted and reported; after a peer's w+1 report, %d of 20 more admitted (limit 100, nothing else counted in w)", m)
	if m < 20 {
		t.Errorf("admitted %d of 20 with 55 of the budget left", m)
	}
}

// TestReportedIncludesSlidingPreviousWindow: anti-entropy resends a Sliding
// key's previous window, which still weighs in every estimate, once the key
// is hit in the new one, with shares on or off.
func TestReportedIncludesSlidingPreviousWindow(t *testing.T) {
	for _, sh := range []share.Split{{Nodes: 1}, {Nodes: 2, Rank: 0, Delay: 10 * time.Millisecond}} {
		lim := Limit{Limit: 100, ScaleMS: 1000, Algorithm: Sliding}
		w0 := time.UnixMilli(1_000_000_000_000)
		s := shareStore(t, sh)
		for i := 0; i < 40; i++ { // past half of a first share of 75
			s.Take(0, "k", lim, w0.Add(-10*time.Millisecond))
		}
		out, _ := s.Changes(nil, w0.Add(-5*time.Millisecond)) // published; suppose the batch is lost
		s.Take(0, "k", lim, w0.Add(5*time.Millisecond))
		if sh.Nodes == 1 {
			s.Changes(nil, w0.Add(6*time.Millisecond))
		}
		rep := s.Reported(nil, w0.Add(10*time.Millisecond))
		t.Logf("nodes %d: published %+v; anti-entropy in the next window: %+v", sh.Nodes, out, rep)
		found := false
		for _, c := range rep {
			if c.Window == w0.UnixMilli()/1000-1 {
				found = true
			}
		}
		if !found {
			t.Errorf("nodes %d: the previous window's 40 (weight ~99%% now) is not in Reported", sh.Nodes)
		}
	}
}

// TestSharesSlidingHoldsTheLimitOnNNodes: 1 to 8 nodes each take just
// under half a share of a Sliding key's previous window, unreported, then
// spend the next window with every report exchanged at once: the estimate
// never passes the limit, which it would if those hits stayed unreported.
func TestSharesSlidingHoldsTheLimitOnNNodes(t *testing.T) {
	for _, nodes := range []int{1, 2, 4, 8} {
		lim := Limit{Limit: 1000, ScaleMS: 1000, Algorithm: Sliding}
		w0 := time.UnixMilli(1_000_000_000_000)
		st := make([]*Store, nodes)
		for i := range st {
			st[i] = shareStore(t, share.Split{Nodes: nodes, Rank: i, Delay: 10 * time.Millisecond})
		}
		exchange := func(now time.Time) {
			for i, s := range st {
				out, _ := s.Changes(nil, now)
				for j, r := range st {
					if j != i {
						for _, c := range out {
							r.Merge(PeerID(i+1), c, now)
						}
					}
				}
			}
		}
		prevAt := w0.Add(-10 * time.Millisecond)
		// each node takes hits until it would mark (below half its share)
		prev := 0
		for _, s := range st {
			for k := 0; k < 1000/nodes/2-1; k++ {
				s.Take(0, "k", lim, prevAt)
				prev++
			}
			if out, _ := s.Changes(nil, prevAt); len(out) > 0 && nodes > 1 {
				t.Fatalf("nodes %d: marked %v", nodes, out)
			}
		}
		exchange(prevAt)
		at := w0.Add(1 * time.Millisecond)
		got := 0
		for round := 0; round < 2000; round++ {
			any := false
			for _, s := range st {
				if s.Take(0, "k", lim, at).Allowed {
					got++
					any = true
				}
				exchange(at)
			}
			if !any {
				break
			}
		}
		t.Logf("nodes %d: previous window %d hits; %d admitted 1 ms into the next (limit 1000, estimate %d)", nodes, prev, got, prev+got)
		if prev+got > 1000+nodes {
			t.Errorf("%d nodes: the estimate reached %d of a limit of 1000", nodes, prev+got)
		}
	}
}
