package counter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// day is the test day; at parses a clock time on it, x/time/rate style.
var day = time.Date(2025, 6, 2, 0, 0, 0, 0, time.UTC)

func at(t testing.TB, clock string) time.Time {
	t.Helper()
	c, err := time.Parse("15:04:05.000", clock)
	if err != nil {
		t.Fatalf("bad clock %q: %v", clock, err)
	}
	return day.Add(c.Sub(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)))
}

// window returns the window number that contains clock for scale.
func window(t testing.TB, clock string, scale int64) int64 {
	t.Helper()
	return at(t, clock).UnixMilli() / scale
}

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return s
}

// step is one call in a table test. Window in want, and win, are relative
// to the window containing 10:00:00.000, so tables stay readable.
type step struct {
	at   string // clock time of the call
	op   string // take, peek, incr, release, add
	key  string // "" means "k"
	n    int64  // incr, add
	win  int64  // release, add: window relative to 10:00:00.000's
	want Result // take, peek, incr
	ok   bool   // add: want returned value
}

// run applies steps in order to s under lim and checks every result.
func run(t *testing.T, s *Store, lim Limit, steps []step) {
	t.Helper()
	base := window(t, "10:00:00.000", lim.ScaleMS)
	for i, st := range steps {
		key := st.key
		if key == "" {
			key = "k"
		}
		var now time.Time
		if st.op != "release" {
			now = at(t, st.at)
		}
		var got Result
		switch st.op {
		case "take":
			got = s.Take(1, key, lim, now)
		case "peek":
			got = s.Peek(1, key, lim, now)
		case "incr":
			got = s.Incr(1, key, lim, st.n, now)
		case "release":
			s.Release(1, key, lim, base+st.win)
			continue
		case "add":
			if ok := s.Add(1, key, lim, base+st.win, st.n, now); ok != st.ok {
				t.Errorf("step %d: add(win %+d, n %d) at %s = %v, want %v", i, st.win, st.n, st.at, ok, st.ok)
			}
			continue
		default:
			t.Fatalf("step %d: unknown op %q", i, st.op)
		}
		got.Window -= base
		if got != st.want {
			t.Errorf("step %d: %s %q at %s\n got %+v\nwant %+v", i, st.op, key, st.at, got, st.want)
		}
	}
}

