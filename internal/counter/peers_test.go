package counter

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func trackedStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	cfg.Track = true
	return newStore(t, cfg)
}

func sortCounts(cs []WindowCount) []WindowCount {
	slices.SortFunc(cs, func(a, b WindowCount) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		if a.Bucket != b.Bucket {
			return int(a.Bucket) - int(b.Bucket)
		}
		return int(a.Window - b.Window)
	})
	return cs
}

func TestChangesReportRunningCounts(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: 100, ScaleMS: 1000}
	now := at(t, "10:00:00.100")
	w := now.Unix()
	if got, _ := s.Changes(nil, now); len(got) != 0 {
		t.Fatalf("Changes of an empty store: %+v", got)
	}
	s.Take(1, "a", lim, now)
	s.Take(1, "a", lim, now)
	s.Incr(2, "b", lim, 3, now)
	if s.Pending() != 2 {
		t.Errorf("Pending = %d, want 2", s.Pending())
	}
	got, stale := s.Changes(nil, now)
	want := []WindowCount{
		{Bucket: 1, Key: "a", ScaleMS: 1000, Window: w, Count: 2},
		{Bucket: 2, Key: "b", ScaleMS: 1000, Window: w, Count: 3},
	}
	if !slices.Equal(sortCounts(got), want) || stale != 0 {
		t.Fatalf("Changes = %+v, %d; want %+v, 0", got, stale, want)
	}
	if got, _ := s.Changes(nil, now); len(got) != 0 || s.Pending() != 0 {
		t.Fatalf("second Changes without hits: %+v", got)
	}
	// The next report carries the running count, not the increment.
	s.Take(1, "a", lim, now.Add(10*time.Millisecond))
	got, _ = s.Changes(got[:0], now)
	if len(got) != 1 || got[0].Count != 3 {
		t.Fatalf("Changes after a third hit: %+v, want count 3", got)
	}
	// Denied hits, Peeks and Releases are not changes.
	s2 := trackedStore(t, Config{})
	one := Limit{Limit: 1, ScaleMS: 1000}
	r := s2.Take(0, "k", one, now)
	s2.Changes(nil, now)
	s2.Take(0, "k", one, now)
	s2.Peek(0, "k", one, now)
	s2.Release(0, "k", one, r.Window)
	if got, _ := s2.Changes(nil, now); len(got) != 0 {
		t.Errorf("denied hit, Peek or Release reported: %+v", got)
	}
}

func TestChangesOffWithoutTrack(t *testing.T) {
	s := newStore(t, Config{})
	now := at(t, "10:00:00.000")
	s.Take(0, "k", Limit{Limit: 5, ScaleMS: 1000}, now)
	if got, _ := s.Changes(nil, now); len(got) != 0 || s.Pending() != 0 {
		t.Errorf("untracked store reported changes: %+v", got)
	}
}

func TestChangesWindows(t *testing.T) {
	for _, alg := range []Algorithm{Fixed, Sliding} {
		t.Run(alg.String(), func(t *testing.T) {
			s := trackedStore(t, Config{})
			lim := Limit{Limit: 100, ScaleMS: 1000, Algorithm: alg}
			s.Take(0, "k", lim, at(t, "10:00:00.900"))
			s.Take(0, "k", lim, at(t, "10:00:01.100"))
			s.Take(0, "k", lim, at(t, "10:00:01.200"))
			w := at(t, "10:00:01.000").Unix()
			got, stale := s.Changes(nil, at(t, "10:00:01.300"))
			want := []WindowCount{{Key: "k", ScaleMS: 1000, Algorithm: alg, Window: w, Count: 2}}
			wantStale := 1 // Fixed: window w−1 has ended
			if alg == Sliding {
				// The previous window still weighs in the estimate.
				want = []WindowCount{{Key: "k", ScaleMS: 1000, Algorithm: alg, Window: w - 1, Count: 1}, want[0]}
				wantStale = 0
			}
			if !slices.Equal(sortCounts(got), want) || stale != wantStale {
				t.Errorf("Changes = %+v, stale %d; want %+v, %d", got, stale, want, wantStale)
			}
			// Changes made in a window that has ended by the report are dropped.
			s.Take(0, "k", lim, at(t, "10:00:01.500"))
			if got, stale := s.Changes(nil, at(t, "10:00:03.000")); len(got) != 0 || stale != 1 {
				t.Errorf("Changes two windows on = %+v, stale %d", got, stale)
			}
		})
	}
}

