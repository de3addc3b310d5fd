package counter

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func TestTakeNTable(t *testing.T) {
	fixed := Limit{Limit: 5, ScaleMS: 1000}
	s := newStore(t, Config{})
	base := window(t, "10:00:00.000", 1000)
	steps := []struct {
		at   string
		n    int64
		want Result
	}{
		{"10:00:00.000", 3, Result{Allowed: true, Count: 3, Remaining: 2, ResetMS: 1000}},
		// 3 more do not all fit: none is counted.
		{"10:00:00.100", 3, Result{Count: 3, Remaining: 2, ResetMS: 900, RetryAfterMS: 900}},
		{"10:00:00.200", 2, Result{Allowed: true, Count: 5, Remaining: 0, ResetMS: 800}},
		// n = 0 is a peek: at the limit, one more would not be admitted.
		{"10:00:00.300", 0, Result{Count: 5, ResetMS: 700, RetryAfterMS: 700}},
		{"10:00:00.400", 1, Result{Count: 5, ResetMS: 600, RetryAfterMS: 600}},
		// a new window: more than the limit never fits, the limit does.
		{"10:00:01.000", 6, Result{Count: 0, Remaining: 5, Window: 1, ResetMS: 1000, RetryAfterMS: 1000}},
		{"10:00:01.000", math.MaxInt64, Result{Count: 0, Remaining: 5, Window: 1, ResetMS: 1000, RetryAfterMS: 1000}},
		{"10:00:01.000", 5, Result{Allowed: true, Count: 5, Window: 1, ResetMS: 1000}},
	}
	for i, st := range steps {
		got := s.TakeN(1, "k", fixed, st.n, at(t, st.at))
		got.Window -= base
		if got != st.want {
			t.Errorf("step %d: TakeN(%d) at %s\n got %+v\nwant %+v", i, st.n, st.at, got, st.want)
		}
	}
	if _, total := s.Count(1, "k", fixed, base); total != 5 {
		t.Errorf("window 0 holds %d hits, want 5 (denied batches are not counted)", total)
	}
}

// TestTakeNIsNTakes checks TakeN against its definition: n hits are
// admitted at once iff n successive Takes would all be admitted, and the
// state after an admission is theirs. Random histories of both algorithms,
// remote counts included, are replayed on two stores.
func TestTakeNIsNTakes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		lim := Limit{Limit: 1 + rng.Int64N(12), ScaleMS: 1000, Algorithm: Algorithm(rng.IntN(2))}
		a, b := newStore(t, Config{}), newStore(t, Config{})
		t0 := at(t, "10:00:00.000")
		w0 := t0.UnixMilli() / lim.ScaleMS
		// A history: remote hits in the previous window and this one.
		prevN, curN := rng.Int64N(2*lim.Limit+1), rng.Int64N(lim.Limit+1)
		for _, s := range []*Store{a, b} {
			s.Add(1, "k", lim, w0, prevN, t0)
			s.Add(1, "k", lim, w0+1, curN, t0.Add(time.Second))
		}
		now := t0.Add(time.Second + time.Duration(rng.IntN(1000))*time.Millisecond)
		n := 1 + rng.Int64N(lim.Limit+2)
		got := a.TakeN(1, "k", lim, n, now)

		allTaken := true
		var last Result
		for range n {
			last = b.Take(1, "k", lim, now)
			if !last.Allowed {
				allTaken = false
				break
			}
		}
		if got.Allowed != allTaken {
			t.Fatalf("iter %d: %+v prev %d cur %d n %d at %v: TakeN allowed %v, %d Takes all admitted %v",
				iter, lim, prevN, curN, n, now.Sub(t0), got.Allowed, n, allTaken)
		}
		if allTaken && got != last {
			t.Fatalf("iter %d: TakeN %+v, the last of %d Takes %+v", iter, got, n, last)
		}
		if !got.Allowed {
			// Nothing was counted: the store reads as before.
			if p, q := a.Peek(1, "k", lim, now), b.Peek(1, "k", lim, now); allTaken || p.Count > q.Count {
				t.Fatalf("iter %d: after a denied TakeN the count is %d, want the history's (%d or less)", iter, p.Count, q.Count)
			}
		}
	}
}

func TestTakeNConcurrent(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 100, ScaleMS: 60_000}
	now := at(t, "10:00:00.000")
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := int64(0)
	for range 16 {
		wg.Go(func() {
			for range 50 {
				if s.TakeN(1, "k", lim, 3, now).Allowed {
					mu.Lock()
					admitted += 3
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if _, total := s.Count(1, "k", lim, now.UnixMilli()/lim.ScaleMS); admitted != 99 || total != 99 {
		t.Errorf("admitted %d hits, counted %d; want 99 (33 batches of 3)", admitted, total)
	}
}

func TestTakeNTracksAndOverflows(t *testing.T) {
	s := newStore(t, Config{Track: true, MaxKeys: 1, Shards: 1})
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	if r := s.TakeN(1, "a", lim, 6, now); !r.Allowed {
		t.Fatalf("TakeN(6) of 10: %+v", r)
	}
	select {
	case <-s.NearLimit():
	default:
		t.Error("6 of 10 leaves 4 ≤ half: no near-limit signal")
	}
	ch, _ := s.Changes(nil, now)
	if len(ch) != 1 || ch[0].Count != 6 {
		t.Errorf("Changes = %+v, want one count of 6", ch)
	}
	if r := s.TakeN(1, "b", lim, 1, now); !r.Overflow || r.Allowed {
		t.Errorf("a second key in a store of one: %+v, want Overflow", r)
	}
	if r := s.TakeN(1, "a", Limit{}, 1, now); r != (Result{}) {
		t.Errorf("an invalid limit: %+v, want the zero Result", r)
	}
}

func TestTakeNAllocs(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 1 << 30, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	s.TakeN(1, "k", lim, 1, now)
	if a := testing.AllocsPerRun(1000, func() { s.TakeN(1, "k", lim, 2, now) }); a != 0 {
		t.Errorf("TakeN on an existing key: %v allocations, want 0", a)
	}
}

// ReleaseN gives back what one TakeN took, and never more than is local
// in that window: a give-back cannot refund another node's hits or go
// below 0.
func TestReleaseN(t *testing.T) {
	lim := Limit{Limit: 100, ScaleMS: 1000}
	s := newStore(t, Config{})
	now := at(t, "10:00:00.000")
	w := s.TakeN(1, "k", lim, 30, now).Window
	s.TakeN(1, "k", lim, 20, now)
	s.ReleaseN(1, "k", lim, w, 30)
	if _, total := s.Count(1, "k", lim, w); total != 20 {
		t.Fatalf("after giving back 30 of 50: %d", total)
	}
	s.ReleaseN(1, "k", lim, w, 0)
	s.ReleaseN(1, "k", lim, w, -5)
	if _, total := s.Count(1, "k", lim, w); total != 20 {
		t.Fatalf("n ≤ 0 gave back: %d", total)
	}
	s.Add(1, "k", lim, w, 40, now) // a peer's hits
	s.ReleaseN(1, "k", lim, w, 1000)
	if local, total := s.Count(1, "k", lim, w); local != 0 || total != 40 {
		t.Fatalf("giving back more than was taken: local %d, total %d; want 0, 40", local, total)
	}
}
