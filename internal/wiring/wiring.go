// Package wiring turns a validated configuration (package rules) into the
// small Configs of the packages that serve it, so that each receives only
// what it uses, never the whole rule set. Indices are the same everywhere:
// a bucket's index in rules.Rules.Buckets is its index in every Config
// made here, as in the matcher's (rules.Rules.Descriptors). Its id in the
// counter is ids[index], given by the node's IDs allocator so that it
// survives reloads; nil ids: the index itself (a single configuration, or
// the CLI, which never counts).
//
// The conversions are pure and total: rules.Parse has already refused
// anything they could not represent.
package wiring

import (
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/descriptors"
	"github.com/ratelimit-authz/ratelimit-authz/internal/failures"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rules"
)

// The one resolver serves the Check and failure counting alike.
var (
	_ authz.Limits    = (*limits.Resolver)(nil)
	_ failures.Limits = (*limits.Resolver)(nil)
)

// Limits is what limit resolution and override validation need:
// limits.NewResolver, overrides.NewCache, overridedb.NewStore and the
// validation helpers take it.
func Limits(r *rules.Rules, ids []counter.Bucket) limits.Buckets {
	bs := make(limits.Buckets, len(r.Buckets))
	for i, b := range r.Buckets {
		bs[i] = limits.Bucket{
			Name: b.Name, Key: b.Key, Overridable: b.Overridable,
			Limit: b.Limit, HasLimit: b.HasLimit,
			Default: b.Default, HasDefault: b.HasDefault,
		}
		if ids != nil {
			bs[i].ID, bs[i].IDSet = ids[i], true
		}
	}
	return bs
}

// Authz is what the Check service needs.
func Authz(r *rules.Rules, ids []counter.Bucket) authz.Config {
	c := authz.Config{
		IDs:                   ids,
		Buckets:               make([]authz.Bucket, len(r.Buckets)),
		Routes:                make([]string, len(r.Routes)),
		DenyUnreadableAccount: r.Keys.UnreadableAccount == rules.AccountDeny,
	}
	for i, b := range r.Buckets {
		c.Buckets[i] = authz.Bucket{
			Name: b.Name, Key: b.Key.Kind, Shadow: b.Shadow,
			CountFailures:  b.Count == rules.CountFailures,
			DenyMissingKey: b.OnMissingKey == rules.Deny,
			DenyOverflow:   b.OnOverflow == rules.Deny,
		}
	}
	for i, rt := range r.Routes {
		c.Routes[i] = rt.Name
		if rt.Name == "" {
			c.Routes[i] = rt.Path
		}
	}
	return c
}

// Failures is what failure counting needs.
func Failures(r *rules.Rules, ids []counter.Bucket) failures.Config {
	c := failures.Config{
		IDs:         ids,
		Buckets:     make([]failures.Bucket, len(r.Buckets)),
		Routes:      make([]failures.Route, len(r.Routes)),
		StatusCodes: r.Failures.StatusCodes,
		IPv6Prefix:  r.Keys.IPv6Prefix,
	}
	for i, b := range r.Buckets {
		c.Buckets[i] = failures.Bucket{Name: b.Name, Key: b.Key.Kind, CountFailures: b.Count == rules.CountFailures}
	}
	for i, rt := range r.Routes {
		c.Routes[i] = failures.Route{Name: rt.Name, Path: rt.Path, Buckets: rt.Buckets}
	}
	return c
}

// Keys are the identities of r's buckets for the IDs allocator, by index:
// name, the window and algorithm of the limit the bucket counts under
// without an override (none: zero) and whether it is reserved.
func Keys(r *rules.Rules) []BucketKey {
	resolver := limits.NewResolver(Limits(r, nil), nil)
	reserved := make(map[counter.Bucket]bool, len(r.Counter.Reserved))
	for _, b := range r.Counter.Reserved {
		reserved[b] = true
	}
	ks := make([]BucketKey, len(r.Buckets))
	for i, b := range r.Buckets {
		ks[i] = BucketKey{Name: b.Name, Reserved: reserved[counter.Bucket(i)]}
		if l, ok := resolver.Configured(counter.Bucket(i)); ok {
			ks[i].ScaleMS, ks[i].Algorithm = l.ScaleMS, l.Algorithm
		}
	}
	return ks
}

// Reserved translates the reserved buckets of r (by index) into ids.
func Reserved(r *rules.Rules, ids []counter.Bucket) []counter.Bucket {
	out := make([]counter.Bucket, 0, len(r.Counter.Reserved))
	for _, b := range r.Counter.Reserved {
		out = append(out, ids[b])
	}
	return out
}

// RLSKeys are the identities of an RLS configuration's buckets for the
// IDs allocator: its rules, by rule index (the window of a rule without a
// limit, unlimited or 0 per unit, still names its unit), then its buckets
// of descriptor-supplied limits, by LimitBuckets index (fixed windows).
// Their names never collide with ext_authz bucket names, so one plan
// holds both.
func RLSKeys(c *rlsconfig.Config) []BucketKey {
	rs, lbs := c.Rules(), c.LimitBuckets()
	ks := make([]BucketKey, 0, len(rs)+len(lbs))
	for i := range rs {
		k := BucketKey{Name: rs[i].Bucket, Algorithm: rs[i].Algorithm}
		if !rs[i].Unlimited {
			k.ScaleMS = rs[i].Unit.Seconds() * 1000
		}
		ks = append(ks, k)
	}
	for _, lb := range lbs {
		ks = append(ks, BucketKey{Name: lb.Bucket, ScaleMS: lb.Unit.Seconds() * 1000, Algorithm: counter.Fixed})
	}
	return ks
}

// RLSOverridable are the overridable RLS rules as tenant-override buckets
// (keyed by tenant: the descriptor's first value), by the rule ids given,
// for the one override cache both formats share: an override of a rule
// is filed under the rule's name and found by its id.
func RLSOverridable(c *rlsconfig.Config, ruleIDs []counter.Bucket) limits.Buckets {
	var bs limits.Buckets
	for i, r := range c.Rules() {
		if !r.Overridable {
			continue
		}
		l, ok := r.Limit()
		bs = append(bs, limits.Bucket{
			Name: r.Name, ID: ruleIDs[i], IDSet: true, Overridable: true,
			Key:   descriptors.KeySpec{Kind: descriptors.KeyTenant},
			Limit: l, HasLimit: ok,
		})
	}
	return bs
}