func TestChangesDoNotRetainCallerKeys(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: 5, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	hdr := string([]byte("203.0.113.45, 10.0.0.1, 10.0.0.2"))
	s.Take(0, hdr[:12], lim, now) // inserts (the map clones the key)
	s.Changes(nil, now)
	s.Take(0, hdr[:12], lim, now) // an existing key, marked again
	got, _ := s.Changes(nil, now)
	if len(got) != 1 || got[0].Key != "203.0.113.45" {
		t.Fatalf("Changes = %+v", got)
	}
	if unsafe.StringData(got[0].Key) == unsafe.StringData(hdr) {
		t.Error("a reported key aliases the caller's string")
	}
}

func TestTrackedTakeDoesNotAllocate(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: MaxLimit, ScaleMS: 1000}
	now := at(t, "10:00:00.500")
	keys := []string{"a", "b", "c"}
	var buf []WindowCount
	for range 3 { // grow the change lists once
		for _, k := range keys {
			s.Take(0, k, lim, now)
		}
		buf, _ = s.Changes(buf[:0], now)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		for _, k := range keys {
			s.Take(0, k, lim, now)
		}
	})
	if allocs != 0 {
		t.Errorf("tracked Take allocates %v per run, want 0", allocs)
	}
}

// merge is a table-test step of Merge.
type mergeStep struct {
	at    string
	peer  PeerID
	win   int64 // relative to 10:00:00's window
	n     int64
	want  MergeStatus
	total int64 // total of window win afterwards (−1: do not check)
}

func runMerges(t *testing.T, s *Store, lim Limit, steps []mergeStep) {
	t.Helper()
	base := at(t, "10:00:00.000").UnixMilli() / lim.ScaleMS
	for i, st := range steps {
		c := WindowCount{Bucket: 3, Key: "k", ScaleMS: lim.ScaleMS, Algorithm: lim.Algorithm, Window: base + st.win, Count: st.n}
		if got := s.Merge(st.peer, c, at(t, st.at)); got != st.want {
			t.Errorf("step %d: Merge(peer %d, win %+d, %d) at %s = %v, want %v", i, st.peer, st.win, st.n, st.at, got, st.want)
		}
		if st.total >= 0 {
			if _, tot := s.Count(3, "k", lim, base+st.win); tot != st.total {
				t.Errorf("step %d: total %d, want %d", i, tot, st.total)
			}
		}
	}
}

