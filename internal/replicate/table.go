package replicate

import (
	"errors"
	"fmt"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
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
	names  []string         // by id; "": not in this configuration
	algs   []counter.Algorithm
	bounds Bounds
}

// maxTableID bounds the ids a Table may hold (names is a slice by id).
const maxTableID = 1 << 24

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
	tb := &table{idx: make(map[string]int, len(t.Buckets)), ids: make([]counter.Bucket, len(t.Buckets)), algs: t.Algorithms, bounds: t.Bounds}
	maxID := 0
	for i, b := range t.Buckets {
		if _, dup := tb.idx[b]; b == "" || len(b) > maxNameLen || dup {
			return nil, fmt.Errorf("replicate: bucket name %q is empty, too long or repeated", b)
		}
		tb.idx[b] = i
		id := counter.Bucket(i)
		if t.IDs != nil {
			id = t.IDs[i]
		}
		if id >= maxTableID {
			return nil, fmt.Errorf("replicate: bucket id %d is implausibly large", id)
		}
		tb.ids[i] = id
		maxID = max(maxID, int(id))
	}
	tb.names = make([]string, maxID+1)
	for i, id := range tb.ids {
		if tb.names[id] != "" {
			return nil, fmt.Errorf("replicate: bucket id %d given twice", id)
		}
		tb.names[id] = t.Buckets[i]
	}
	return tb, nil
}

// name is the bucket name of a counter id, "" when this configuration
// does not have it (a bucket a reload removed).
func (tb *table) name(id counter.Bucket) string {
	if int(id) < len(tb.names) {
		return tb.names[id]
	}
	return ""
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
