package rlqs

import (
	"slices"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
)

// Bounds of one bucket id, as Envoy sends it. Its values come from client
// requests (a header's value): these keep what a stream holds small.
const (
	// MaxIDEntries is the most entries a bucket id may have.
	MaxIDEntries = 8
	// MaxIDBytes bounds the sum of a bucket id's entry names and values.
	MaxIDBytes = 512
)

// Match is where a bucket id counts: bucket Bucket (an index into
// Config.Buckets) under counter key Key, Cost a request (at least 1, at
// most counter.MaxLimit). Entry is the index of the mapping entry that
// matched.
type Match struct {
	Entry  int
	Bucket int
	Key    string
	Cost   int64
}

// Mapping finds the entry of a quota section a bucket id matches. It is
// immutable and safe for concurrent use.
type Mapping struct {
	entries []entry
}

type entry struct {
	match  []kv // sorted by name
	key    string
	bucket int
	cost   int64
}

type kv struct{ k, v string }

// NewMapping compiles the entries of a quota section.
func NewMapping(q []configfile.QuotaBucket) *Mapping {
	m := &Mapping{entries: make([]entry, len(q))}
	for i, e := range q {
		ms := make([]kv, 0, len(e.Match))
		for k, v := range e.Match {
			ms = append(ms, kv{k, v})
		}
		slices.SortFunc(ms, func(a, b kv) int { return strings.Compare(a.k, b.k) })
		m.entries[i] = entry{match: ms, key: e.Key, bucket: int(e.Bucket), cost: max(1, e.Cost)}
	}
	return m
}

// Lookup returns the entry id matches: its entries are exactly the entry's
// match entries, with equal values, plus the entry's key entry. No two
// entries of a valid configuration match one id (rules checks), so the
// first match is the only one.
func (m *Mapping) Lookup(id map[string]string) (Match, bool) {
	for i := range m.entries {
		e := &m.entries[i]
		if len(id) != len(e.match)+1 {
			continue
		}
		key, ok := id[e.key]
		if !ok {
			continue
		}
		all := true
		for _, p := range e.match {
			if v, ok := id[p.k]; !ok || v != p.v {
				all = false
				break
			}
		}
		if all {
			return Match{Entry: i, Bucket: e.bucket, Key: key, Cost: e.cost}, true
		}
	}
	return Match{}, false
}

// idProblem says why a bucket id is beyond the bounds, or "" when it is
// within them. An empty bucket id is a problem: Envoy never sends one.
func idProblem(id map[string]string) string {
	switch {
	case len(id) == 0:
		return "empty"
	case len(id) > MaxIDEntries:
		return "entries"
	}
	n := 0
	for k, v := range id {
		n += len(k) + len(v)
	}
	if n > MaxIDBytes {
		return "bytes"
	}
	return ""
}

// idKey is a canonical text of a bucket id within the bounds: its entries
// sorted by name, each length-prefixed, so that no two ids share one.
func idKey(id map[string]string) string {
	names := make([]string, 0, len(id))
	n := 0
	for k, v := range id {
		names = append(names, k)
		n += len(k) + len(v) + 4
	}
	slices.Sort(names)
	var b strings.Builder
	b.Grow(n)
	for _, k := range names {
		v := id[k]
		b.WriteByte(byte(len(k) >> 8))
		b.WriteByte(byte(len(k)))
		b.WriteString(k)
		b.WriteByte(byte(len(v) >> 8))
		b.WriteByte(byte(len(v)))
		b.WriteString(v)
	}
	return b.String()
}