func TestMerge(t *testing.T) {
	fixed := Limit{Limit: 100, ScaleMS: 1000}
	sliding := Limit{Limit: 100, ScaleMS: 1000, Algorithm: Sliding}
	tests := []struct {
		name  string
		lim   Limit
		steps []mergeStep
	}{
		{"max per peer, sum over peers", fixed, []mergeStep{
			{"10:00:00.100", 1, 0, 5, Merged, 5},
			{"10:00:00.200", 1, 0, 5, Unchanged, 5}, // duplicate
			{"10:00:00.300", 1, 0, 3, Unchanged, 5}, // late, reordered
			{"10:00:00.400", 2, 0, 4, Merged, 9},
			{"10:00:00.500", 1, 0, 9, Merged, 13}, // a lost report (7) repaired
			{"10:00:00.600", 2, 0, 0, Unchanged, 13},
		}},
		{"stale and future windows, fixed", fixed, []mergeStep{
			{"10:00:01.000", 1, -1, 5, Stale, -1}, // ended before the previous
			{"10:00:01.000", 1, 0, 5, Merged, -1}, // the previous: it weighs in the shares
			{"10:00:01.000", 1, 3, 5, Stale, -1},  // too far ahead
			{"10:00:01.000", 1, 2, 5, Merged, 5},  // a peer a little ahead
			{"10:00:01.000", 1, 1, 2, Merged, 2},
			{"10:00:02.000", 1, 2, 6, Merged, 6},
			{"10:00:02.000", 1, 1, 9, Merged, -1},
			{"10:00:02.000", 1, 0, 9, Stale, -1},
		}},
		{"sliding keeps the previous window", sliding, []mergeStep{
			{"10:00:01.000", 1, 0, 5, Merged, 5},
			{"10:00:01.000", 1, -1, 5, Stale, -1},
			{"10:00:01.500", 2, 1, 1, Merged, 1},
			// now's window + 1 would drop window 0, still read at 10:00:01.
			{"10:00:01.900", 1, 2, 7, Deferred, -1},
			{"10:00:02.000", 1, 2, 7, Merged, 7},
			{"10:00:02.000", 1, 1, 3, Merged, 4},
		}},
		{"invalid", fixed, []mergeStep{
			{"10:00:00.000", Self, 0, 1, Invalid, 0},
			{"10:00:00.000", 1, 0, -1, Invalid, 0},
			{"10:00:00.000", 1, 0, MaxCount + 1, Invalid, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runMerges(t, trackedStore(t, Config{}), tt.lim, tt.steps)
		})
	}
}

func TestMergeWithLocalCounts(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.100")
	w := now.Unix()
	for range 3 {
		s.Take(0, "k", lim, now)
	}
	wc := WindowCount{Key: "k", ScaleMS: 1000, Window: w, Count: 4}
	if st := s.Merge(1, wc, now); st != Merged {
		t.Fatalf("Merge = %v", st)
	}
	wc.Count = 2
	s.Merge(2, wc, now)
	// 3 local + 4 + 2 remote: the 10th hit is the last.
	if r := s.Take(0, "k", lim, now); !r.Allowed || r.Count != 10 {
		t.Fatalf("Take = %+v", r)
	}
	if r := s.Take(0, "k", lim, now); r.Allowed {
		t.Fatalf("11th hit admitted: %+v", r)
	}
	// Merged counts are not this node's changes.
	got, _ := s.Changes(nil, now)
	if len(got) != 1 || got[0].Count != 4 {
		t.Errorf("Changes = %+v, want only the local 4", got)
	}
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 4 || tot != 10 {
		t.Errorf("Count = %d, %d", l, tot)
	}
}

func TestMergeMismatchAndBounds(t *testing.T) {
	now := at(t, "10:00:00.100")
	w := now.Unix()
	s := trackedStore(t, Config{MaxKeys: 1, Shards: 1, MaxPeersPerKey: 2})
	s.Take(0, "k", Limit{Limit: 5, ScaleMS: 1000}, now)
	if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 60_000, Window: now.UnixMilli() / 60_000, Count: 1}, now); st != Mismatch {
		t.Errorf("other scale: %v, want Mismatch", st)
	}
	if st := s.Merge(1, WindowCount{Key: "other", ScaleMS: 1000, Window: w, Count: 1}, now); st != Refused || s.Refused() != 1 {
		t.Errorf("new key at the bound: %v, Refused %d", st, s.Refused())
	}
	wc := WindowCount{Key: "k", ScaleMS: 1000, Window: w, Count: 1}
	for p := PeerID(1); p <= 2; p++ {
		if st := s.Merge(p, wc, now); st != Merged {
			t.Fatalf("peer %d: %v", p, st)
		}
	}
	if st := s.Merge(3, wc, now); st != Refused {
		t.Errorf("third peer of a key with MaxPeersPerKey 2: %v, want Refused", st)
	}
	// Once the entry no longer holds their window, the old peers' counts
	// make room.
	later := now.Add(2 * time.Second)
	s.Take(0, "k", Limit{Limit: 5, ScaleMS: 1000}, later)
	wc.Window += 2
	if st := s.Merge(3, wc, later); st != Merged {
		t.Errorf("third peer in the next window: %v, want Merged", st)
	}
}

