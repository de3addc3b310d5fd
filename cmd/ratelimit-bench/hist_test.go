package main

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBucketsAreContiguousAndNarrow(t *testing.T) {
	prevHi := int64(-1)
	for i := range histBuckets {
		lo, hi := bucketRange(i)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		if hi < lo {
			t.Fatalf("bucket %d: [%d, %d]", i, lo, hi)
		}
		if width := hi - lo + 1; width > 1 && float64(width) > float64(lo)/128+1 {
			t.Fatalf("bucket %d: [%d, %d] is wider than 1/128 of its values", i, lo, hi)
		}
		prevHi = hi
	}
	if prevHi != maxTracked {
		t.Errorf("last bucket ends at %d, want maxTracked %d", prevHi, maxTracked)
	}
}

func TestBucketOfContainsValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	values := []int64{0, 1, 127, 128, 255, 256, 257, 511, 512, 1000, 1 << 20, maxTracked}
	for range 10_000 {
		values = append(values, rng.Int64N(maxTracked+1), rng.Int64N(1<<20))
	}
	for _, v := range values {
		lo, hi := bucketRange(bucketOf(v))
		if v < lo || v > hi {
			t.Fatalf("bucketOf(%d) = %d: [%d, %d]", v, bucketOf(v), lo, hi)
		}
	}
}

func TestQuantiles(t *testing.T) {
	var h histogram
	// 1 µs … 100 ms in 1 µs steps, shuffled.
	const n = 100_000
	rng := rand.New(rand.NewPCG(2, 2))
	for _, i := range rng.Perm(n) {
		h.record(time.Duration(i+1) * time.Microsecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{
		{0, time.Microsecond}, {0.5, 50 * time.Millisecond}, {0.9, 90 * time.Millisecond},
		{0.99, 99 * time.Millisecond}, {0.999, 99900 * time.Microsecond}, {1, 100 * time.Millisecond},
	} {
		got := h.quantile(tc.q)
		if rel := math.Abs(float64(got-tc.want)) / float64(tc.want); rel > 0.004 {
			t.Errorf("quantile(%v) = %v, want %v within 0.4%%", tc.q, got, tc.want)
		}
	}
	if got, want := h.mean(), 50000500*time.Nanosecond; math.Abs(float64(got-want)) > 1000 {
		t.Errorf("mean = %v, want %v", got, want)
	}
}

func TestQuantileNearestRank(t *testing.T) {
	var empty histogram
	if got := empty.quantile(0.99); got != 0 {
		t.Errorf("empty: %v", got)
	}
	var one histogram
	one.record(1234 * time.Microsecond)
	for _, q := range []float64{0, 0.5, 0.999, 1} {
		if got := one.quantile(q); got != 1234*time.Microsecond {
			t.Errorf("one value: quantile(%v) = %v", q, got)
		}
	}
	// 99 fast, 1 slow: p99 is fast (rank 99), p99.9 the slow one (rank 100).
	var h histogram
	for range 99 {
		h.record(time.Millisecond)
	}
	h.record(100 * time.Millisecond)
	if got := h.quantile(0.99); got < 996*time.Microsecond || got > 1004*time.Microsecond {
		t.Errorf("p99 = %v, want 1ms", got)
	}
	if got := h.quantile(0.999); got != 100*time.Millisecond {
		t.Errorf("p99.9 = %v, want 100ms", got)
	}
	// Values past the tracked range are clamped, not lost.
	var big histogram
	big.record(time.Duration(math.MaxInt64))
	big.record(-time.Second)
	if big.n != 2 || big.quantile(1) != time.Duration(maxTracked) || big.quantile(0) != 0 {
		t.Errorf("clamping: n=%d max=%v min=%v", big.n, big.quantile(1), big.quantile(0))
	}
}

func TestMergeEqualsWhole(t *testing.T) {
	var a, b, whole histogram
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 5000 {
		d := time.Duration(rng.ExpFloat64() * float64(time.Millisecond))
		whole.record(d)
		if i%3 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
	}
	var m histogram
	m.merge(&a)
	m.merge(&b)
	m.merge(new(histogram))
	if m.counts != whole.counts || m.n != whole.n || m.min != whole.min || m.max != whole.max {
		t.Fatal("merged histogram differs from the whole")
	}
	for _, q := range cdfQuantiles {
		if m.quantile(q) != whole.quantile(q) {
			t.Errorf("quantile(%v): merged %v, whole %v", q, m.quantile(q), whole.quantile(q))
		}
	}
}

func TestCDFQuantilesAscend(t *testing.T) {
	for i := 1; i < len(cdfQuantiles); i++ {
		if !(cdfQuantiles[i] > cdfQuantiles[i-1]) {
			t.Fatalf("cdfQuantiles[%d] = %v after %v", i, cdfQuantiles[i], cdfQuantiles[i-1])
		}
	}
	if cdfQuantiles[0] != 0 || cdfQuantiles[len(cdfQuantiles)-1] != 1 {
		t.Errorf("cdfQuantiles span [%v, %v], want [0, 1]", cdfQuantiles[0], cdfQuantiles[len(cdfQuantiles)-1])
	}
}