func TestTable(t *testing.T) {
	sec := func(l int64, a Algorithm) Limit { return Limit{Limit: l, ScaleMS: 1000, Algorithm: a} }
	tests := []struct {
		name  string
		lim   Limit
		steps []step
	}{
		{
			name: "fixed admits Limit per window, resets at the aligned boundary",
			lim:  sec(3, Fixed),
			steps: []step{
				{at: "10:00:00.000", op: "take", want: Result{Allowed: true, Count: 1, Remaining: 2, ResetMS: 1000}},
				{at: "10:00:00.400", op: "take", want: Result{Allowed: true, Count: 2, Remaining: 1, ResetMS: 600}},
				{at: "10:00:00.999", op: "take", want: Result{Allowed: true, Count: 3, Remaining: 0, ResetMS: 1}},
				{at: "10:00:00.999", op: "take", want: Result{Count: 3, ResetMS: 1, RetryAfterMS: 1}},
				{at: "10:00:00.999", op: "peek", want: Result{Count: 3, ResetMS: 1, RetryAfterMS: 1}},
				{at: "10:00:01.000", op: "take", want: Result{Allowed: true, Count: 1, Remaining: 2, Window: 1, ResetMS: 1000}},
				{at: "10:00:01.000", op: "peek", want: Result{Allowed: true, Count: 1, Remaining: 2, Window: 1, ResetMS: 1000}},
			},
		},
		{
			name: "fixed minute window: RetryAfter is the window end",
			lim:  Limit{Limit: 2, ScaleMS: 60_000},
			steps: []step{
				{at: "10:00:30.000", op: "take", want: Result{Allowed: true, Count: 1, Remaining: 1, ResetMS: 30_000}},
				{at: "10:00:30.000", op: "take", want: Result{Allowed: true, Count: 2, Remaining: 0, ResetMS: 30_000}},
				{at: "10:00:30.000", op: "take", want: Result{Count: 2, ResetMS: 30_000, RetryAfterMS: 30_000}},
				{at: "10:00:59.999", op: "take", want: Result{Count: 2, ResetMS: 1, RetryAfterMS: 1}},
				{at: "10:01:00.000", op: "take", want: Result{Allowed: true, Count: 1, Remaining: 1, Window: 1, ResetMS: 60_000}},
			},
		},
		{
			name: "sliding estimate and RetryAfter within the window",
			lim:  sec(10, Sliding),
			steps: []step{
				// 10 hits in window 0: full; the next admission is at
				// 10:00:01.100, where 10×900 + 1×1000 = 10×1000.
				{at: "10:00:00.100", op: "incr", n: 10, want: Result{Count: 10, ResetMS: 900, RetryAfterMS: 1000}},
				{at: "10:00:01.099", op: "take", want: Result{Count: 10, Window: 1, ResetMS: 901, RetryAfterMS: 1}},
				{at: "10:00:01.100", op: "take", want: Result{Allowed: true, Count: 10, Window: 1, ResetMS: 900}},
				// 10×(1000−e) + 2×1000 ≤ 10000 from e = 200.
				{at: "10:00:01.100", op: "take", want: Result{Count: 10, Window: 1, ResetMS: 900, RetryAfterMS: 100}},
				{at: "10:00:01.200", op: "take", want: Result{Allowed: true, Count: 10, Window: 1, ResetMS: 800}},
				// estimate ceil(10×750/1000) + 2 = 8 + 2; admitted from e = 300.
				{at: "10:00:01.250", op: "take", want: Result{Count: 10, Window: 1, ResetMS: 750, RetryAfterMS: 50}},
				{at: "10:00:01.299", op: "peek", want: Result{Count: 10, Window: 1, ResetMS: 701, RetryAfterMS: 1}},
				{at: "10:00:01.300", op: "peek", want: Result{Allowed: true, Count: 9, Remaining: 1, Window: 1, ResetMS: 700}},
				// previous 10, current 2: ceil(10×100/1000) + 2 = 3.
				{at: "10:00:01.900", op: "peek", want: Result{Allowed: true, Count: 3, Remaining: 7, Window: 1, ResetMS: 100}},
				// window 1 (2 hits) is now the previous: ceil(2×500/1000) = 1.
				{at: "10:00:02.500", op: "peek", want: Result{Allowed: true, Count: 1, Remaining: 9, Window: 2, ResetMS: 500}},
				// two windows on, nothing is left.
				{at: "10:00:03.000", op: "peek", want: Result{Allowed: true, Count: 0, Remaining: 10, Window: 3, ResetMS: 1000}},
			},
		},
		{
			name: "sliding estimate rounds up",
			lim:  sec(10, Sliding),
			steps: []step{
				{at: "10:00:00.000", op: "incr", n: 3, want: Result{Allowed: true, Count: 3, Remaining: 7, ResetMS: 1000}},
				{at: "10:00:01.000", op: "peek", want: Result{Allowed: true, Count: 3, Remaining: 7, Window: 1, ResetMS: 1000}},
				{at: "10:00:01.001", op: "peek", want: Result{Allowed: true, Count: 3, Remaining: 7, Window: 1, ResetMS: 999}}, // 2.997
				{at: "10:00:01.334", op: "peek", want: Result{Allowed: true, Count: 2, Remaining: 8, Window: 1, ResetMS: 666}}, // 1.998
				{at: "10:00:01.667", op: "peek", want: Result{Allowed: true, Count: 1, Remaining: 9, Window: 1, ResetMS: 333}}, // 0.999
				{at: "10:00:01.999", op: "peek", want: Result{Allowed: true, Count: 1, Remaining: 9, Window: 1, ResetMS: 1}},   // 0.003
			},
		},
		{
			name: "sliding RetryAfter falls into the next window",
			lim:  sec(4, Sliding),
			steps: []step{
				// full at once: next window, 4×(1000−e) + 1000 ≤ 4000 from e = 250.
				{at: "10:00:00.000", op: "incr", n: 4, want: Result{Count: 4, ResetMS: 1000, RetryAfterMS: 1250}},
				{at: "10:00:00.600", op: "take", want: Result{Count: 4, ResetMS: 400, RetryAfterMS: 650}},
				{at: "10:00:01.249", op: "take", want: Result{Count: 4, Window: 1, ResetMS: 751, RetryAfterMS: 1}},
				{at: "10:00:01.250", op: "take", want: Result{Allowed: true, Count: 4, Window: 1, ResetMS: 750}},
			},
		},
		{
			name: "sliding: a heavy previous window delays admissions within the window",
			lim:  sec(4, Sliding),
			steps: []step{
				// next window, 40×(1000−e) + 1000 ≤ 4000 from e = 925.
				{at: "10:00:00.500", op: "incr", n: 40, want: Result{Count: 40, ResetMS: 500, RetryAfterMS: 500 + 925}},
				{at: "10:00:01.000", op: "take", want: Result{Count: 40, Window: 1, ResetMS: 1000, RetryAfterMS: 925}},
				{at: "10:00:01.925", op: "take", want: Result{Allowed: true, Count: 4, Window: 1, ResetMS: 75}},
				// 40×(1000−e) + 2×1000 ≤ 4000 from e = 950.
				{at: "10:00:01.925", op: "take", want: Result{Count: 4, Window: 1, ResetMS: 75, RetryAfterMS: 25}},
				{at: "10:00:01.950", op: "take", want: Result{Allowed: true, Count: 4, Window: 1, ResetMS: 50}},
				{at: "10:00:01.950", op: "take", want: Result{Count: 4, Window: 1, ResetMS: 50, RetryAfterMS: 25}},
				{at: "10:00:01.975", op: "take", want: Result{Allowed: true, Count: 4, Window: 1, ResetMS: 25}},
				// 3 of 4 now: never again in this window (40×(1000−e) ≤ 0);
				// next window 3×(1000−e) + 1000 ≤ 4000 already at e = 0.
				{at: "10:00:01.975", op: "take", want: Result{Count: 4, Window: 1, ResetMS: 25, RetryAfterMS: 25}},
				{at: "10:00:01.999", op: "peek", want: Result{Count: 4, Window: 1, ResetMS: 1, RetryAfterMS: 1}},
				{at: "10:00:02.000", op: "peek", want: Result{Allowed: true, Count: 3, Remaining: 1, Window: 2, ResetMS: 1000}},
			},
		},
		{
			name: "sliding limit 1: RetryAfter may reach the window after next",
			lim:  sec(1, Sliding),
			steps: []step{
				{at: "10:00:00.000", op: "take", want: Result{Allowed: true, Count: 1, ResetMS: 1000}},
				{at: "10:00:00.500", op: "take", want: Result{Count: 1, ResetMS: 500, RetryAfterMS: 1500}},
				{at: "10:00:01.999", op: "take", want: Result{Count: 1, Window: 1, ResetMS: 1, RetryAfterMS: 1}},
				{at: "10:00:02.000", op: "take", want: Result{Allowed: true, Count: 1, Window: 2, ResetMS: 1000}},
			},
		},
		{
			name: "incr counts unconditionally",
			lim:  sec(5, Fixed),
			steps: []step{
				{at: "10:00:00.000", op: "incr", n: 3, want: Result{Allowed: true, Count: 3, Remaining: 2, ResetMS: 1000}},
				{at: "10:00:00.100", op: "incr", n: 2, want: Result{Count: 5, ResetMS: 900, RetryAfterMS: 900}},
				{at: "10:00:00.200", op: "incr", n: 4, want: Result{Count: 9, ResetMS: 800, RetryAfterMS: 800}},
				{at: "10:00:00.200", op: "take", want: Result{Count: 9, ResetMS: 800, RetryAfterMS: 800}},
				{at: "10:00:00.200", op: "incr", n: 0, want: Result{Count: 9, ResetMS: 800, RetryAfterMS: 800}},
				{at: "10:00:01.000", op: "incr", n: 1, want: Result{Allowed: true, Count: 1, Remaining: 4, Window: 1, ResetMS: 1000}},
			},
		},
		{
			name: "release undoes one take in its window only",
			lim:  sec(2, Fixed),
			steps: []step{
				{at: "10:00:00.000", op: "take", want: Result{Allowed: true, Count: 1, Remaining: 1, ResetMS: 1000}},
				{at: "10:00:00.000", op: "take", want: Result{Allowed: true, Count: 2, Remaining: 0, ResetMS: 1000}},
				{at: "10:00:00.000", op: "take", want: Result{Count: 2, ResetMS: 1000, RetryAfterMS: 1000}},
				{op: "release", win: 0},
				{at: "10:00:00.000", op: "peek", want: Result{Allowed: true, Count: 1, Remaining: 1, ResetMS: 1000}},
				{op: "release", win: 1},  // not held: no-op
				{op: "release", win: -5}, // not held: no-op
				{at: "10:00:00.000", op: "peek", want: Result{Allowed: true, Count: 1, Remaining: 1, ResetMS: 1000}},
				{op: "release", win: 0},
				{op: "release", win: 0}, // nothing local left: no-op, never negative
				{at: "10:00:00.000", op: "peek", want: Result{Allowed: true, Count: 0, Remaining: 2, ResetMS: 1000}},
				{at: "10:00:00.000", op: "take", want: Result{Allowed: true, Count: 1, Remaining: 1, ResetMS: 1000}},
			},
		},
		{
			name: "remote counts take part in decisions",
			lim:  sec(3, Fixed),
			steps: []step{
				{at: "10:00:00.000", op: "add", win: 0, n: 2, ok: true},
				{at: "10:00:00.000", op: "take", want: Result{Allowed: true, Count: 3, Remaining: 0, ResetMS: 1000}},
				{at: "10:00:00.000", op: "take", want: Result{Count: 3, ResetMS: 1000, RetryAfterMS: 1000}},
				{op: "release", win: 0},
				{op: "release", win: 0}, // remote hits cannot be released
				{at: "10:00:00.000", op: "peek", want: Result{Allowed: true, Count: 2, Remaining: 1, ResetMS: 1000}},
				{at: "10:00:00.500", op: "add", win: -1, n: 7, ok: true}, // previous window: accepted, irrelevant to Fixed
				{at: "10:00:00.500", op: "peek", want: Result{Allowed: true, Count: 2, Remaining: 1, ResetMS: 500}},
				{at: "10:00:00.500", op: "add", win: -2, n: 1, ok: false}, // stale
				{at: "10:00:00.500", op: "add", win: 2, n: 1, ok: false},  // too far ahead
				{at: "10:00:00.500", op: "add", win: 0, n: -1, ok: false},
				{at: "10:00:00.500", op: "add", win: 1, n: 5, ok: true}, // a peer a little ahead
				{at: "10:00:00.500", op: "peek", want: Result{Allowed: true, Count: 2, Remaining: 1, ResetMS: 500}},
				{at: "10:00:01.000", op: "take", want: Result{Count: 5, Window: 1, ResetMS: 1000, RetryAfterMS: 1000}},
			},
		},
		{
			name: "remote counts in a sliding previous window",
			lim:  sec(10, Sliding),
			steps: []step{
				{at: "10:00:01.000", op: "add", win: 0, n: 10, ok: true},
				{at: "10:00:01.500", op: "peek", want: Result{Allowed: true, Count: 5, Remaining: 5, Window: 1, ResetMS: 500}},
				// taking window 2 would drop window 0, which the estimate at
				// 10:00:01.500 still reads: refused, to be offered again.
				{at: "10:00:01.500", op: "add", win: 2, n: 1, ok: false},
				{at: "10:00:01.500", op: "peek", want: Result{Allowed: true, Count: 5, Remaining: 5, Window: 1, ResetMS: 500}},
				{at: "10:00:01.500", op: "add", win: 1, n: 5, ok: true},
				// 10×(1000−e) + 6×1000 ≤ 10000 from e = 600.
				{at: "10:00:01.500", op: "take", want: Result{Count: 10, Window: 1, ResetMS: 500, RetryAfterMS: 100}},
				{at: "10:00:01.600", op: "take", want: Result{Allowed: true, Count: 10, Window: 1, ResetMS: 400}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run(t, newStore(t, Config{}), tt.lim, tt.steps)
		})
	}
}

func TestWindowsAlignToWallClock(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 1, ScaleMS: 1000}
	a := s.Take(0, "k", lim, at(t, "10:00:00.999"))
	b := s.Take(0, "k", lim, at(t, "10:00:01.000"))
	if !a.Allowed || !b.Allowed {
		t.Fatalf("hits at .999 and 1.000 must fall into different 1 s windows: %+v %+v", a, b)
	}
	if b.Window != a.Window+1 || a.Window != at(t, "10:00:00.000").Unix() {
		t.Errorf("windows %d, %d; want %d, +1", a.Window, b.Window, at(t, "10:00:00.000").Unix())
	}
	// A key first hit mid-window does not get a window of its own.
	c := s.Take(0, "other", Limit{Limit: 5, ScaleMS: 60_000}, at(t, "10:00:45.000"))
	if c.ResetMS != 15_000 || c.Window != at(t, "10:00:00.000").Unix()/60 {
		t.Errorf("minute window: %+v", c)
	}
	// Before 1970 windows still align (floor division).
	r := s.Peek(0, "k", lim, time.UnixMilli(-500))
	if r.Window != -1 || r.ResetMS != 500 {
		t.Errorf("pre-epoch: window %d reset %d, want -1, 500", r.Window, r.ResetMS)
	}
}