func TestMergeAfterReset(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: 100, ScaleMS: 1000}
	now := at(t, "10:00:00.100")
	w := now.Unix()
	wc := WindowCount{Key: "k", ScaleMS: 1000, Window: w, Count: 3}
	s.Merge(1, wc, now)
	// The local clock jumps ahead then back: the entry is reset twice and
	// every count in it, the peer's included, is forgotten.
	s.Take(0, "k", lim, now.Add(3*time.Second))
	s.Take(0, "k", lim, now)
	if _, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); tot != 1 {
		t.Fatalf("after reset: total %d, want 1", tot)
	}
	// The peer repeats its running count: it must count again.
	if st := s.Merge(1, wc, now); st != Merged {
		t.Fatalf("Merge after reset = %v, want Merged", st)
	}
	if _, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); tot != 4 {
		t.Errorf("total %d, want 4", tot)
	}
}

func TestSweepDropsPeerCounts(t *testing.T) {
	s := trackedStore(t, Config{Shards: 1})
	now := at(t, "10:00:00.100")
	s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: now.Unix(), Count: 3}, now)
	if len(s.shards[0].peers) != 1 {
		t.Fatalf("peer counts not held")
	}
	if n := s.Sweep(now.Add(time.Second)); n != 1 || len(s.shards[0].peers) != 0 {
		t.Errorf("Sweep removed %d, %d peer records left", n, len(s.shards[0].peers))
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	a := trackedStore(t, Config{})
	lim := Limit{Limit: 1000, ScaleMS: 1000, Algorithm: Sliding}
	now := at(t, "10:00:01.500")
	w := now.Unix()
	a.Incr(0, "k", lim, 7, now.Add(-time.Second)) // previous window, still live for Sliding
	a.Incr(0, "k", lim, 2, now)
	a.Merge(5, WindowCount{Key: "k", ScaleMS: 1000, Algorithm: Sliding, Window: w, Count: 4}, now)
	a.Merge(6, WindowCount{Bucket: 1, Key: "x", ScaleMS: 1000, Algorithm: Sliding, Window: w - 1, Count: 9}, now)
	a.Take(2, "old", Limit{Limit: 5, ScaleMS: 1000}, now.Add(-time.Second)) // Fixed, ended

	snap := a.LiveCounts(nil, now)
	if len(snap) != 4 {
		t.Fatalf("Snapshot = %+v, want 4 counts", snap)
	}
	// A node warm-starting from a gives each origin an id of its own.
	b := trackedStore(t, Config{})
	ids := map[PeerID]PeerID{Self: 10, 5: 11, 6: 12}
	for _, pc := range snap {
		if st := b.Merge(ids[pc.Peer], pc.WindowCount, now); st != Merged {
			t.Errorf("Merge(%+v) = %v", pc, st)
		}
	}
	for _, c := range []struct {
		bucket    Bucket
		key       string
		win, want int64
	}{{0, "k", w - 1, 7}, {0, "k", w, 6}, {1, "x", w - 1, 9}, {2, "old", w - 1, 0}} {
		if _, tot := b.Count(c.bucket, c.key, Limit{Limit: 1, ScaleMS: 1000}, c.win); tot != c.want {
			t.Errorf("%d/%s window %+d: total %d, want %d", c.bucket, c.key, c.win-w, tot, c.want)
		}
	}
	// Importing the same snapshot again, or a second responder's
	// overlapping one, changes nothing.
	for _, pc := range snap {
		if st := b.Merge(ids[pc.Peer], pc.WindowCount, now); st != Unchanged {
			t.Errorf("repeated Merge(%+v) = %v", pc, st)
		}
	}
	if got, _ := b.Changes(nil, now); len(got) != 0 {
		t.Errorf("imported counts reported as own changes: %+v", got)
	}
}

