package replicate

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// Bucket is one bucket of the configuration replication follows: the name
// nodes know it by, its id in this node's counter, and what a peer may
// report of it. Nodes name buckets to each other by name, so nodes whose
// configurations differ (a rollout, a reload that reached one node first)
// keep replicating the buckets they share and drop, counted, what they do
// not.
type Bucket struct {
	// Name is unique among the buckets, at most maxNameLen bytes.
	Name string
	// ID is the bucket's id in the counter, unique among the buckets.
	ID counter.Bucket
	// Algorithm is the algorithm the bucket counts in: a peer's count
	// made in another one is dropped (reason "algorithm").
	Algorithm counter.Algorithm
	// Bounds are the window lengths (ms) a peer may report of the
	// bucket, each with the largest count merged as is: a count of
	// another window is dropped (reason "scale"), a larger one merged at
	// the bound. Nil accepts every window and count the counter accepts;
	// empty, none.
	Bounds map[int64]int64
}

// table is a copy of the buckets made ready for lookups, immutable.
type table struct {
	buckets []Bucket
	idx     map[string]int // name → index in buckets
	names   map[counter.Bucket]string
}

func newTable(bs []Bucket) (*table, error) {
	if len(bs) == 0 {
		return nil, errors.New("replicate: no buckets")
	}
	tb := &table{buckets: slices.Clone(bs), idx: make(map[string]int, len(bs)), names: make(map[counter.Bucket]string, len(bs))}
	for i, b := range bs {
		if _, dup := tb.idx[b.Name]; b.Name == "" || len(b.Name) > maxNameLen || dup {
			return nil, fmt.Errorf("replicate: bucket name %q is empty, too long or repeated", b.Name)
		}
		if _, dup := tb.names[b.ID]; dup {
			return nil, fmt.Errorf("replicate: bucket id %d given twice", b.ID)
		}
		tb.idx[b.Name], tb.names[b.ID] = i, b.Name
	}
	return tb, nil
}

// name is the bucket name of a counter id, "" when this configuration
// does not have it (a bucket a reload removed).
func (tb *table) name(id counter.Bucket) string { return tb.names[id] }

// Prepare validates bs and returns what makes them the configuration of
// the next batch sent and received (one being merged finishes on the
// previous one); it changes nothing itself. The
// Replicator reads the buckets' Bounds from then on: they must not
// change.
func (r *Replicator) Prepare(bs []Bucket) (swap func(), err error) {
	tb, err := newTable(bs)
	if err != nil {
		return nil, err
	}
	return func() { r.tab.Store(tb) }, nil
}
