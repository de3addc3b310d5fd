package snapshot

import (
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
)

// Resolver is the one place the limit of a (bucket, key) is decided:
// tenant override ▸ the bucket's limit without one (Bucket.Limit: its own
// ▸ the route default ▸ the built-in default, configfile.Bucket.Configured).
// An override applies only to an overridable bucket that has a limit, and
// only through its key (see limits.Overrides): nothing else a request
// carries can change the limit, and so reset the count, of a key other
// requests share.
//
// A Resolver is immutable and safe for concurrent use; Limit does not
// allocate. The zero Resolver resolves no bucket.
type Resolver struct {
	buckets []Bucket
	over    limits.Overrides
}

// NewResolver returns a Resolver for the buckets of s. over may be nil (a
// node without a database): then only the configuration decides.
func NewResolver(s *Snapshot, over limits.Overrides) *Resolver {
	return &Resolver{buckets: s.Buckets, over: over}
}

// Limit resolves the limit of the bucket at index i of Snapshot.Buckets
// (a rules bucket's index, as the matcher gives it) for a request whose
// key of it is key ("" when it has none: no override). ok is false for an
// index out of range or a bucket without any limit (one only Envoy's
// context_extensions name).
func (r *Resolver) Limit(i int, key string) (counter.Limit, bool) {
	if uint(i) >= uint(len(r.buckets)) {
		return counter.Limit{}, false
	}
	b := &r.buckets[i]
	if !b.HasLimit {
		return counter.Limit{}, false
	}
	if b.Overridable && key != "" && r.over != nil {
		if l, ok := r.over.OverrideFor(b.ID, key); ok {
			return l, true
		}
	}
	return b.Limit, true
}