// TestSlidingRetryAfterExhaustive checks, for many small states, that
// Peek's Allowed is the exact integer condition, Count is the estimate
// rounded up, and RetryAfterMS is the first instant at which a hit is
// admitted.
func TestSlidingRetryAfterExhaustive(t *testing.T) {
	start := at(t, "10:00:00.000").UnixMilli()
	for _, scale := range []int64{1, 2, 7, 10} {
		for limit := int64(1); limit <= 5; limit++ {
			for prev := int64(0); prev <= 12; prev++ {
				for cur := int64(0); cur <= 7; cur++ {
					lim := Limit{Limit: limit, ScaleMS: scale, Algorithm: Sliding}
					s := newStore(t, Config{Shards: 1})
					w0 := start / scale * scale // a window boundary
					s.Incr(0, "k", lim, prev, time.UnixMilli(w0))
					s.Incr(0, "k", lim, cur, time.UnixMilli(w0+scale))
					for e := int64(0); e < scale; e++ {
						now := w0 + scale + e
						r := s.Peek(0, "k", lim, time.UnixMilli(now))
						lhs, rhs := prev*(scale-e)+(cur+1)*scale, limit*scale
						if r.Allowed != (lhs <= rhs) {
							t.Fatalf("L%d s%d prev%d cur%d e%d: Allowed %v, condition %d ≤ %d", limit, scale, prev, cur, e, r.Allowed, lhs, rhs)
						}
						if want := (prev*(scale-e)+scale-1)/scale + cur; r.Count != want {
							t.Fatalf("L%d s%d prev%d cur%d e%d: Count %d, want %d", limit, scale, prev, cur, e, r.Count, want)
						}
						if r.Allowed != (r.Remaining > 0) {
							t.Fatalf("Allowed %v but Remaining %d", r.Allowed, r.Remaining)
						}
						if r.Allowed {
							if r.RetryAfterMS != 0 {
								t.Fatalf("allowed with RetryAfterMS %d", r.RetryAfterMS)
							}
							continue
						}
						if r.RetryAfterMS < 1 {
							t.Fatalf("RetryAfterMS %d < 1", r.RetryAfterMS)
						}
						if !s.Peek(0, "k", lim, time.UnixMilli(now+r.RetryAfterMS)).Allowed {
							t.Fatalf("L%d s%d prev%d cur%d e%d: not admitted after RetryAfterMS %d", limit, scale, prev, cur, e, r.RetryAfterMS)
						}
						for d := int64(1); d < r.RetryAfterMS; d++ {
							if s.Peek(0, "k", lim, time.UnixMilli(now+d)).Allowed {
								t.Fatalf("L%d s%d prev%d cur%d e%d: admitted at +%d, before RetryAfterMS %d", limit, scale, prev, cur, e, d, r.RetryAfterMS)
							}
						}
					}
				}
			}
		}
	}
}

