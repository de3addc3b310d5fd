package replicate

import "github.com/ratelimit-authz/ratelimit-authz/internal/counter"

// Bounds says what a real peer can report for a bucket, so that a count
// from the wire is merged only when this node could have made it too.
// TableFrom takes it from the snapshot (snapshot.Bucket.PeerBounds: the
// window lengths of the bucket's limit and of tenant overrides);
// Config.Bounds nil accepts every window length and count the counter
// accepts.
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