// TestMergeConverges replays each peer's reports with loss, duplication and
// reordering: the total is always the sum of each peer's highest report.
func TestMergeConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	now := at(t, "10:00:00.500")
	w := now.Unix()
	for round := range 200 {
		s := trackedStore(t, Config{})
		var want int64
		var reports []WindowCount
		var peers []PeerID
		npeers := PeerID(1 + rng.IntN(4))
		for p := PeerID(1); p <= npeers; p++ {
			var run int64
			var last int64
			for range 1 + rng.IntN(10) {
				run += 1 + rng.Int64N(5)
				if rng.IntN(4) != 0 { // a quarter of the reports are lost
					wc := WindowCount{Key: "k", ScaleMS: 1000, Window: w, Count: run}
					reports = append(reports, wc)
					peers = append(peers, p)
					if rng.IntN(3) == 0 { // duplicated
						reports = append(reports, wc)
						peers = append(peers, p)
					}
					last = run
				}
			}
			want += last
		}
		perm := rng.Perm(len(reports))
		for _, i := range perm {
			s.Merge(peers[i], reports[i], now)
		}
		if _, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); tot != want {
			t.Fatalf("round %d: total %d, want %d", round, tot, want)
		}
	}
}

func TestConcurrentTrackAndMerge(t *testing.T) {
	s := trackedStore(t, Config{Shards: 4})
	lim := Limit{Limit: MaxLimit, ScaleMS: 60_000}
	now := at(t, "10:00:00.000")
	w := now.UnixMilli() / 60_000
	const keys, hits = 50, 200
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range hits {
				s.Take(0, fmt.Sprint("k", (g*hits+i)%keys), lim, now)
			}
		})
	}
	reported := map[string]int64{}
	var mu sync.Mutex
	wg.Go(func() {
		for i := range 200 {
			got, _ := s.Changes(nil, now)
			mu.Lock()
			for _, c := range got {
				reported[c.Key] = max(reported[c.Key], c.Count)
			}
			mu.Unlock()
			s.Merge(1, WindowCount{Key: fmt.Sprint("k", i%keys), ScaleMS: 60_000, Window: w, Count: int64(i)}, now)
		}
	})
	wg.Wait()
	got, _ := s.Changes(nil, now)
	for _, c := range got {
		reported[c.Key] = max(reported[c.Key], c.Count)
	}
	var sum int64
	for k, n := range reported {
		if l, _ := s.Count(0, k, Limit{Limit: 1, ScaleMS: 60_000}, w); l != n {
			t.Errorf("%s: reported %d, local %d", k, n, l)
		}
		sum += n
	}
	if sum != 4*hits {
		t.Errorf("reported %d hits in all, want %d", sum, 4*hits)
	}
}

func TestChangedListBoundedWithoutChanges(t *testing.T) {
	// NATS is away for long: Changes is not called, keys come and go.
	s := trackedStore(t, Config{Shards: 1, MaxKeys: 100})
	lim := Limit{Limit: 5, ScaleMS: 1000}
	start := at(t, "10:00:00.000")
	for i := range 10_000 {
		now := start.Add(time.Duration(i) * 10 * time.Millisecond)
		s.Take(0, fmt.Sprint("key-", i), lim, now)
	}
	sh := &s.shards[0]
	if len(sh.changed) > 200 || len(sh.keys) > 200*len("key-10000") {
		t.Errorf("changed list of %d entries, %d key bytes for ≤ 100 live keys", len(sh.changed), len(sh.keys))
	}
	// What is still live is still reported, with its key.
	now := start.Add(9999 * 10 * time.Millisecond)
	got, _ := s.Changes(nil, now)
	if !slices.ContainsFunc(got, func(c WindowCount) bool { return c.Key == "key-9999" }) {
		t.Errorf("the latest key is not reported: %d changes", len(got))
	}
	for _, c := range got {
		if !strings.HasPrefix(c.Key, "key-") || c.Count != 1 {
			t.Errorf("change %+v", c)
		}
	}
}