func TestLimitValidate(t *testing.T) {
	for _, l := range []Limit{
		{Limit: 1, ScaleMS: 1},
		{Limit: MaxLimitFor(MaxScaleMS), ScaleMS: MaxScaleMS, Algorithm: Sliding},
		{Limit: MaxLimit, ScaleMS: MaxProduct / MaxLimit},
		{Limit: MaxLimitFor(30 * 86_400_000), ScaleMS: 30 * 86_400_000}, // a month
	} {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	for _, l := range []Limit{
		{},
		{Limit: 0, ScaleMS: 1000},
		{Limit: -1, ScaleMS: 1000},
		{Limit: MaxLimit + 1, ScaleMS: 1000},
		{Limit: 1, ScaleMS: 0},
		{Limit: 1, ScaleMS: MaxScaleMS + 1},
		{Limit: 1, ScaleMS: 365 * 86_400_000}, // a year
		{Limit: MaxLimit, ScaleMS: MaxScaleMS},
		{Limit: MaxLimitFor(MaxScaleMS) + 1, ScaleMS: MaxScaleMS},
		{Limit: MaxLimit, ScaleMS: MaxProduct/MaxLimit + 1},
		{Limit: 1, ScaleMS: 1000, Algorithm: 2},
	} {
		err := l.Validate()
		if !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%+v: err %v, want ErrInvalidLimit", l, err)
		}
		if l.valid() {
			t.Errorf("%+v: valid() disagrees with Validate", l)
		}
		s := newStore(t, Config{})
		now := at(t, "10:00:00.000")
		if r := s.Take(0, "k", l, now); r != (Result{}) {
			t.Errorf("Take with %+v = %+v, want zero Result", l, r)
		}
		if r := s.Incr(0, "k", l, 1, now); r != (Result{}) {
			t.Errorf("Incr with %+v = %+v, want zero Result", l, r)
		}
		if s.Add(0, "k", l, 0, 1, now) {
			t.Errorf("Add with %+v accepted", l)
		}
		if s.Len() != 0 {
			t.Errorf("invalid limit %+v stored a key", l)
		}
	}
}

func TestNewConfig(t *testing.T) {
	for _, cfg := range []Config{{MaxKeys: -1}, {Shards: -1}, {MaxKeyBytes: -1}, {Shards: maxShards + 1}} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v): err %v, want ErrInvalidConfig", cfg, err)
		}
	}
	tests := []struct {
		cfg                    Config
		shards, capacity, keyB int
	}{
		{Config{}, 64, (1_000_000 + 63) / 64, 128},
		{Config{MaxKeys: 10, Shards: 3, MaxKeyBytes: 40}, 4, 3, 40},
		{Config{MaxKeys: 10, Shards: 1}, 1, 10, 128},
		{Config{MaxKeys: 3, Shards: 8}, 8, 1, 128},
	}
	for _, tt := range tests {
		s := newStore(t, tt.cfg)
		if len(s.shards) != tt.shards || s.shards[0].capacity != tt.capacity || s.maxKeyBytes != tt.keyB {
			t.Errorf("New(%+v): %d shards of %d keys, MaxKeyBytes %d; want %d, %d, %d",
				tt.cfg, len(s.shards), s.shards[0].capacity, s.maxKeyBytes, tt.shards, tt.capacity, tt.keyB)
		}
	}
}

func TestCountLocalAndTotal(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 100, ScaleMS: 1000}
	now := at(t, "10:00:00.250")
	w := window(t, "10:00:00.250", 1000)
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 0 || tot != 0 {
		t.Errorf("unknown key: %d, %d", l, tot)
	}
	s.Take(0, "k", lim, now)
	s.Take(0, "k", lim, now)
	s.Incr(0, "k", lim, 3, now)
	s.Add(0, "k", lim, w, 10, now)
	s.Release(0, "k", lim, w)
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 4 || tot != 14 {
		t.Errorf("Count = %d, %d; want 4, 14", l, tot)
	}
	if l, tot := s.Count(1, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 0 || tot != 0 {
		t.Errorf("other bucket: %d, %d", l, tot)
	}
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 2000}, w); l != 0 || tot != 0 {
		t.Errorf("other scale: %d, %d", l, tot)
	}
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w-1); l != 0 || tot != 0 {
		t.Errorf("previous window: %d, %d", l, tot)
	}
	// After the window ends it is still readable as the previous one.
	s.Take(0, "k", lim, now.Add(time.Second))
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 4 || tot != 14 {
		t.Errorf("as previous window: %d, %d; want 4, 14", l, tot)
	}
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w+1); l != 1 || tot != 1 {
		t.Errorf("new window: %d, %d; want 1, 1", l, tot)
	}
}

func TestBucketsAreSeparate(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 1, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	if !s.Take(0, "k", lim, now).Allowed || !s.Take(1, "k", lim, now).Allowed {
		t.Fatal("the same key in two buckets must count separately")
	}
	if s.Take(1, "k", lim, now).Allowed {
		t.Fatal("second hit in bucket 1 admitted")
	}
	if s.Len() != 2 {
		t.Errorf("Len = %d, want 2", s.Len())
	}
}

func TestScaleChangeResets(t *testing.T) {
	s := newStore(t, Config{})
	old := Limit{Limit: 2, ScaleMS: 1000}
	now := at(t, "10:00:00.500")
	s.Take(0, "k", old, now)
	s.Take(0, "k", old, now)
	if s.Take(0, "k", old, now).Allowed {
		t.Fatal("limit not reached")
	}
	nu := Limit{Limit: 2, ScaleMS: 2000}
	if r := s.Peek(0, "k", nu, now); r.Count != 0 || !r.Allowed {
		t.Errorf("Peek in a new scale must read 0: %+v", r)
	}
	r := s.Take(0, "k", nu, now)
	if !r.Allowed || r.Count != 1 || r.ResetMS != 1500 {
		t.Errorf("Take after scale change: %+v, want a fresh window", r)
	}
	w := now.UnixMilli() / 1000
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 0 || tot != 0 {
		t.Errorf("old scale still counted: %d, %d", l, tot)
	}
	s.Release(0, "k", old, w) // wrong scale: no-op
	if l, _ := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 2000}, now.UnixMilli()/2000); l != 1 {
		t.Errorf("Release with the old scale changed the new count: %d", l)
	}
	if s.Len() != 1 {
		t.Errorf("Len = %d, want 1", s.Len())
	}
}

func TestSweep(t *testing.T) {
	s := newStore(t, Config{Shards: 4})
	fixed := Limit{Limit: 5, ScaleMS: 1000}
	sliding := Limit{Limit: 5, ScaleMS: 1000, Algorithm: Sliding}
	minute := Limit{Limit: 5, ScaleMS: 60_000}
	s.Take(0, "fixed", fixed, at(t, "10:00:00.500"))
	s.Take(0, "sliding", sliding, at(t, "10:00:00.500"))
	s.Take(0, "minute", minute, at(t, "10:00:00.500"))
	s.Take(0, "later", fixed, at(t, "10:00:01.500"))
	steps := []struct {
		at      string
		removed int
		left    int
	}{
		{"10:00:00.999", 0, 4},
		{"10:00:01.000", 1, 3}, // fixed: its window ended
		{"10:00:01.999", 0, 3}, // sliding: window 0 is still the previous window
		{"10:00:02.000", 2, 1}, // sliding and later
		{"10:00:59.999", 0, 1},
		{"10:01:00.000", 1, 0},
	}
	for _, st := range steps {
		if n := s.Sweep(at(t, st.at)); n != st.removed || s.Len() != st.left {
			t.Errorf("Sweep at %s removed %d leaving %d; want %d leaving %d", st.at, n, s.Len(), st.removed, st.left)
		}
	}
	// A swept sliding key starts from zero.
	if r := s.Peek(0, "sliding", sliding, at(t, "10:00:02.000")); r.Count != 0 {
		t.Errorf("swept key still counted: %+v", r)
	}
}

