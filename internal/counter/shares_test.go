package counter

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

func shareStore(t *testing.T, sh share.Split) *Store {
	t.Helper()
	s, err := New(Config{Track: true, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetShares(sh); err != nil {
		t.Fatal(err)
	}
	return s
}

// admitAll takes hits at now until one is denied and returns how many were
// admitted.
func admitAll(s *Store, key string, lim Limit, now time.Time) int {
	n := 0
	for s.Take(0, key, lim, now).Allowed {
		n++
	}
	return n
}

// TestSharesFirstShares: a key no node knows a count of gets a first share
// of 3/(2 × Nodes) of the limit on every node, so that the first shares add
// up to 1.5 × the limit: what a key that bursts on every node at once may
// admit before any node hears of the others.
func TestSharesFirstShares(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000) // a window start
	total := 0
	for rank := range 3 {
		s := shareStore(t, share.Split{Nodes: 3, Rank: rank, Delay: 10 * time.Millisecond})
		got := admitAll(s, "k", lim, w0.Add(5*time.Millisecond))
		if got != 50 {
			t.Errorf("rank %d admitted %d alone, want its first share 50", rank, got)
		}
		total += got
		if d := s.ShareDenials(); d != 1 {
			t.Errorf("rank %d: %d share denials, want 1", rank, d)
		}
		if r := s.Peek(0, "k", lim, w0.Add(5*time.Millisecond)); !r.Allowed {
			t.Errorf("rank %d: Peek denies at %d of 100: shares bind admission only", rank, r.Count)
		}
	}
	if total != 150 {
		t.Errorf("the three first shares add up to %d, want 1.5 × the limit, 150", total)
	}
	// 1.5 × 100 = 150 = 37×4 + 2 over four nodes: two ranks' turn for the
	// remainder in this window.
	total = 0
	for rank := range 4 {
		s := shareStore(t, share.Split{Nodes: 4, Rank: rank, Delay: 10 * time.Millisecond})
		total += admitAll(s, "k", lim, w0)
	}
	if total != 150 {
		t.Errorf("four first shares add up to %d, want 150", total)
	}
}

func TestSharesGrowOnceReported(t *testing.T) {
	lim := Limit{Limit: 90, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000)
	s := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 10 * time.Millisecond})
	at := w0.Add(time.Millisecond)
	if got := admitAll(s, "k", lim, at); got != 45 {
		t.Fatalf("admitted %d, want the first share 45", got)
	}
	// Denied, and still denied after the report until it is Delay old.
	out, _ := s.Changes(nil, at)
	if len(out) != 1 || out[0].Count != 45 {
		t.Fatalf("Changes = %+v, want the key at 45 (it is near its share)", out)
	}
	if r := s.Take(0, "k", lim, at.Add(9*time.Millisecond)); r.Allowed || r.Remaining != 0 || r.RetryAfterMS != 1 {
		t.Errorf("at 9 ms of a 10 ms delay: %+v, want denied, Remaining 0, RetryAfterMS 1 (not the window's end)", r)
	}
	// The peers reported 15 meanwhile: 90 − 45 − 15 = 30 remain, and this
	// node carried 45 of the 60 hits known: ⌈30 × (45 + 1)/(60 + 3×1)⌉ =
	// 22 of them (1: a sixteenth of the limit over 3 nodes, the smoothing).
	if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: w0.UnixMilli() / 1000, Count: 15}, at); st != Merged {
		t.Fatal(st)
	}
	if got := admitAll(s, "k", lim, at.Add(10*time.Millisecond)); got != 22 {
		t.Errorf("admitted %d once the report was in effect, want 22", got)
	}
}

func TestSharesFloodIsNotReplicated(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 60_000}
	now := time.UnixMilli(1_000_000_000_000)
	on := shareStore(t, share.Split{Nodes: 3, Rank: 1, Delay: 10 * time.Millisecond})
	off := shareStore(t, share.Split{Nodes: 1})
	for i := range 1000 {
		key := fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		if !on.Take(0, key, lim, now).Allowed || !off.Take(0, key, lim, now).Allowed {
			t.Fatalf("a first hit on %s was denied", key)
		}
	}
	if out, _ := on.Changes(nil, now); len(out) != 0 {
		t.Errorf("with shares, %d keys hit once are reported, want none (each far below its share)", len(out))
	}
	if out, _ := off.Changes(nil, now); len(out) != 1000 {
		t.Errorf("without shares, %d keys reported, want all 1000", len(out))
	}
	// A key hit up to half its share is reported.
	for range 24 {
		on.Take(0, "hot", lim, now)
	}
	if out, _ := on.Changes(nil, now); len(out) != 0 {
		t.Errorf("reported at 24 of a first share of 50: %+v", out)
	}
	on.Take(0, "hot", lim, now)
	if out, _ := on.Changes(nil, now); len(out) != 1 || out[0].Count != 25 {
		t.Errorf("at 25 of a first share of 50, Changes = %+v, want hot at 25", out)
	}
}

