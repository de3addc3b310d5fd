package snapshot

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// Sources are the configuration files of one snapshot, read and validated
// by their own parsers.
type Sources struct {
	Rules *configfile.Rules // the rules file; required
	RLS   *rlsconfig.Config // the envoyproxy/ratelimit directory; nil: none
}

// Kind is what a bucket counts and so how every front end spends it: set
// once, at compile time, from the bucket's source.
type Kind uint8

const (
	// Requests: each admitted request counts 1, or its route's constant
	// (configfile.Route.Costs), taken at the check. RLS rules and limits
	// count hits this way.
	Requests Kind = iota
	// RequestCost: a cost the request carries (a header's value, its
	// content-length), taken at the check.
	RequestCost
	// Failures: responses with a failure status, charged from the access
	// log; the check only peeks.
	Failures
	// ResponseCost: a cost the response carries (a header's or trailer's
	// value, its body's bytes), charged from the access log; the check
	// only peeks.
	ResponseCost
	// InFlight: requests in flight. A check takes a lease of LeaseTTL
	// (package inflight) and the access log releases it; the Limit's
	// window is nominal (limits.ConcurrencyScaleMS).
	InFlight
	// Participants: the RLQS streams that hold a bucket's assignment,
	// counted per key (package rlqs).
	Participants
)

var kindNames = [...]string{Requests: "requests", RequestCost: "request cost", Failures: "failures", ResponseCost: "response cost", InFlight: "requests in flight", Participants: "participants"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind " + strconv.Itoa(int(k))
}

// AfterResponse reports whether a hit's cost is known only from the
// response: the check then only peeks and the access log charges.
func (k Kind) AfterResponse() bool { return k == Failures || k == ResponseCost }

// kindOf is what a rules bucket counts.
func kindOf(b *configfile.Bucket) Kind {
	switch {
	case b.Count == configfile.CountConcurrency:
		return InFlight
	case b.Cost.Source == configfile.CostFailures:
		return Failures
	case b.Cost.AfterResponse():
		return ResponseCost
	case b.Cost.Source != configfile.CostRequests:
		return RequestCost
	}
	return Requests
}

// ParticipantsPrefix begins the name of a participants count: the
// prefix, then the name of the bucket whose participants it counts (a "/"
// no bucket of the rules file has).
const ParticipantsPrefix = "rlqs/participants/"

// Bucket is one bucket of a snapshot, whatever its source: what it is
// called, how it is counted and limited, and its id in the counter.
type Bucket struct {
	// Name names the bucket to peers (replication) and in metrics and
	// logs; unique in a snapshot.
	Name string
	// Kind is what it counts.
	Kind Kind
	// ID is the bucket's id in the counter: Key's hash (see ID).
	ID counter.Bucket
	// Limit is the limit the bucket counts under without a tenant
	// override, when HasLimit: its own ▸ the route default ▸ the built-in
	// one of a shipped name. Its window and algorithm are the counts'
	// (zero for a rules bucket without a limit; an RLS rule's unit and
	// algorithm, and an RLS limit bucket's unit, even without one).
	Limit    counter.Limit
	HasLimit bool
	// Key is where a request's key of it comes from.
	Key match.KeySpec
	// Overridable buckets take tenant overrides, filed under
	// OverrideName (an RLS rule's name; a bucket's own name otherwise).
	// OverrideName is "" where no override may name the bucket: an RLS
	// rule that is not overridable, an RLS limit, a participants count
	// (an override naming a rules bucket that is not overridable is
	// refused as such).
	Overridable  bool
	OverrideName string
	// Reserved buckets may use the counter's reserve of keys.
	Reserved bool
	// Shadow buckets count and report but never deny.
	Shadow bool
	// Cost is where a rules bucket's cost comes from (its Kind says when
	// it is known).
	Cost configfile.Cost
	// LeaseTTL is an InFlight bucket's lease time to live.
	LeaseTTL time.Duration
	// DenyMissingKey refuses a request that lacks the key; otherwise it
	// is allowed uncounted.
	DenyMissingKey bool
	// DenyOverflow refuses a new key the counter has no room for;
	// otherwise it is allowed uncounted.
	DenyOverflow bool
	// Participants is the bucket's RLQS participants count, in the same
	// snapshot; nil: none (the quota section does not map it).
	Participants *Bucket
	// PeerBounds are the window lengths (ms) a peer may report of the
	// bucket, each with the largest count merged as is.
	PeerBounds map[int64]int64
}