func TestSweepKeepsEntriesThatMoveOn(t *testing.T) {
	s := newStore(t, Config{Shards: 1})
	lim := Limit{Limit: 5, ScaleMS: 1000}
	s.Take(0, "a", lim, at(t, "10:00:00.000"))
	s.Take(0, "a", lim, at(t, "10:00:01.000")) // expiry moves to 10:00:02
	if n := s.Sweep(at(t, "10:00:01.500")); n != 0 || s.Len() != 1 {
		t.Errorf("Sweep removed %d, Len %d; want 0, 1", n, s.Len())
	}
	// Switching a key from Sliding to Fixed shortens its life.
	sl := Limit{Limit: 5, ScaleMS: 1000, Algorithm: Sliding}
	s.Take(0, "b", sl, at(t, "10:00:05.000"))
	s.Sweep(at(t, "10:00:05.500")) // minExpiry now exact: 10:00:07 for b
	s.Take(0, "b", lim, at(t, "10:00:05.500"))
	if n := s.Sweep(at(t, "10:00:06.000")); n != 1 {
		t.Errorf("Sweep after algorithm change removed %d, want 1", n)
	}
}

// mapID identifies a map's storage, to tell whether sweep rebuilt it.
func mapID(m any) uintptr { return reflect.ValueOf(m).Pointer() }

// rebuilt counts the maps of s that are no longer those in ids, and
// returns the current ones.
func rebuilt(s *Store, ids []uintptr) (n int, now []uintptr) {
	for i := range s.shards {
		now = append(now, mapID(s.shards[i].slots), mapID(s.shards[i].peers))
	}
	for i := range ids {
		if ids[i] != now[i] {
			n++
		}
	}
	return n, now
}

// liveHeap returns the bytes of live heap objects, after a full GC (which
// runtime.GC completes, sweeping included, before it returns).
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestSweepReturnsMemory floods the store with distinct keys, half of them
// with a peer's count, lets them expire and sweeps: the heap the store
// holds must fall back near its empty size, because sweep rebuilds the
// shard maps and per-peer tables that shrank (Go maps never shrink). It
// measures the live heap after a GC, not time.
func TestSweepReturnsMemory(t *testing.T) {
	const n = 200_000
	keys := ipKeys(n) // allocated before the baseline and kept to the end
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.500")
	s := newStore(t, Config{})
	long := Limit{Limit: 10, ScaleMS: 60_000}
	for i := range 10 { // a few keys outlive the flood
		s.Take(0, fmt.Sprint("live-", i), long, now)
	}

	empty := liveHeap()
	for i, k := range keys {
		if r := s.Take(0, k, lim, now); !r.Allowed {
			t.Fatalf("Take(%q) = %+v", k, r)
		}
		if i%2 == 0 {
			if st := s.Merge(1, WindowCount{Key: k, ScaleMS: 1000, Window: now.Unix(), Count: 1}, now); st != Merged {
				t.Fatalf("Merge(%q) = %v", k, st)
			}
		}
	}
	peak := liveHeap()
	_, ids := rebuilt(s, nil)
	if got := s.Sweep(now.Add(time.Second)); got != n || s.Len() != 10 {
		t.Fatalf("Sweep removed %d leaving %d; want %d leaving 10", got, s.Len(), n)
	}
	after := liveHeap()
	runtime.KeepAlive(s)
	runtime.KeepAlive(keys)

	rebuilds, _ := rebuilt(s, ids)
	for i := range s.shards {
		if s.shards[i].peers != nil {
			t.Errorf("shard %d: an emptied peer table is kept (%d tables)", i, len(s.shards[i].peers))
		}
	}
	grew, kept := peak-empty, after-empty
	t.Logf("heap: empty %.1f MiB, peak %+.1f MiB, after the sweep %+.2f MiB (%.1f%% of the growth kept); %d maps rebuilt",
		float64(empty)/(1<<20), float64(grew)/(1<<20), float64(kept)/(1<<20), 100*float64(kept)/float64(grew), rebuilds)
	if want := 2 * len(s.shards); rebuilds != want {
		t.Errorf("%d maps rebuilt, want %d (each shard's entries and peer counts)", rebuilds, want)
	}
	if kept > grew/5 {
		t.Errorf("after the sweep the store keeps %d of the %d bytes the flood added, over 20%%", kept, grew)
	}
}

// TestRebuildKeepsLiveEntries sweeps a flood out of a shard so that its
// maps are rebuilt, and checks that every live entry kept its counts, its
// peers' counts and its pending changes.
func TestRebuildKeepsLiveEntries(t *testing.T) {
	s := newStore(t, Config{Shards: 1, Track: true})
	sh := &s.shards[0]
	now := at(t, "10:00:00.500")
	w := now.Unix()
	flood := Limit{Limit: 100, ScaleMS: 1000}
	for i := range 4000 {
		k := fmt.Sprint("flood-", i)
		s.Take(0, k, flood, now)
		s.Merge(1, WindowCount{Key: k, ScaleMS: 1000, Window: w, Count: 2}, now)
	}
	// 300 keys that outlive the flood: local counts in two windows, remote
	// counts from Add, and two peers' counts for half of them.
	lim := Limit{Limit: 1000, ScaleMS: 60_000, Algorithm: Sliding}
	mw := now.UnixMilli() / lim.ScaleMS
	const live = 300
	key := func(i int) string { return fmt.Sprint("live-", i) }
	for i := range live {
		b := Bucket(i % 3)
		s.Incr(b, key(i), lim, int64(1+i%7), now.Add(-time.Minute))
		s.Incr(b, key(i), lim, int64(1+i%5), now)
		if i%4 == 0 {
			s.Add(b, key(i), lim, mw, 3, now)
		}
		if i%2 == 0 {
			for p := PeerID(1); p <= 2; p++ {
				s.Merge(p, WindowCount{Bucket: b, Key: key(i), ScaleMS: lim.ScaleMS, Algorithm: Sliding, Window: mw - 1, Count: int64(i%11) + int64(p)}, now)
				s.Merge(p, WindowCount{Bucket: b, Key: key(i), ScaleMS: lim.ScaleMS, Algorithm: Sliding, Window: mw, Count: int64(i%13) + int64(p)}, now)
			}
		}
	}
	// Changes pending for a third of the live keys only.
	s.Changes(nil, now)
	for i := 0; i < live; i += 3 {
		s.Take(Bucket(i%3), key(i), lim, now)
	}

	type counts struct{ local, total [2]int64 }
	read := func() map[string]counts {
		m := map[string]counts{}
		for i := range live {
			var c counts
			for j, win := range []int64{mw - 1, mw} {
				c.local[j], c.total[j] = s.Count(Bucket(i%3), key(i), lim, win)
			}
			m[key(i)] = c
		}
		return m
	}
	cmpPeer := func(a, b PeerCount) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Window, b.Window), cmp.Compare(a.Peer, b.Peer))
	}
	sweepAt := now.Add(time.Second) // the flood's window has ended
	wantCounts := read()
	wantSnap := slices.SortedFunc(slices.Values(s.LiveCounts(nil, sweepAt)), cmpPeer)
	wantPending := live / 3
	_, ids := rebuilt(s, nil)

	if n := s.Sweep(sweepAt); n != 4000 {
		t.Fatalf("Sweep removed %d, want 4000", n)
	}
	if n, _ := rebuilt(s, ids); n != 2 || sh.n != live || len(sh.peers) != live/2 || sh.high != live || sh.peersHigh != live/2 {
		t.Fatalf("after the sweep: %d rebuilds, %d entries (mark %d), %d peer tables (mark %d); want 2, %d, %d",
			n, sh.n, sh.high, len(sh.peers), sh.peersHigh, live, live/2)
	}
	if got := read(); !maps.Equal(got, wantCounts) {
		t.Errorf("counts changed by the rebuild:\n got %v\nwant %v", got, wantCounts)
	}
	if got := slices.SortedFunc(slices.Values(s.LiveCounts(nil, sweepAt)), cmpPeer); !slices.Equal(got, wantSnap) {
		t.Errorf("Snapshot changed by the rebuild:\n got %+v\nwant %+v", got, wantSnap)
	}
	if s.Pending() != wantPending {
		t.Errorf("Pending = %d, want %d", s.Pending(), wantPending)
	}
	// The peer counts are still each peer's latest: a repeat changes
	// nothing, a higher count adds only the difference.
	wc := WindowCount{Key: key(0), ScaleMS: lim.ScaleMS, Algorithm: Sliding, Window: mw, Count: 1}
	if st := s.Merge(1, wc, sweepAt); st != Unchanged {
		t.Errorf("repeated peer count after the rebuild: %v, want Unchanged", st)
	}
	wc.Count = 5
	if st := s.Merge(1, wc, sweepAt); st != Merged {
		t.Errorf("higher peer count after the rebuild: %v, want Merged", st)
	}
	if _, tot := s.Count(0, key(0), lim, mw); tot != wantCounts[key(0)].total[1]+4 {
		t.Errorf("total %d after a peer's count rose from 1 to 5, want %d", tot, wantCounts[key(0)].total[1]+4)
	}
	// The changes pending before the rebuild are reported, with their
	// running counts.
	got, _ := s.Changes(nil, sweepAt)
	if len(got) != wantPending {
		t.Errorf("Changes reported %d counts, want %d", len(got), wantPending)
	}
	for _, c := range got {
		var i int
		fmt.Sscanf(c.Key, "live-%d", &i)
		if i%3 != 0 || c.Bucket != Bucket(i%3) || c.Window != mw || c.Count != wantCounts[c.Key].local[1] {
			t.Errorf("change %+v, want window %d, local count %d of a key with a pending change", c, mw, wantCounts[c.Key].local[1])
		}
	}
}

