package replicate

import "github.com/ratelimit-authz/ratelimit-authz/internal/counter"

// Bounds says what a real peer can report for a bucket, so that a count
// from the wire is merged only when this node could have made it too.
// Package node wires it from the configuration (and the window lengths tenant
// overrides can have); Config.Bounds nil accepts every window length and
// count the counter accepts.
type Bounds interface {
	// PeerBound returns the largest running count a peer may report for
	// bucket (its index in the Table) in windows of scaleMS, and false when no limit of the bucket
	// on this node has windows of that length (the count is dropped).
	PeerBound(bucket counter.Bucket, scaleMS int64) (maxCount int64, ok bool)
}

// BucketWindows is a Bounds from a table: per bucket index, the largest
// count allowed per window length.
type BucketWindows []map[int64]int64

// PeerBound implements Bounds.
func (w BucketWindows) PeerBound(bucket counter.Bucket, scaleMS int64) (int64, bool) {
	if int(bucket) >= len(w) {
		return 0, false
	}
	n, ok := w[bucket][scaleMS]
	return n, ok
}

// PeerCountFactor is how far above its limit a peer's running count may
// be and still be merged as is: a count bucket (failed logins) keeps
// counting after the limit is reached, a little. Counts above limit ×
// PeerCountFactor are merged at that bound, which still denies.
const PeerCountFactor = 4

// BoundFor is the count bound of a limit: limit × PeerCountFactor, at
// most counter.MaxCount.
func BoundFor(limit int64) int64 {
	return min(limit*PeerCountFactor, counter.MaxCount)
}
