package snapshot

import (
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

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

// ParticipantsWindow is the window of the RLQS participants counts (see
// package rlqs, which counts in it).
const ParticipantsWindow = 5 * time.Second

// addRules adds the rules file's buckets, by index. A bucket's limit is
// the one it counts under without an override; a peer may report its
// window with limit × PeerCountFactor and, for an overridable bucket,
// every window a tenant override can have (limits.Scales) with any count
// an override allows.
func (s *Snapshot) addRules(r *configfile.Rules) {
	for i, rb := range r.Buckets {
		b := Bucket{
			Name: rb.Name, Origin: FromRules, Index: i,
			Key: rb.Key, Overridable: rb.Overridable, OverrideName: rb.Name,
			// Failure buckets fail closed on a full key table, so they
			// keep room of their own that a flood of other keys cannot
			// take.
			Reserved: rb.Count == configfile.CountFailures, Shadow: rb.Shadow,
			Cost:           rb.Cost,
			Concurrency:    rb.Count == configfile.CountConcurrency,
			LeaseTTL:       rb.LeaseTTL,
			DenyMissingKey: rb.OnMissingKey == configfile.Deny,
			DenyOverflow:   rb.OnOverflow == configfile.Deny,
			Participants:   -1,
			PeerBounds:     map[int64]int64{},
		}
		add := func(l counter.Limit) {
			b.PeerBounds[l.ScaleMS] = max(b.PeerBounds[l.ScaleMS], BoundFor(l.Limit))
		}
		b.Limit, b.HasLimit = rb.Configured()
		if b.HasLimit {
			add(b.Limit)
		}
		if rb.Overridable {
			for _, sc := range limits.Scales {
				add(counter.Limit{Limit: counter.MaxLimit, ScaleMS: sc.MS})
			}
		}
		s.Buckets = append(s.Buckets, b)
	}
}

// addRLS adds the RLS rules, by rule index, then the buckets of
// descriptor-supplied limits, by LimitBuckets index (fixed windows). A
// rule's window is its unit's even without a limit (unlimited, or 0 per
// unit). A peer may report a rule's window with its limit ×
// PeerCountFactor and every tenant override window of an overridable one;
// a bucket of descriptor-supplied limits its unit's window with any count
// a requests_per_unit allows. Unlimited rules and limits of 0 count
// nothing, nor do windows the counter cannot hold: no peer count of
// theirs is merged.
func (s *Snapshot) addRLS(c *rlsconfig.Config) {
	for i := range c.Rules() {
		r := &c.Rules()[i]
		b := Bucket{
			Name: r.Bucket, Origin: FromRLSRule, Index: i,
			Key:         match.KeySpec{Kind: match.KeyTenant},
			Overridable: r.Overridable, OverrideName: r.Name, Shadow: r.Shadow,
			Participants: -1,
			PeerBounds:   map[int64]int64{},
		}
		b.Limit.Algorithm = r.Algorithm
		if !r.Unlimited {
			b.Limit.ScaleMS = r.Unit.Seconds() * 1000
		}
		if r.Concurrency {
			// Leases, not counts: no peer count is merged.
			b.Limit, _ = r.Limit()
			b.HasLimit, b.Concurrency, b.LeaseTTL = true, true, r.LeaseTTL
			s.Buckets = append(s.Buckets, b)
			continue
		}
		if l, ok := r.Limit(); ok {
			b.Limit, b.HasLimit = l, true
			b.PeerBounds[l.ScaleMS] = BoundFor(min(l.Limit, counter.MaxLimitFor(l.ScaleMS)))
			if r.Overridable {
				for _, sc := range limits.Scales {
					b.PeerBounds[sc.MS] = BoundFor(counter.MaxLimitFor(sc.MS))
				}
			}
		}
		s.Buckets = append(s.Buckets, b)
	}
	for i, lb := range c.LimitBuckets() {
		ms := lb.Unit.Seconds() * 1000
		b := Bucket{
			Name: lb.Bucket, Origin: FromRLSLimits, Index: i,
			Limit:        counter.Limit{ScaleMS: ms, Algorithm: counter.Fixed},
			Participants: -1,
			PeerBounds:   map[int64]int64{},
		}
		if ms <= counter.MaxScaleMS {
			b.PeerBounds[ms] = BoundFor(counter.MaxLimitFor(ms))
		}
		s.Buckets = append(s.Buckets, b)
	}
}

// addQuota adds a participants count for each bucket the quota section
// maps, once, in the order the section first names them. A peer may
// report at most one participant per stream, and a node serves at most
// max_streams (the nodes of a cluster share one rules file): a larger
// count is clamped, so a forged one can shrink shares, never enlarge
// them.
func (s *Snapshot) addQuota(r *configfile.Rules) {
	if r.Quota == nil {
		return
	}
	ms := ParticipantsWindow.Milliseconds()
	for _, e := range r.Quota.Buckets {
		rb := &s.Buckets[e.Bucket]
		if rb.Participants >= 0 {
			continue
		}
		rb.Participants = len(s.Buckets)
		s.Buckets = append(s.Buckets, Bucket{
			Name: ParticipantsPrefix + rb.Name, Origin: FromQuota, Index: e.Bucket,
			Limit:        counter.Limit{Limit: counter.MaxLimitFor(ms), ScaleMS: ms, Algorithm: counter.Fixed},
			HasLimit:     true,
			Participants: -1,
			PeerBounds:   map[int64]int64{ms: int64(r.Quota.MaxStreams)},
		})
	}
}