// Key is what makes counts comparable: counts made under another name,
// window, algorithm, reserve or unit would mislead, so any change gives the
// bucket another id and a reload drops the old id's counts.
type Key struct {
	Name      string
	ScaleMS   int64
	Algorithm counter.Algorithm
	Reserved  bool
	// Unit is what a cost bucket counts (configfile.Cost.String: its
	// source and header); "" for requests and failures.
	Unit string
}

// ID is the counter id of k: the 32-bit FNV-1a hash of its fields. Ids
// never cross the wire (peers name buckets), so only this process needs
// to agree with itself; Compile refuses two keys with one id.
func ID(k Key) counter.Bucket {
	h := fnv.New32a()
	b := make([]byte, 0, len(k.Name)+32)
	b = append(b, k.Name...)
	b = append(b, 0)
	b = strconv.AppendInt(b, k.ScaleMS, 10)
	b = append(b, 0, byte(k.Algorithm))
	if k.Reserved {
		b = append(b, 1)
	}
	if k.Unit != "" {
		b = append(b, 0)
		b = append(b, k.Unit...)
	}
	h.Write(b)
	return counter.Bucket(h.Sum32())
}

// Snapshot is one compiled configuration, immutable and safe for
// concurrent use: every bucket of every source with its id, and the
// compiled routes. A component reads the snapshot it was handed.
type Snapshot struct {
	Rules   *configfile.Rules
	RLS     *rlsconfig.Config // nil: none
	Matcher *match.Engine
	// Buckets are every bucket: the rules file's first, by index (so
	// Buckets[i] is rules bucket i and matcher bucket i), then the RLS
	// rules', the RLS limit buckets' and the participants counts.
	Buckets []Bucket
	// RLSRules and RLSLimits are the RLS buckets, sub-slices of Buckets:
	// RLSRules[i] is rlsconfig's Rules()[i], RLSLimits[i] its
	// LimitBuckets()[i]; empty without RLS.
	RLSRules, RLSLimits []Bucket

	keys map[counter.Bucket]Key // by id
}

// Compile makes the snapshot of src. It refuses (and returns no
// snapshot) what no component could serve: no rules, routes that do not
// compile, an overridable RLS rule named as a rules bucket, a name given
// twice, two buckets whose keys hash to one id.
func Compile(src Sources) (*Snapshot, error) { return CompileWith(src, ID) }

// CompileWith is Compile with the ids given by id instead of ID: tests
// give ids by position (see ByPosition) or force a collision.
func CompileWith(src Sources, id func(Key) counter.Bucket) (*Snapshot, error) {
	r := src.Rules
	if r == nil {
		return nil, errors.New("snapshot: no rules")
	}
	if src.RLS != nil {
		if err := checkRLSNames(src.RLS, r); err != nil {
			return nil, err
		}
	}
	m, err := r.Matcher()
	if err != nil {
		return nil, fmt.Errorf("compile routes: %w", err)
	}
	s := &Snapshot{Rules: r, RLS: src.RLS, Matcher: m}
	s.addRules(r)
	var rules, lims int // the RLS buckets end at rules, then at lims
	if src.RLS != nil {
		rules, lims = s.addRLS(src.RLS)
	}
	counted := s.addQuota(r)
	if err := s.assignIDs(id); err != nil {
		return nil, err
	}
	// Buckets is complete: pointers into it and sub-slices of it hold.
	for i, p := range counted {
		s.Buckets[i].Participants = &s.Buckets[p]
	}
	if src.RLS != nil {
		n := len(r.Buckets)
		s.RLSRules, s.RLSLimits = s.Buckets[n:rules:rules], s.Buckets[rules:lims:lims]
	}
	return s, nil
}