// TestReclaimRebuilds: a full shard that reclaims its expired entries on
// insert rebuilds its map too, and below the floor nothing is rebuilt.
func TestReclaimRebuilds(t *testing.T) {
	s := newStore(t, Config{MaxKeys: 2 * rebuildFloor, Shards: 1})
	sh := &s.shards[0]
	lim := Limit{Limit: 10, ScaleMS: 1000}
	long := Limit{Limit: 10, ScaleMS: 60_000}
	now := at(t, "10:00:00.000")
	s.Incr(0, "long", long, 3, now)
	for i := range 2*rebuildFloor - 1 {
		s.Take(0, fmt.Sprint("k", i), lim, now)
	}
	if r := s.Take(0, "new", lim, now); !r.Overflow {
		t.Fatalf("Take on a full shard = %+v, want Overflow", r)
	}
	later := now.Add(time.Second)
	_, ids := rebuilt(s, nil)
	if r := s.Take(0, "new", lim, later); !r.Allowed || r.Overflow {
		t.Fatalf("Take after the shard's keys expired = %+v", r)
	}
	if n, _ := rebuilt(s, ids); sh.sweeps != 1 || n != 1 || sh.high != 1 || s.Len() != 2 {
		t.Errorf("%d sweeps, %d maps rebuilt, mark %d, Len %d; want 1, 1, 1, 2", sh.sweeps, n, sh.high, s.Len())
	}
	if l, _ := s.Count(0, "long", long, now.UnixMilli()/long.ScaleMS); l != 3 {
		t.Errorf("live key's count after the rebuild: %d, want 3", l)
	}

	small := newStore(t, Config{Shards: 1})
	for i := range rebuildFloor - 1 {
		small.Take(0, fmt.Sprint("k", i), lim, now)
	}
	_, ids = rebuilt(small, nil)
	small.Sweep(later)
	if n, _ := rebuilt(small, ids); n != 0 || small.shards[0].high != rebuildFloor-1 {
		t.Errorf("a map below the floor: %d maps rebuilt, mark %d; want 0, %d", n, small.shards[0].high, rebuildFloor-1)
	}
}

func TestKeyBound(t *testing.T) {
	s := newStore(t, Config{MaxKeys: 4, Shards: 1})
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	for i := range 4 {
		if r := s.Take(0, fmt.Sprint("k", i), lim, now); !r.Allowed || r.Overflow {
			t.Fatalf("key %d: %+v", i, r)
		}
	}
	r := s.Take(0, "k4", lim, now.Add(300*time.Millisecond))
	want := Result{Overflow: true, Window: now.Unix(), ResetMS: 700, RetryAfterMS: 700}
	if r != want {
		t.Errorf("Take over the bound = %+v, want %+v", r, want)
	}
	if r := s.Incr(0, "k5", lim, 1, now); !r.Overflow || r.Allowed {
		t.Errorf("Incr over the bound = %+v", r)
	}
	if s.Add(0, "k6", lim, now.Unix(), 1, now) {
		t.Error("Add over the bound accepted")
	}
	// An untracked key in a full shard cannot be counted: Peek must say so
	// rather than read it as 0 (a lockout bucket would fail open).
	if r := s.Peek(0, "k7", lim, now.Add(300*time.Millisecond)); r != want {
		t.Errorf("Peek of an untracked key over the bound = %+v, want %+v", r, want)
	}
	if r := s.Peek(0, "k0", lim, now); r.Overflow || !r.Allowed || r.Count != 1 {
		t.Errorf("Peek of a tracked key at the bound = %+v", r)
	}
	if s.Refused() != 3 || s.Len() != 4 {
		t.Errorf("Refused %d, Len %d; want 3, 4", s.Refused(), s.Len())
	}
	if r := s.Take(0, "k0", lim, now); !r.Allowed || r.Count != 2 {
		t.Errorf("existing key must keep working at the bound: %+v", r)
	}
	// Once the live keys' windows end, a new key reclaims their room, and
	// Peek reads an unknown key as 0 again.
	if r := s.Peek(0, "k7", lim, now.Add(time.Second)); r.Overflow || !r.Allowed || r.Count != 0 {
		t.Errorf("Peek after expiry = %+v, want 0 and allowed", r)
	}
	r = s.Take(0, "k4", lim, now.Add(time.Second))
	if !r.Allowed || r.Overflow {
		t.Errorf("Take after expiry = %+v, want admitted", r)
	}
	if s.Len() != 1 || s.Refused() != 3 {
		t.Errorf("Len %d, Refused %d; want 1, 3", s.Len(), s.Refused())
	}
}

