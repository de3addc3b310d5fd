package main

import (
	"math"
	"math/bits"
	"time"
)

// histogram records latencies (nanoseconds) in log-linear buckets, as HDR
// histograms do: exact below 256 ns, then 128 buckets per power of two, so
// a bucket is at most 1/128 of its value wide and a reported percentile
// (the bucket's midpoint, clamped to the exact min and max) is within 0.4%
// of the true value. Values above maxTracked are counted as maxTracked.
// Not safe for concurrent use: each worker has its own, merged at the end.
// The zero value is empty and ready to use.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

const (
	subBits     = 7                                        // 2^7 = 128 sub-buckets per power of two
	maxTracked  = int64(1)<<40 - 1                         // ≈ 18 minutes
	histBuckets = (40-subBits-1)<<subBits + 1<<(subBits+1) // bucketOf(maxTracked) + 1
)

// bucketOf returns the bucket index of v ≥ 0.
func bucketOf(v int64) int {
	u := uint64(v)
	shift := bits.Len64(u) - (subBits + 1)
	if shift <= 0 {
		return int(u) // < 256: exact
	}
	return shift<<subBits + int(u>>uint(shift))
}

// bucketRange returns the smallest and largest value of bucket i.
func bucketRange(i int) (lo, hi int64) {
	if i < 1<<(subBits+1) {
		return int64(i), int64(i)
	}
	shift := i>>subBits - 1
	top := int64(i - shift<<subBits)
	return top << uint(shift), (top+1)<<uint(shift) - 1
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	if v > maxTracked {
		v = maxTracked
	}
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

func (h *histogram) merge(o *histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// quantile returns the value at quantile q in [0, 1]: the smallest recorded
// value v such that at least q of all values are ≤ v (nearest rank), to
// the bucket's precision. It returns 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.min)
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank == 0 {
		rank = 1
	}
	if rank >= h.n { // the largest value, known exactly
		return time.Duration(h.max)
	}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			lo, hi := bucketRange(i)
			v := lo + (hi-lo)/2
			return time.Duration(min(max(v, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// cdfQuantiles are the points of the latency distribution written to the
// JSON results, dense in the tail: what a latency CDF plot needs.
var cdfQuantiles = func() []float64 {
	var qs []float64
	for _, r := range [][3]float64{{0, 90, 2}, {90, 99, 0.5}, {99, 99.9, 0.1}, {99.9, 99.99, 0.01}} { // from, to, step in %
		for p := r[0]; p < r[1]; p += r[2] {
			qs = append(qs, p/100)
		}
	}
	return append(qs, 0.9999, 0.99999, 1)
}()