// assignIDs gives every bucket its id, refusing a name given twice and a
// collision: two keys with one id would share counts.
func (s *Snapshot) assignIDs(id func(Key) counter.Bucket) error {
	names := make(map[string]bool, len(s.Buckets))
	byID := make(map[counter.Bucket]Key, len(s.Buckets))
	for i := range s.Buckets {
		b := &s.Buckets[i]
		if names[b.Name] {
			return fmt.Errorf("snapshot: bucket %q is named twice", b.Name)
		}
		names[b.Name] = true
		k := b.CountKey()
		b.ID = id(k)
		if other, dup := byID[b.ID]; dup {
			return fmt.Errorf("snapshot: buckets %q and %q have one counter id (%d), so they would share counts: rename one", other.Name, k.Name, b.ID)
		}
		byID[b.ID] = k
	}
	s.keys = byID
	return nil
}

// CountKey is the identity of b's counts (see Key): its name, its
// limit's window and algorithm (zero without one), its reserve and the
// unit of a cost or concurrency bucket.
func (b *Bucket) CountKey() Key {
	k := Key{Name: b.Name, ScaleMS: b.Limit.ScaleMS, Algorithm: b.Limit.Algorithm, Reserved: b.Reserved}
	if src := b.Cost.Source; src != configfile.CostRequests && src != configfile.CostFailures {
		k.Unit = b.Cost.String()
	}
	if b.Kind == InFlight {
		k.Unit = "concurrent-requests"
	}
	return k
}

// ByPosition is an id function for CompileWith that gives each bucket its
// position in Snapshot.Buckets (a rules bucket its index), so that a test
// reads the counter by index. It serves one compile.
func ByPosition() func(Key) counter.Bucket {
	var next counter.Bucket
	return func(Key) counter.Bucket { next++; return next - 1 }
}

// Has reports whether the snapshot has a bucket of counter id id.
func (s *Snapshot) Has(id counter.Bucket) bool {
	_, ok := s.keys[id]
	return ok
}

// Dropped are the ids of old's buckets that s no longer has, or has for
// another Key (a collision across the two, which Compile cannot see):
// their counts are to be dropped once s serves. Nil old: none.
func (s *Snapshot) Dropped(old *Snapshot) []counter.Bucket {
	if old == nil {
		return nil
	}
	var out []counter.Bucket
	for id, k := range old.keys {
		if now, ok := s.keys[id]; !ok || now != k {
			out = append(out, id)
		}
	}
	return out
}

// Concurrency are the concurrency buckets' ids by name (the names they
// travel under between nodes): the rules file's and the RLS rules'.
func (s *Snapshot) Concurrency() map[string]counter.Bucket {
	out := map[string]counter.Bucket{}
	for _, b := range s.Buckets {
		if b.Kind == InFlight {
			out[b.Name] = b.ID
		}
	}
	return out
}

// Reserved are the ids of the reserved buckets.
func (s *Snapshot) Reserved() []counter.Bucket {
	var out []counter.Bucket
	for i := range s.Buckets {
		if s.Buckets[i].Reserved {
			out = append(out, s.Buckets[i].ID)
		}
	}
	return out
}

// RuleBuckets are the rules file's buckets, by index.
func (s *Snapshot) RuleBuckets() []Bucket {
	n := len(s.Rules.Buckets)
	return s.Buckets[:n:n]
}

// checkRLSNames refuses an overridable rule named as a rules bucket: a
// tenant override names one bucket.
func checkRLSNames(c *rlsconfig.Config, r *configfile.Rules) error {
	for _, rule := range c.Rules() {
		if rule.Overridable && r.BucketIndex(rule.Name) >= 0 {
			return fmt.Errorf("%s:%d:%d: overridable rule %q has the name of an ext_authz bucket: tenant overrides could not tell them apart", rule.File, rule.Line, rule.Column, rule.Name)
		}
	}
	return nil
}
