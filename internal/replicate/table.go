package replicate

import (
	"errors"
	"fmt"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Table is the configuration replication follows: which buckets this node
// has, by name, and what a peer may report for each. Nodes name buckets
// to each other by name, so nodes whose configurations differ (a rollout,
// a reload that reached one node first) keep replicating the buckets
// they share and drop, counted, what they do not.
type Table struct {
	// Buckets are the bucket names, by index. Required.
	Buckets []string
	// IDs are the buckets' ids in the counter, by index; nil: the index.
	IDs []counter.Bucket
	// Algorithms are the buckets' algorithms, by index: a count made in
	// another one is dropped (reason "algorithm"); nil: any algorithm.
	Algorithms []counter.Algorithm
	// Bounds, by index, says which window lengths and counts a peer may
	// report (see Bounds); nil: every one the counter accepts.
	Bounds Bounds
}

// table is a Table made ready for lookups, immutable.
type table struct {
	idx    map[string]int   // name → index
	ids    []counter.Bucket // by index
	names  map[counter.Bucket]string
	algs   []counter.Algorithm
	bounds Bounds
}

func newTable(t Table) (*table, error) {
	if len(t.Buckets) == 0 {
		return nil, errors.New("replicate: no buckets")
	}
	if t.IDs != nil && len(t.IDs) != len(t.Buckets) {
		return nil, fmt.Errorf("replicate: %d bucket ids for %d buckets", len(t.IDs), len(t.Buckets))
	}
	if t.Algorithms != nil && len(t.Algorithms) != len(t.Buckets) {
		return nil, fmt.Errorf("replicate: %d algorithms for %d buckets", len(t.Algorithms), len(t.Buckets))
	}
	tb := &table{
		idx: make(map[string]int, len(t.Buckets)), ids: make([]counter.Bucket, len(t.Buckets)),
		names: make(map[counter.Bucket]string, len(t.Buckets)), algs: t.Algorithms, bounds: t.Bounds,
	}
	for i, b := range t.Buckets {
		if _, dup := tb.idx[b]; b == "" || len(b) > maxNameLen || dup {
			return nil, fmt.Errorf("replicate: bucket name %q is empty, too long or repeated", b)
		}
		tb.idx[b] = i
		id := counter.Bucket(i)
		if t.IDs != nil {
			id = t.IDs[i]
		}
		if _, dup := tb.names[id]; dup {
			return nil, fmt.Errorf("replicate: bucket id %d given twice", id)
		}
		tb.ids[i], tb.names[id] = id, b
	}
	return tb, nil
}

// name is the bucket name of a counter id, "" when this configuration
// does not have it (a bucket a reload removed).
func (tb *table) name(id counter.Bucket) string { return tb.names[id] }

// TableFrom is the table of snap: every bucket of every source, by name,
// with its algorithm and what a peer may report of it.
func TableFrom(snap *snapshot.Snapshot) Table {
	t := Table{
		Buckets:    make([]string, len(snap.Buckets)),
		IDs:        make([]counter.Bucket, len(snap.Buckets)),
		Algorithms: make([]counter.Algorithm, len(snap.Buckets)),
	}
	w := make(BucketWindows, len(snap.Buckets))
	for i, b := range snap.Buckets {
		t.Buckets[i], t.IDs[i], t.Algorithms[i], w[i] = b.Name, b.ID, b.Limit.Algorithm, b.PeerBounds
	}
	t.Bounds = w
	return t
}

// Prepare validates snap's table and returns what makes it the
// configuration of the next batch sent and received; it changes nothing
// itself.
func (r *Replicator) Prepare(snap *snapshot.Snapshot) (swap func(), err error) {
	tb, err := newTable(TableFrom(snap))
	if err != nil {
		return nil, err
	}
	return func() { r.tab.Store(tb) }, nil
}

// Update makes t the configuration of the next batch sent and received;
// one being merged finishes on the previous one. On an error nothing
// changes.
func (r *Replicator) Update(t Table) error {
	tb, err := newTable(t)
	if err != nil {
		return err
	}
	r.tab.Store(tb)
	return nil
}
