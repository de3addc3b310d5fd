package counter

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// TestArithmeticAtLongestWindows checks admits, admitsN and estimate against exact
// big-integer arithmetic at the bounds: windows up to MaxScaleMS, limits
// up to MaxLimitFor, previous counts on both sides of the fast path and up
// to the saturated sum 2×MaxCount.
func TestArithmeticAtLongestWindows(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	scales := []int64{1, 1000, 30 * 86_400_000, MaxProduct / MaxLimit, MaxProduct/MaxLimit + 1, MaxScaleMS - 1, MaxScaleMS}
	prevs := []int64{1, 1<<30 - 1, 1 << 30, 1<<30 + 1, 1<<31 - 1, 1 << 31, 1 << 40, MaxCount, 2 * MaxCount}
	for range 20000 {
		s := scales[rng.IntN(len(scales))]
		if rng.IntN(3) == 0 {
			s = 1 + rng.Int64N(MaxScaleMS)
		}
		lim := Limit{Limit: 1 + rng.Int64N(MaxLimitFor(s)), ScaleMS: s, Algorithm: Sliding}
		if rng.IntN(2) == 0 {
			lim.Limit = MaxLimitFor(s)
		}
		if err := lim.Validate(); err != nil {
			t.Fatal(err)
		}
		prev := prevs[rng.IntN(len(prevs))]
		if rng.IntN(3) == 0 {
			prev = 1 + rng.Int64N(2*MaxCount)
		}
		cur := rng.Int64N(lim.Limit + 1)
		el := rng.Int64N(s)
		d := s - el
		// admits: prev×d + (cur+1)×s ≤ limit×s
		lhs := new(big.Int).Mul(big.NewInt(prev), big.NewInt(d))
		lhs.Add(lhs, new(big.Int).Mul(big.NewInt(cur+1), big.NewInt(s)))
		rhs := new(big.Int).Mul(big.NewInt(lim.Limit), big.NewInt(s))
		want := cur < lim.Limit && lhs.Cmp(rhs) <= 0
		if got := admits(lim, el, prev, cur); got != want {
			t.Fatalf("admits(%+v, el %d, prev %d, cur %d) = %v, want %v", lim, el, prev, cur, got, want)
		}
		// estimate: ceil(prev×d/s) + cur
		q := new(big.Int).Mul(big.NewInt(prev), big.NewInt(d))
		q.Add(q, big.NewInt(s-1))
		q.Quo(q, big.NewInt(s))
		q.Add(q, big.NewInt(cur))
		if got := estimate(lim, el, prev, cur); !q.IsInt64() || got != q.Int64() {
			t.Fatalf("estimate(%+v, el %d, prev %d, cur %d) = %d, want %s", lim, el, prev, cur, got, q)
		}
		// admitsN: prev×d + (cur+n)×s ≤ limit×s, for n hits at once.
		n := 1 + rng.Int64N(lim.Limit)
		lhsN := new(big.Int).Mul(big.NewInt(prev), big.NewInt(d))
		lhsN.Add(lhsN, new(big.Int).Mul(new(big.Int).Add(big.NewInt(cur), big.NewInt(n)), big.NewInt(s)))
		wantN := cur+n <= lim.Limit && lhsN.Cmp(rhs) <= 0
		if got := admitsN(lim, el, prev, cur, n); got != wantN {
			t.Fatalf("admitsN(%+v, el %d, prev %d, cur %d, n %d) = %v, want %v", lim, el, prev, cur, n, got, wantN)
		}
		if !want {
			if r := retryAfter(lim, el, prev, cur); r < 1 {
				t.Fatalf("retryAfter(%+v, el %d, prev %d, cur %d) = %d", lim, el, prev, cur, r)
			}
		}
	}
}

// TestMonthWindow counts a limit at the most a month allows, sliding,
// across a window edge, and merges a peer's count of it.
func TestMonthWindow(t *testing.T) {
	const month = 30 * 86_400_000
	s := newStore(t, Config{Track: true})
	lim := Limit{Limit: MaxLimitFor(month), ScaleMS: month, Algorithm: Sliding}
	w := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()/month + 1
	start := time.UnixMilli(w * month)
	if r := s.Incr(0, "k", lim, lim.Limit-1, start.Add(-time.Millisecond)); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("previous window one short of the limit: %+v", r)
	}
	// At the start of the next window the previous counts in full.
	if r := s.Take(0, "k", lim, start); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("first hit of the window: %+v", r)
	}
	if r := s.Take(0, "k", lim, start); r.Allowed || r.RetryAfterMS < 1 || r.RetryAfterMS > month {
		t.Fatalf("over the limit: %+v", r)
	}
	// Half-way through, half of the previous window is forgotten.
	if r := s.Peek(0, "k", lim, start.Add(month/2*time.Millisecond)); !r.Allowed || r.Count != (lim.Limit-1+1)/2+1 {
		t.Fatalf("half-way: %+v", r)
	}
	if st := s.Merge(1, WindowCount{Bucket: 0, Key: "k", ScaleMS: month, Algorithm: Sliding, Window: w, Count: MaxCount}, start); st != Merged {
		t.Fatalf("merge of a saturated peer count: %v", st)
	}
	if r := s.Peek(0, "k", lim, start.Add(month/2*time.Millisecond)); r.Allowed || r.Count < lim.Limit {
		t.Fatalf("after the peer's count: %+v", r)
	}
	if ch, _ := s.Changes(nil, start); len(ch) != 2 || ch[0].ScaleMS != month && ch[1].ScaleMS != month {
		t.Fatalf("changes: %+v", ch)
	}
}

func TestDropBuckets(t *testing.T) {
	s := newStore(t, Config{Track: true, Shards: 4})
	lim := Limit{Limit: 10, ScaleMS: 60_000}
	now := time.UnixMilli(1_800_000_000_000)
	for i := range 100 {
		key := string(rune('a'+i%26)) + string(rune('a'+i/26))
		for b := range Bucket(3) {
			s.Take(b, key, lim, now)
		}
		if st := s.Merge(1, WindowCount{Bucket: 1, Key: key, ScaleMS: 60_000, Window: now.UnixMilli() / 60_000, Count: 3}, now); st != Merged {
			t.Fatalf("merge: %v", st)
		}
	}
	if n := s.DropBuckets([]Bucket{1, 7}); n != 100 {
		t.Fatalf("DropBuckets deleted %d entries, want 100", n)
	}
	if s.Len() != 200 {
		t.Fatalf("Len %d after the drop, want 200", s.Len())
	}
	ch, _ := s.Changes(nil, now)
	if len(ch) != 200 {
		t.Fatalf("%d changes after the drop, want 200", len(ch))
	}
	for _, c := range ch {
		if c.Bucket == 1 {
			t.Fatalf("a dropped bucket's change is still reported: %+v", c)
		}
	}
	for i := range s.shards {
		for k := range s.shards[i].peers {
			if k.bucket == 1 {
				t.Fatalf("a dropped bucket's peer counts are kept: %+v", k)
			}
		}
	}
	// The key starts from zero, with no peer count behind it.
	if r := s.Take(1, "aa", lim, now); !r.Allowed || r.Count != 1 {
		t.Fatalf("a dropped key counted again: %+v", r)
	}
	if r := s.Peek(0, "aa", lim, now); r.Count != 1 {
		t.Fatalf("a kept bucket lost its count: %+v", r)
	}
	if n := s.DropBuckets(nil); n != 0 {
		t.Fatalf("DropBuckets(nil) = %d", n)
	}
}