// TestSharesDenialMarks: hits admitted far below the share are not
// reported; when the peers' reports shrink the share below them, the
// denial has them reported, so the node's view reaches its peers instead of
// the key staying denied here.
func TestSharesDenialMarks(t *testing.T) {
	lim := Limit{Limit: 90, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000)
	s := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 5 * time.Millisecond})
	at := w0.Add(time.Millisecond)
	for range 10 {
		if !s.Take(0, "k", lim, at).Allowed {
			t.Fatal("denied within the share")
		}
	}
	if out, _ := s.Changes(nil, at); len(out) != 0 {
		t.Fatalf("10 of a share of 30 reported: %+v", out)
	}
	select {
	case <-s.NearLimit():
		t.Fatal("publish signal far below the share")
	default:
	}
	if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: w0.UnixMilli() / 1000, Count: 75}, at); st != Merged {
		t.Fatal(st)
	}
	// 90 − 75 = 15 remain unreported-for: a share of 5, below the 10 here.
	if r := s.Take(0, "k", lim, at); r.Allowed || r.RetryAfterMS != 10 {
		t.Errorf("beyond the shrunk share: %+v, want denied with RetryAfterMS 10 (a report, then its delay)", r)
	}
	select {
	case <-s.NearLimit():
	default:
		t.Error("no publish signal on a denial by share with hits unreported")
	}
	if out, _ := s.Changes(nil, at); len(out) != 1 || out[0].Count != 10 {
		t.Errorf("Changes = %+v, want k at 10", out)
	}
	// Once reported, 90 − 10 − 75 = 5 remain: a share of 1 or 2.
	if got := admitAll(s, "k", lim, at.Add(5*time.Millisecond)); got < 1 || got > 2 {
		t.Errorf("admitted %d once reported, want a third of the 5 left", got)
	}
}

func TestSharesSmallLimit(t *testing.T) {
	lim := Limit{Limit: 1, ScaleMS: 1000}
	now := time.UnixMilli(1_000_000_000_000)
	for rank := range 3 {
		s := shareStore(t, share.Split{Nodes: 3, Rank: rank, Delay: 10 * time.Millisecond})
		if got := admitAll(s, "k", lim, now); got != 1 {
			t.Errorf("rank %d admitted %d of a limit of 1 alone, want 1", rank, got)
		}
	}
}

func TestSharesTakeN(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000}
	now := time.UnixMilli(1_000_000_000_000 + 1)
	s := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 10 * time.Millisecond}) // a first share of 50
	if r := s.TakeN(0, "k", lim, 1, now); !r.Allowed {
		t.Error("TakeN(1) denied within the share")
	}
	if r := s.TakeN(0, "k", lim, 50, now); r.Allowed {
		t.Error("TakeN(50) after 1 admitted beyond the share 50")
	}
	if r := s.TakeN(0, "k", lim, 49, now); !r.Allowed {
		t.Error("TakeN(49) after 1 denied within the share 50")
	}
	if r := s.TakeN(0, "k", lim, 1, now); r.Allowed {
		t.Error("TakeN(1) admitted with the share spent")
	}
	// Heavier than any share: admitted on the limit once nothing is
	// unreported, so it is not denied everywhere for the whole window.
	s2 := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 10 * time.Millisecond})
	if r := s2.TakeN(0, "k", lim, 60, now); !r.Allowed {
		t.Errorf("TakeN(60) of a limit of 100 over 3 nodes denied with nothing unreported: %+v", r)
	}
	if r := s2.TakeN(0, "k", lim, 40, now); r.Allowed {
		t.Error("TakeN(40) admitted with 60 unreported")
	}
}