func TestKeyBoundDoesNotSweepPerInsert(t *testing.T) {
	s := newStore(t, Config{MaxKeys: 100, Shards: 1})
	lim := Limit{Limit: 10, ScaleMS: 60_000}
	now := at(t, "10:00:00.000")
	for i := range 100 {
		s.Take(0, fmt.Sprint("live", i), lim, now)
	}
	for i := range 1000 {
		if r := s.Take(0, fmt.Sprint("flood", i), lim, now.Add(time.Duration(i)*time.Millisecond)); !r.Overflow {
			t.Fatalf("flood key %d admitted past the bound: %+v", i, r)
		}
	}
	if sw := s.shards[0].sweeps; sw > 1 {
		t.Errorf("%d sweeps for 1000 refused inserts of live-key flood, want ≤ 1", sw)
	}
	if s.Refused() != 1000 {
		t.Errorf("Refused = %d, want 1000", s.Refused())
	}
}

func TestKeyBoundManyShards(t *testing.T) {
	s := newStore(t, Config{MaxKeys: 10, Shards: 3}) // 4 shards of 3
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	overflow := 0
	for i := range 100 {
		if s.Take(0, fmt.Sprint("k", i), lim, now).Overflow {
			overflow++
		}
	}
	if s.Len() > 12 || s.Len()+overflow != 100 || uint64(overflow) != s.Refused() {
		t.Errorf("Len %d, overflow %d, Refused %d", s.Len(), overflow, s.Refused())
	}
}

func TestLongKeysAreDigested(t *testing.T) {
	s := newStore(t, Config{MaxKeyBytes: 16})
	lim := Limit{Limit: 1, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	long := strings.Repeat("x", 100)
	a, b := long+"a", long+"b"
	exact := strings.Repeat("y", 16)
	for _, k := range []string{a, b, exact, "#short", s.storedKey(a)} {
		if r := s.Take(0, k, lim, now); !r.Allowed {
			t.Errorf("first hit of %.20q… denied: keys must stay distinct", k)
		}
	}
	if r := s.Take(0, a, lim, now); r.Allowed {
		t.Error("second hit of a long key admitted: its digest must be stable")
	}
	if s.Len() != 5 {
		t.Errorf("Len = %d, want 5", s.Len())
	}
	raw := 0
	for i := range s.shards {
		for _, k := range s.shards[i].storedKeys() {
			if len(k.key) > max(16, digestLen) {
				t.Errorf("stored key of %d bytes", len(k.key))
			}
			if k.key == exact {
				raw++
			}
		}
	}
	if raw != 1 {
		t.Errorf("a key of exactly MaxKeyBytes must be stored as is")
	}
	// With room for a digest-sized raw key, a raw key equal to the digest
	// of another key must still not collide with it.
	s2 := newStore(t, Config{})
	long = strings.Repeat("z", 200)
	for _, k := range []string{long, s2.storedKey(long)} {
		if r := s2.Take(0, k, lim, now); !r.Allowed {
			t.Errorf("first hit of %.40q… denied: a raw key collides with a digest", k)
		}
	}
	if d := s.storedKey(a); len(d) != digestLen || d[0] != '#' || d == s.storedKey(b) {
		t.Errorf("digest %q", d)
	}
}

func TestKeysAreCloned(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 5, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	buf := []byte("203.0.113.45, 10.0.0.1")
	hdr := string(buf)
	s.Take(0, hdr[:12], lim, now)
	for i := range s.shards {
		for _, k := range s.shards[i].storedKeys() {
			if k.key != "203.0.113.45" || len(k.key) != 12 {
				t.Errorf("stored key %q", k.key)
			}
			if unsafe.StringData(k.key) == unsafe.StringData(hdr) {
				t.Error("stored key aliases the caller's string")
			}
		}
	}
}

// TestAddThenCount: remote hits added to a window count in its total, not
// in its local count; a window ended before the previous one is refused.
func TestAddThenCount(t *testing.T) {
	s, _ := New(Config{})
	lim := Limit{Limit: 100, ScaleMS: 1000}
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	r := s.Take(0, "tenant-a", lim, now)
	if !s.Add(0, "tenant-a", lim, r.Window, 30, now) {
		t.Fatal("Add refused a count of the current window")
	}
	if local, total := s.Count(0, "tenant-a", lim, r.Window); local != 1 || total != 31 {
		t.Errorf("local %d, total %d, want 1, 31", local, total)
	}
	if s.Add(0, "tenant-a", lim, r.Window-2, 30, now) {
		t.Error("Add took a count of a window that has ended")
	}
}

func TestAddRefusesWithoutStoring(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 3, ScaleMS: 1000, Algorithm: Sliding}
	now := at(t, "10:00:00.500")
	w := now.Unix()
	for _, win := range []int64{w - 2, w - 100, w + 2, w + 100} {
		if s.Add(0, "k", lim, win, 1, now) {
			t.Errorf("Add for window %+d accepted", win-w)
		}
	}
	if s.Add(0, "k", lim, w, -1, now) {
		t.Error("Add of a negative count accepted")
	}
	if !s.Add(0, "k", lim, w-1, 0, now) || !s.Add(0, "k", lim, w+1, 0, now) {
		t.Error("Add of 0 for an acceptable window must report true")
	}
	if s.Len() != 0 {
		t.Errorf("refused Adds stored %d keys", s.Len())
	}
}

func TestAddFutureWindowThenLocalTakes(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 3, ScaleMS: 1000}
	now := at(t, "10:00:00.900")
	w := now.Unix()
	// A peer whose clock is ahead reports window w+1 first.
	if !s.Add(0, "k", lim, w+1, 2, now) {
		t.Fatal("Add for now's window + 1 refused")
	}
	if r := s.Take(0, "k", lim, now); !r.Allowed || r.Count != 1 {
		t.Errorf("local Take in window w after a future Add: %+v", r)
	}
	r := s.Take(0, "k", lim, now.Add(100*time.Millisecond))
	if !r.Allowed || r.Count != 3 {
		t.Errorf("Take in window w+1 must see the earlier remote 2: %+v", r)
	}
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, w); l != 1 || tot != 1 {
		t.Errorf("window w: %d, %d", l, tot)
	}
	// An entry holding w+1 and w refuses w−1 as stale.
	if s.Add(0, "k", lim, w-1, 1, now) {
		t.Error("Add for a window the entry no longer holds accepted")
	}
}

func TestClockStepBack(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: 1, ScaleMS: 1000}
	if !s.Take(0, "k", lim, at(t, "10:00:05.000")).Allowed {
		t.Fatal("first hit")
	}
	// The local clock stepped back by seconds: it is authoritative.
	if r := s.Take(0, "k", lim, at(t, "10:00:02.000")); !r.Allowed || r.Count != 1 {
		t.Errorf("after step back: %+v", r)
	}
	if r := s.Take(0, "k", lim, at(t, "10:00:02.000")); r.Allowed {
		t.Errorf("limit not enforced after step back: %+v", r)
	}
}

