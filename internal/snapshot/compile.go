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
	for i := range r.Buckets {
		rb := &r.Buckets[i]
		b := Bucket{
			Name: rb.Name, Kind: kindOf(rb),
			Key: rb.Key, Overridable: rb.Overridable, OverrideName: rb.Name,
			Shadow:         rb.Shadow,
			Cost:           rb.Cost,
			LeaseTTL:       rb.LeaseTTL,
			DenyMissingKey: rb.OnMissingKey == configfile.Deny,
			DenyOverflow:   rb.OnOverflow == configfile.Deny,
			PeerBounds:     map[int64]int64{},
		}
		// Failure buckets fail closed on a full key table, so they keep
		// room of their own that a flood of other keys cannot take.
		b.Reserved = b.Kind == Failures
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
// theirs is merged. It returns where the rules' buckets and the limits'
// end in Buckets.
func (s *Snapshot) addRLS(c *rlsconfig.Config) (rules, lims int) {
	for i := range c.Rules() {
		r := &c.Rules()[i]
		b := Bucket{
			Name: r.Bucket, Kind: Requests,
			Key:         match.KeySpec{Kind: match.KeyTenant},
			Overridable: r.Overridable, Shadow: r.Shadow,
			PeerBounds: map[int64]int64{},
		}
		if r.Overridable {
			b.OverrideName = r.Name
		}
		if r.Charge {
			b.Kind = ResponseCost
		}
		b.Limit.Algorithm = r.Algorithm
		if !r.Unlimited {
			b.Limit.ScaleMS = r.Unit.Seconds() * 1000
		}
		if r.Concurrency {
			// Leases, not counts: no peer count is merged.
			b.Limit, _ = r.Limit()
			b.HasLimit, b.Kind, b.LeaseTTL = true, InFlight, r.LeaseTTL
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
	rules = len(s.Buckets)
	for _, lb := range c.LimitBuckets() {
		ms := lb.Unit.Seconds() * 1000
		b := Bucket{
			Name: lb.Bucket, Kind: Requests,
			Limit:      counter.Limit{ScaleMS: ms, Algorithm: counter.Fixed},
			PeerBounds: map[int64]int64{},
		}
		if ms <= counter.MaxScaleMS {
			b.PeerBounds[ms] = BoundFor(counter.MaxLimitFor(ms))
		}
		s.Buckets = append(s.Buckets, b)
	}
	return rules, len(s.Buckets)
}

// addQuota adds a participants count for each bucket the quota section
// maps, once, in the order the section first names them. A peer may
// report at most one participant per stream, and a node serves at most
// max_streams (the nodes of a cluster share one rules file): a larger
// count is clamped, so a forged one can shrink shares, never enlarge
// them. It returns, by rules bucket index, where each count is in
// Buckets.
func (s *Snapshot) addQuota(r *configfile.Rules) map[int]int {
	if r.Quota == nil {
		return nil
	}
	ms := ParticipantsWindow.Milliseconds()
	counted := map[int]int{}
	for _, e := range r.Quota.Buckets {
		if _, ok := counted[e.Bucket]; ok {
			continue
		}
		counted[e.Bucket] = len(s.Buckets)
		s.Buckets = append(s.Buckets, Bucket{
			Name: ParticipantsPrefix + s.Buckets[e.Bucket].Name, Kind: Participants,
			Limit:      counter.Limit{Limit: counter.MaxLimitFor(ms), ScaleMS: ms, Algorithm: counter.Fixed},
			HasLimit:   true,
			PeerBounds: map[int64]int64{ms: int64(r.Quota.MaxStreams)},
		})
	}
	return counted
}
