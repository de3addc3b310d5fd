package counter

import (
	"math"
	"testing"
	"time"
)

func TestWindowOf(t *testing.T) {
	for _, c := range []struct{ t, scale, want int64 }{
		{0, 1000, 0},
		{999, 1000, 0},
		{1000, 1000, 1},
		{-1, 1000, -1},
		{-1000, 1000, -1},
		{-1001, 1000, -2},
		{7, 1, 7},
		{-7, 1, -7},
		{math.MaxInt64, MaxScaleMS, math.MaxInt64 / MaxScaleMS},
		{math.MinInt64, 1, math.MinInt64},
	} {
		got := WindowOf(c.t, c.scale)
		if got != c.want {
			t.Errorf("WindowOf(%d, %d) = %d, want %d", c.t, c.scale, got, c.want)
		}
		// The window holds t: it starts at or before it and ends after it.
		if start := got * c.scale; start > c.t || c.t-start >= c.scale {
			t.Errorf("WindowOf(%d, %d) = %d: window [%d, +%d) does not hold t", c.t, c.scale, got, start, c.scale)
		}
	}
}

func TestLive(t *testing.T) {
	now := time.UnixMilli(10_500) // window 10 of 1 s
	for _, c := range []struct {
		alg    Algorithm
		window int64
		want   bool
	}{
		{Fixed, 8, false}, {Fixed, 9, false}, {Fixed, 10, true}, {Fixed, 11, true}, {Fixed, 12, false},
		{Sliding, 8, false}, {Sliding, 9, true}, {Sliding, 10, true}, {Sliding, 11, true}, {Sliding, 12, false},
	} {
		if got := Live(c.alg, 1000, c.window, now); got != c.want {
			t.Errorf("Live(%v, 1000, %d) at 10.5 s = %v, want %v", c.alg, c.window, got, c.want)
		}
	}
	// Before the epoch: -0.5 s is in window -1.
	if !Live(Fixed, 1000, -1, time.UnixMilli(-500)) || Live(Fixed, 1000, -2, time.UnixMilli(-500)) {
		t.Error("Live before the epoch")
	}
}