func TestSharesSliding(t *testing.T) {
	lim := Limit{Limit: 90, ScaleMS: 1000, Algorithm: Sliding}
	w0 := time.UnixMilli(1_000_000_000_000)
	s := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 10 * time.Millisecond})
	// The previous window held 60 of the peers' hits and none of this
	// node's: at its midpoint the estimate counts 30 of them, so 60
	// remain, of which this node, which carried none of the key's
	// traffic, gets ⌈60 × 1/(60 + 3×1)⌉ = 1 (1: a sixteenth of the limit
	// over 3 nodes, the smoothing).
	prev := w0.UnixMilli()/1000 - 1
	if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Algorithm: Sliding, Window: prev, Count: 60}, w0); st != Merged {
		t.Fatal(st)
	}
	if got := admitAll(s, "k", lim, w0.Add(500*time.Millisecond)); got != 1 {
		t.Errorf("admitted %d, want 1", got)
	}
}

// TestSharesFollowTraffic: a node that carried most of a key's hits in
// the previous window gets most of what remains in this one; the others
// get what is left of it, so the shares add up to about what remains.
func TestSharesFollowTraffic(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000)
	prev := w0.Add(-time.Second)
	total := 0
	for rank, own := range []int{90, 5, 5} {
		s := shareStore(t, share.Split{Nodes: 3, Rank: rank, Delay: 10 * time.Millisecond})
		s.Incr(0, "k", lim, int64(own), prev) // this node's hits of that window, reported
		s.Changes(nil, prev)
		// The others' hits of that window, as they reported them.
		if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: prev.UnixMilli() / 1000, Count: int64(100 - own)}, prev); st != Merged {
			t.Fatal(st)
		}
		got := admitAll(s, "k", lim, w0)
		// ⌈100 × (own + 2)/(100 + 3×2)⌉: 87 for 90, 7 for 5.
		if want := (100*(own+2) + 105) / 106; got != want {
			t.Errorf("rank %d with %d of 100 hits before: admitted %d, want %d", rank, own, got, want)
		}
		total += got
	}
	if total < 100 || total > 102 {
		t.Errorf("the shares add up to %d of 100", total)
	}
}

func TestSetSharesRejects(t *testing.T) {
	s := shareStore(t, share.Split{})
	for _, sh := range []share.Split{
		{Nodes: 3, Rank: 3}, {Nodes: 3, Rank: -1}, {Nodes: MaxShareNodes + 1},
		{Nodes: 2, Delay: -time.Millisecond}, {Nodes: 2, Delay: MaxShareDelay + time.Millisecond},
	} {
		if err := s.SetShares(sh); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("SetShares(%+v) = %v, want ErrInvalidConfig", sh, err)
		}
	}
}

// simNet is a cluster of stores on a simulated network in simulated time,
// 1 ms a step, driven as package replicate drives them: a node publishes
// its Changes at every tick and, when its store signals, at once unless its
// previous early batch is less than gap old (then at the gap's end); a
// batch reaches the peers deliver later. Each node's Split.Delay is what
// replicate sets: share.Delay of the gap, the delivery and the tick.
type simNet struct {
	lim                      Limit
	nodes                    int
	tickMS, gapMS, deliverMS int64
}

// newSimNet is the default network: a 100 ms tick, a 10 ms gap and 1 ms
// to deliver a batch (a Delay of 15 ms).
func newSimNet(lim Limit, nodes int) simNet {
	return simNet{lim: lim, nodes: nodes, tickMS: 100, gapMS: 10, deliverMS: 1}
}

// run offers each node load(node, ms) hits at each ms in [start, end) (unix
// ms) and returns when, per node, each admitted hit was taken.
func (c simNet) run(t *testing.T, start, end int64, load func(node int, ms int64) int) [][]int64 {
	t.Helper()
	type msg struct {
		at   int64
		from PeerID
		wcs  []WindowCount
	}
	delay := share.Delay(0, time.Duration(c.gapMS)*time.Millisecond, time.Duration(c.deliverMS)*time.Millisecond, time.Duration(c.tickMS)*time.Millisecond)
	ss := make([]*Store, c.nodes)
	for i := range ss {
		ss[i] = shareStore(t, share.Split{Nodes: c.nodes, Rank: i, Delay: delay})
	}
	var inflight []msg
	lastEarly := make([]int64, c.nodes)
	earlyAt := make([]int64, c.nodes) // 0: none pending
	admitted := make([][]int64, c.nodes)
	publish := func(i int, ms int64) {
		out, _ := ss[i].Changes(nil, time.UnixMilli(ms))
		if len(out) > 0 {
			inflight = append(inflight, msg{ms + c.deliverMS, PeerID(i + 1), out})
		}
	}
	for ms := start; ms < end; ms++ {
		now := time.UnixMilli(ms)
		keep := inflight[:0]
		for _, m := range inflight {
			if m.at > ms {
				keep = append(keep, m)
				continue
			}
			for j := range ss {
				if PeerID(j+1) != m.from {
					for _, wc := range m.wcs {
						ss[j].Merge(m.from, wc, now)
					}
				}
			}
		}
		inflight = keep
		for i, s := range ss {
			for range load(i, ms) {
				if s.Take(0, "k", c.lim, now).Allowed {
					admitted[i] = append(admitted[i], ms)
				}
			}
			select {
			case <-s.NearLimit():
				if earlyAt[i] == 0 {
					earlyAt[i] = max(ms, lastEarly[i]+c.gapMS)
				}
			default:
			}
			if earlyAt[i] != 0 && ms >= earlyAt[i] {
				earlyAt[i], lastEarly[i] = 0, ms
				publish(i, ms)
			}
			if ms%c.tickMS == 0 {
				publish(i, ms)
			}
		}
	}
	return admitted
}