// signalled reports whether NearLimit holds a signal, and takes it.
func signalled(s *Store) bool {
	select {
	case <-s.NearLimit():
		return true
	default:
		return false
	}
}

func TestNearLimit(t *testing.T) {
	if s := newStore(t, Config{}); s.NearLimit() != nil {
		t.Fatal("NearLimit is not nil without Track")
	}
	s := trackedStore(t, Config{})
	now := at(t, "10:00:00.500")
	lim := Limit{Limit: 20, ScaleMS: 1000} // margin: 10 left
	for i := 1; i <= 9; i++ {
		s.Take(0, "k", lim, now)
		if signalled(s) {
			t.Fatalf("signal after take %d of 20 (%d left)", i, 20-i)
		}
	}
	// The 10th leaves 10: near. Signals coalesce while unread.
	s.Take(0, "k", lim, now)
	s.Take(0, "k", lim, now)
	if !signalled(s) || signalled(s) {
		t.Fatal("want exactly one coalesced signal at 10 and 9 left")
	}
	for range 9 {
		s.Take(0, "k", lim, now)
	}
	if !signalled(s) {
		t.Fatal("no signal at 0 left")
	}
	if s.Take(0, "k", lim, now).Allowed || signalled(s) {
		t.Fatal("a denied take changes nothing and must not signal")
	}
	// Remote counts bring a key near too: the local hit that follows signals.
	s.Merge(1, WindowCount{Key: "r", ScaleMS: 1000, Window: now.UnixMilli() / 1000, Count: 9}, now)
	if signalled(s) {
		t.Fatal("Merge signalled")
	}
	if s.Take(0, "r", lim, now); !signalled(s) {
		t.Fatal("no signal at 10 left after a merge")
	}
	// Sliding: the previous window's weight counts.
	sl := Limit{Limit: 20, ScaleMS: 1000, Algorithm: Sliding}
	s.Incr(0, "sl", sl, 18, at(t, "09:59:59.500"))
	signalled(s)
	if s.Take(0, "sl", sl, now); !signalled(s) { // 18×0.5 + 1 = 10 used
		t.Fatal("no signal at 10 left of a sliding estimate")
	}
	// Limits of 1 and 2: the margin is 1.
	small := Limit{Limit: 3, ScaleMS: 1000}
	s.Take(0, "s", small, now)
	if signalled(s) {
		t.Fatal("signal at 2 of 3 left")
	}
	if s.Take(0, "s", small, now); !signalled(s) {
		t.Fatal("no signal at 1 of 3 left")
	}
	if s.Take(0, "one", Limit{Limit: 1, ScaleMS: 1000}, now); !signalled(s) {
		t.Fatal("no signal at 0 of 1 left")
	}
	// Incr counts unconditionally, and signals within the margin.
	if s.Incr(0, "i", lim, 5, now); signalled(s) {
		t.Fatal("Incr signalled at 15 left")
	}
	if s.Incr(0, "i", lim, 25, now); !signalled(s) {
		t.Fatal("Incr over the limit did not signal")
	}
}

func TestNearLimitTakeDoesNotAllocate(t *testing.T) {
	s := trackedStore(t, Config{})
	lim := Limit{Limit: MaxLimit, ScaleMS: 1000}
	now := at(t, "10:00:00.500")
	s.Incr(0, "k", lim, lim.Limit-nearMargin(lim.Limit), now)
	var buf []WindowCount
	for range 3 {
		s.Take(0, "k", lim, now)
		buf, _ = s.Changes(buf[:0], now)
	}
	allocs := testing.AllocsPerRun(1000, func() { s.Take(0, "k", lim, now) })
	if allocs != 0 {
		t.Errorf("tracked Take near the limit allocates %v per run, want 0", allocs)
	}
	if !signalled(s) {
		t.Error("no signal")
	}
}
