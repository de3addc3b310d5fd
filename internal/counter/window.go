package counter

import "time"

// Window arithmetic lives here and nowhere else: every node must map an
// instant to the same window, so every package (replication included)
// computes windows with these functions.

// WindowOf returns the number of the window of length scale that holds the
// instant t, both in one unit (ms for counts): floor(t / scale), rounded
// down before the epoch too, so that every window starts at a multiple of
// scale whatever the sign of t. scale must be positive.
func WindowOf(t, scale int64) int64 {
	w, _ := windowSplit(t, scale)
	return w
}

// windowSplit returns WindowOf(t, scale) and the time elapsed in that
// window, 0 ≤ elapsed < scale. It is small enough to be inlined: Take,
// Peek and Incr call it with now.UnixMilli().
func windowSplit(t, scale int64) (window, elapsed int64) {
	window = t / scale // rounds toward zero
	elapsed = t - window*scale
	if elapsed < 0 {
		window--
		elapsed += scale
	}
	return window, elapsed
}

// Live reports whether a count of window, in windows of scaleMS counted
// with alg, can still matter at now: for Fixed, now's window or the next
// (a peer whose clock is a little ahead); for Sliding, also the previous
// window, which the estimate still reads. Counts of any other window are
// stale: neither sent nor merged.
func Live(alg Algorithm, scaleMS, window int64, now time.Time) bool {
	w := WindowOf(now.UnixMilli(), scaleMS)
	lo := w
	if alg == Sliding {
		lo = w - 1
	}
	return window >= lo && window <= w+1
}
