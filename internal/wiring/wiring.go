// Package wiring turns a validated configuration (package rules) into the
// small Configs of the packages that serve it, so that each receives only
// what it uses, never the whole rule set. Bucket ids are the same
// everywhere: a bucket's index in rules.Rules.Buckets is its
// counter.Bucket in every Config made here, as in the matcher's
// (rules.Rules.Descriptors).
//
// The conversions are pure and total: rules.Parse has already refused
// anything they could not represent.
package wiring

import (
	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/failures"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

// The one resolver serves the Check and failure counting alike.
var (
	_ authz.Limits    = (*tenantlimits.Resolver)(nil)
	_ failures.Limits = (*tenantlimits.Resolver)(nil)
)

// Limits is what limit resolution and override validation need:
// tenantlimits.NewResolver, NewCache, NewStore and the validation helpers
// take it.
func Limits(r *rules.Rules) tenantlimits.Buckets {
	bs := make(tenantlimits.Buckets, len(r.Buckets))
	for i, b := range r.Buckets {
		bs[i] = tenantlimits.Bucket{
			Name: b.Name, Key: b.Key, Overridable: b.Overridable,
			Limit: b.Limit, HasLimit: b.HasLimit,
			Default: b.Default, HasDefault: b.HasDefault,
		}
	}
	return bs
}

// Authz is what the Check service needs.
func Authz(r *rules.Rules) authz.Config {
	c := authz.Config{
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
func Failures(r *rules.Rules) failures.Config {
	c := failures.Config{
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