func TestSaturation(t *testing.T) {
	s := newStore(t, Config{})
	lim := Limit{Limit: MaxLimitFor(MaxScaleMS), ScaleMS: MaxScaleMS, Algorithm: Sliding}
	now := at(t, "10:00:00.000")
	w := now.UnixMilli() / MaxScaleMS
	s.Incr(0, "k", lim, 1<<62, time.UnixMilli((w-1)*MaxScaleMS))
	s.Incr(0, "k", lim, 1<<62, time.UnixMilli((w-1)*MaxScaleMS))
	if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: MaxScaleMS}, w-1); l != MaxCount || tot != MaxCount {
		t.Errorf("local count not saturated: %d, %d", l, tot)
	}
	s.Add(0, "k", lim, w-1, 1<<62, time.UnixMilli(w*MaxScaleMS))
	late := time.UnixMilli(w*MaxScaleMS + MaxScaleMS - 1) // prev weight 1/scale
	r := s.Peek(0, "k", lim, late)
	// ceil(2^62 × 1 / (2^32−1)) = 2^30 + 1 (as 2^62 = (2^32−1)·2^30 + 2^30)
	if r.Count != 1<<30+1 || r.Allowed || r.RetryAfterMS != 1 {
		t.Errorf("Peek with saturated previous window: %+v", r)
	}
	if r := s.Peek(0, "k", lim, late.Add(time.Millisecond)); !r.Allowed || r.Count != 0 {
		t.Errorf("next window: %+v", r)
	}
}

// TestSuite is the behavioural suite run over both algorithms.
func TestSuite(t *testing.T) {
	for _, alg := range []Algorithm{Fixed, Sliding} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := Limit{Limit: 5, ScaleMS: 1000, Algorithm: alg}
			now := at(t, "10:00:00.250")

			t.Run("admits exactly Limit in a window, denied hits not counted", func(t *testing.T) {
				s := newStore(t, Config{})
				for i := range int64(12) {
					r := s.Take(0, "k", lim, now)
					if r.Allowed != (i < 5) {
						t.Fatalf("hit %d: Allowed %v", i, r.Allowed)
					}
					if want := min(i+1, 5); r.Count != want || r.Remaining != 5-want {
						t.Fatalf("hit %d: Count %d Remaining %d, want %d", i, r.Count, r.Remaining, want)
					}
					if !r.Allowed && (r.RetryAfterMS < 1 || r.RetryAfterMS < r.ResetMS) {
						t.Fatalf("hit %d: RetryAfterMS %d, ResetMS %d", i, r.RetryAfterMS, r.ResetMS)
					}
				}
				if l, tot := s.Count(0, "k", Limit{Limit: 1, ScaleMS: 1000}, now.Unix()); l != 5 || tot != 5 {
					t.Fatalf("Count = %d, %d; want 5, 5", l, tot)
				}
			})

			t.Run("Peek never counts or creates", func(t *testing.T) {
				s := newStore(t, Config{})
				for range 10 {
					if r := s.Peek(0, "k", lim, now); !r.Allowed || r.Count != 0 || r.Remaining != 5 || r.RetryAfterMS != 0 {
						t.Fatalf("Peek of unknown key = %+v", r)
					}
				}
				if s.Len() != 0 {
					t.Fatalf("Peek created a key")
				}
				s.Take(0, "k", lim, now)
				for range 10 {
					s.Peek(0, "k", lim, now)
				}
				if r := s.Peek(0, "k", lim, now); r.Count != 1 || !r.Allowed {
					t.Fatalf("Peek counted: %+v", r)
				}
			})

			t.Run("Release gives one back", func(t *testing.T) {
				s := newStore(t, Config{})
				var w int64
				for range 5 {
					w = s.Take(0, "k", lim, now).Window
				}
				if s.Take(0, "k", lim, now).Allowed {
					t.Fatal("6th hit admitted")
				}
				s.Release(0, "k", lim, w)
				if !s.Take(0, "k", lim, now).Allowed {
					t.Fatal("hit after Release denied")
				}
				s.Release(0, "unknown", lim, w)
				if s.Len() != 1 {
					t.Fatal("Release created a key")
				}
			})

			t.Run("remote hits count", func(t *testing.T) {
				s := newStore(t, Config{})
				w := now.Unix()
				if !s.Add(0, "k", lim, w, 4, now) {
					t.Fatal("Add refused")
				}
				if r := s.Take(0, "k", lim, now); !r.Allowed || r.Count != 5 {
					t.Fatalf("Take = %+v", r)
				}
				if s.Take(0, "k", lim, now).Allowed {
					t.Fatal("limit exceeded with remote hits")
				}
			})

			t.Run("Incr then Peek locks out", func(t *testing.T) {
				s := newStore(t, Config{})
				if r := s.Incr(0, "k", lim, 4, now); !r.Allowed {
					t.Fatalf("4 of 5: %+v", r)
				}
				if r := s.Incr(0, "k", lim, 1, now); r.Allowed || r.Remaining != 0 {
					t.Fatalf("5 of 5: %+v", r)
				}
				if r := s.Peek(0, "k", lim, now); r.Allowed || r.RetryAfterMS < r.ResetMS {
					t.Fatalf("Peek at the limit: %+v", r)
				}
			})

			t.Run("key bound", func(t *testing.T) {
				s := newStore(t, Config{MaxKeys: 2, Shards: 1})
				s.Take(0, "a", lim, now)
				s.Take(0, "b", lim, now)
				if r := s.Take(0, "c", lim, now); !r.Overflow || r.Allowed {
					t.Fatalf("third key: %+v", r)
				}
				if s.Refused() != 1 {
					t.Fatalf("Refused = %d", s.Refused())
				}
			})

			t.Run("concurrent Take admits exactly Limit", func(t *testing.T) {
				s := newStore(t, Config{Shards: 4})
				small := Limit{Limit: 10, ScaleMS: 60_000, Algorithm: alg}
				const keys, workers = 300, 16
				names := make([]string, keys)
				for k := range names {
					names[k] = fmt.Sprint("k", k)
				}
				var admitted [keys]atomic.Int64
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						// All workers walk the keys in the same order, so
						// every key's limit is crossed under contention.
						for k, name := range names {
							for range 2 {
								if s.Take(7, name, small, now).Allowed {
									admitted[k].Add(1)
								}
							}
						}
					})
				}
				wg.Wait()
				for k := range admitted {
					if n := admitted[k].Load(); n != 10 {
						t.Fatalf("key %d: admitted %d of %d, want exactly 10", k, n, 2*workers)
					}
					if l, _ := s.Count(7, fmt.Sprint("k", k), Limit{Limit: 1, ScaleMS: 60_000}, WindowOf(now.UnixMilli(), 60_000)); l != 10 {
						t.Fatalf("key %d: counted %d, want 10", k, l)
					}
				}
			})

			t.Run("Take on an existing key does not allocate", func(t *testing.T) {
				s := newStore(t, Config{})
				big := Limit{Limit: MaxLimit, ScaleMS: 1000, Algorithm: alg}
				key := string([]byte("203.0.113.45"))
				s.Take(0, key, big, now)
				allocs := testing.AllocsPerRun(1000, func() {
					s.Take(0, key, big, now)
					s.Peek(0, key, big, now)
				})
				if allocs != 0 {
					t.Fatalf("Take+Peek allocate %v per run, want 0", allocs)
				}
			})
		})
	}
}

func TestRun(t *testing.T) {
	s := newStore(t, Config{})
	if err := s.Run(t.Context(), 0); err == nil {
		t.Error("Run with interval 0 must fail")
	}
	// An entry from long ago is swept by Run.
	s.Take(0, "old", Limit{Limit: 1, ScaleMS: 1000}, time.Now().Add(-time.Hour))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Millisecond) }()
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, func() bool { return s.Len() == 0 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v on cancel, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
