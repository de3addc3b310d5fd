package counter

import (
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// TestIncrPublishesLikeTakeN: with shares on, a charge (Incr) is
// published as a hit admitted by TakeN would be: near once this node's
// unreported hits reach half its share, and Spent (published at once)
// once they exceed the share, where a TakeN would have been denied.
func TestIncrPublishesLikeTakeN(t *testing.T) {
	s := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 15 * time.Millisecond})
	lim := Limit{Limit: 10000, ScaleMS: 60_000} // first share: 1.5/3 of it, 5000
	now := at(t, "10:00:10.000")
	step := func(n int64, near, spent bool) {
		t.Helper()
		s.Incr(0, "tenant", lim, n, now)
		if got := signalled(s); got != near {
			t.Errorf("after a charge of %d: near %v, want %v", n, got, near)
		}
		if got := s.Spent(); got != spent {
			t.Errorf("after a charge of %d: spent %v, want %v", n, got, spent)
		}
	}
	step(1000, false, false) // 1000 unreported of a share of 5000
	step(1000, false, false) // 2000
	step(500, true, false)   // 2500: half the share
	step(1000, true, false)  // 3500
	step(1500, true, false)  // 5000: the whole share, as a TakeN may take
	step(1, true, true)      // 5001: a TakeN would be denied
	if s.Spent() {
		t.Error("Spent does not clear when read")
	}
	// Once reported and in effect, the share is of what then remains.
	s.Changes(nil, now)
	now = now.Add(20 * time.Millisecond)
	// The 5001 reported and in effect: 1000 unreported of a share of most
	// of the 4999 left (this node's reported hits weigh), near only as
	// less than half the limit remains.
	step(1000, true, false)
}

// TestIncrSpentWithoutShares: without shares a charge is published at
// once when it takes the key from admitting to denying, and only then.
func TestIncrSpentWithoutShares(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.500")
	if s.Incr(0, "k", lim, 4, now); s.Spent() {
		t.Fatal("spent at 4 of 10")
	}
	if s.Incr(0, "k", lim, 5, now); s.Spent() {
		t.Fatal("spent at 9 of 10")
	}
	if s.Incr(0, "k", lim, 1, now); !s.Spent() || !signalled(s) {
		t.Fatal("the charge that reached the limit is not spent and signalled")
	}
	if s.Incr(0, "k", lim, 1, now); s.Spent() {
		t.Fatal("a charge past a spent budget spent it again")
	}
	// Peer counts are part of the view: a charge that crosses with them
	// spends the budget.
	s.Merge(1, WindowCount{Key: "r", ScaleMS: 1000, Window: now.UnixMilli() / 1000, Count: 8}, now)
	if s.Incr(0, "r", lim, 3, now); !s.Spent() {
		t.Fatal("8 merged and 3 charged: not spent")
	}
	// An untracked store never notes anything.
	u := newStore(t, Config{})
	if u.Incr(0, "k", lim, 20, now); u.Spent() {
		t.Fatal("an untracked store noted a spent budget")
	}
}