// simCluster runs three-or-more nodes, node i offered perMS[i] hits a ms,
// on the default simNet and returns the admitted hits per whole window.
func simCluster(t *testing.T, lim Limit, perMS []float64, windows int) []int {
	t.Helper()
	start := int64(1_000_000_000_000) // a window start
	owed := make([]float64, len(perMS))
	at := newSimNet(lim, len(perMS)).run(t, start, start+int64(windows+1)*lim.ScaleMS, func(i int, _ int64) int {
		owed[i] += perMS[i]
		n := int(owed[i])
		owed[i] -= float64(n)
		return n
	})
	admitted := map[int64]int{}
	for _, node := range at {
		for _, ms := range node {
			admitted[(ms-start)/lim.ScaleMS]++
		}
	}
	out := make([]int, 0, windows)
	first := int64(0)
	if lim.Algorithm == Sliding {
		first = 1 // its previous window is empty
	}
	for w := first; w < int64(windows); w++ {
		out = append(out, admitted[w])
	}
	return out
}

// TestSharesClusterModel: three nodes on a simulated network admit close
// to the limit in every window whether the load is just above it or a
// thousand times it, spread evenly or 90% on one node.
func TestSharesClusterModel(t *testing.T) {
	const limit = 100
	for _, alg := range []Algorithm{Fixed, Sliding} {
		lim := Limit{Limit: limit, ScaleMS: 1000, Algorithm: alg}
		for _, mult := range []float64{2, 10, 100, 1000} {
			for _, skew := range []bool{false, true} {
				perMS := []float64{mult * limit / 1000 / 3, mult * limit / 1000 / 3, mult * limit / 1000 / 3}
				if skew {
					perMS = []float64{mult * limit / 1000 * 0.9, mult * limit / 1000 * 0.05, mult * limit / 1000 * 0.05}
				}
				name := fmt.Sprintf("%s/%g×/skewed=%v", alg, mult, skew)
				got := simCluster(t, lim, perMS, 5)
				t.Logf("%s: %v", name, got)
				for w, n := range got {
					// At most the rounding of shares (nodes−1) over; at
					// least 95% admitted at any load of twice the limit
					// or more.
					if n > limit+2 || n < limit*95/100 {
						t.Errorf("%s: window %d admitted %d of %d", name, w, n, limit)
					}
				}
			}
		}
	}
}

func TestReportedListsOnlyReportedKeys(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 60_000}
	now := time.UnixMilli(1_000_000_000_000)
	s := shareStore(t, share.Split{Nodes: 3, Rank: 0, Delay: 10 * time.Millisecond})
	for i := range 100 {
		s.Take(0, fmt.Sprintf("flood-%d", i), lim, now)
	}
	for range 30 {
		s.Take(0, "hot", lim, now)
	}
	if got := s.Reported(nil, now); len(got) != 0 {
		t.Errorf("Reported before any Changes = %+v, want none", got)
	}
	s.Changes(nil, now)
	s.Take(0, "hot", lim, now) // counted after the report: Reported gives the latest
	got := s.Reported(nil, now)
	if len(got) != 1 || got[0].Key != "hot" || got[0].Count != 31 {
		t.Errorf("Reported = %+v, want hot at 31 alone", got)
	}
	if got := s.Reported(nil, now.Add(time.Minute)); len(got) != 0 {
		t.Errorf("Reported after the window ended = %+v, want none", got)
	}
}

// FuzzShares runs a random sequence of operations on one node's store with
// shares on and checks, whatever the sequence: no window ever counts more
// local hits than the limit, and until a window's first report (or a
// change of shares) a node admits in it at most a first share of the
// whole limit, ⌈⌊1.5 × Limit⌋/Nodes⌉, however peers' counts arrive, when
// the key's previous window saw no hits (else the split follows them).
func FuzzShares(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 2, 50, 0, 0, 3, 7, 0, 0})
	f.Add([]byte{4, 5, 0, 0, 0, 0, 0, 1, 2, 200, 0, 0, 5, 9})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const limit = 20
		lim := Limit{Limit: limit, ScaleMS: 1000}
		s, err := New(Config{Track: true, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		nodes := 3
		if err := s.SetShares(share.Split{Nodes: nodes, Rank: 1, Delay: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		ms := int64(1_000_000_000_000)
		keys := []string{"a", "b"}
		// clean[key]: the key's current window has had no report and no
		// change of shares, so the one-share bound holds.
		first := func() int64 { return max(1, (limit*3/2+int64(nodes)-1)/int64(nodes)) }
		type kw struct {
			key string
			w   int64
		}
		clean := map[kw]bool{}
		admitted := map[kw]int64{}
		touched := map[kw]bool{} // hits admitted or merged in the window
		for len(ops) >= 2 {
			op, arg := ops[0]%6, ops[1]
			ops = ops[2:]
			now := time.UnixMilli(ms)
			w := ms / 1000
			key := keys[arg%2]
			k := kw{key, w}
			if _, ok := clean[k]; !ok {
				clean[k] = true
			}
			switch op {
			case 0, 5: // a hit, or several
				n := int64(1)
				if op == 5 {
					n = int64(arg%7) + 1
				}
				if s.TakeN(0, key, lim, n, now).Allowed {
					admitted[k] += n
					touched[k] = true
					if n > first() {
						clean[k] = false // heavier than a share: on the limit alone
					}
				}
			case 1:
				s.Changes(nil, now)
				for kk := range clean {
					clean[kk] = false
				}
			case 2:
				ms += int64(arg) * 3
			case 3:
				if s.Merge(1, WindowCount{Key: key, ScaleMS: 1000, Window: w, Count: int64(arg % 30)}, now) == Merged {
					touched[k] = true
				}
			case 4:
				nodes = int(arg%5) + 1
				if err := s.SetShares(share.Split{Nodes: nodes, Rank: int(arg) % nodes, Delay: time.Duration(arg%20) * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
				for kk := range clean {
					clean[kk] = false
				}
			}
			if got := admitted[k]; got > limit {
				t.Fatalf("%s admitted %d in one window of a limit of %d", key, got, limit)
			}
			if clean[k] && !touched[kw{key, w - 1}] && nodes > 1 && admitted[k] > first() {
				t.Fatalf("%s admitted %d before any report, over one first share of %d nodes", key, admitted[k], nodes)
			}
		}
	})
}

// TestSharesReportWithinShareDoesNotMark: a peer's report that leaves this
// node's unreported hits well within its share has nothing reported: only
// a report that shrinks the share to twice those hits or less does.
func TestSharesReportWithinShareDoesNotMark(t *testing.T) {
	lim := Limit{Limit: 1000, ScaleMS: 1000}
	w0 := time.UnixMilli(1_000_000_000_000)
	s := shareStore(t, share.Split{Nodes: 2, Rank: 0, Delay: 10 * time.Millisecond})
	at := w0.Add(time.Millisecond)
	for range 10 {
		s.Take(0, "k", lim, at)
	}
	win := w0.UnixMilli() / 1000
	// 1000 − 100 leave a share of 450: 10 unreported hits are far below.
	if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: win, Count: 100}, at); st != Merged {
		t.Fatal(st)
	}
	if out, _ := s.Changes(nil, at); len(out) != 0 {
		t.Errorf("a report far from the share had %+v reported", out)
	}
	// 1000 − 980 leave a share of 10: the 10 are half of it or more.
	if st := s.Merge(1, WindowCount{Key: "k", ScaleMS: 1000, Window: win, Count: 980}, at); st != Merged {
		t.Fatal(st)
	}
	if out, _ := s.Changes(nil, at); len(out) != 1 || out[0].Count != 10 {
		t.Errorf("a report that shrank the share to 10: Changes = %+v, want k at 10", out)
	}
}
