// Package configfile loads and validates the server's rate-limit configuration:
// the buckets (budgets), the route rules that spend from them, where request
// keys come from, and the counter's bounds.
//
// Parse reports every problem it finds, each with its file, line and column,
// and returns no Rules when there is any: a node never starts on a
// configuration it only half understood. The result is immutable and safe
// for concurrent use.
package configfile

import (
	"slices"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// Rules is a validated configuration.
type Rules struct {
	Buckets  []Bucket
	Routes   []Route
	Keys     Keys
	Counter  counter.Config
	Failures Failures
	// Quota maps Envoy's rate limit quota (RLQS) bucket ids to buckets;
	// nil: the file has no quota section and RLQS is not served.
	Quota *Quota

	// matcher is the request matcher Parse compiled from the fields
	// above while it checked them (see Matcher).
	matcher *match.Engine
}

// Matcher is the request matcher of r: the one Parse compiled while it
// checked the file, or, for Rules made otherwise, one compiled now. Rules
// that Parse returned are not to be changed.
func (r *Rules) Matcher() (*match.Engine, error) {
	if r.matcher != nil {
		return r.matcher, nil
	}
	return match.New(r.Descriptors())
}

// Failures says which reported responses are failures (failed logins) that
// count in the buckets with count: failures.
type Failures struct {
	StatusCodes []uint32 // default [401]
}

// Keys says where the keys of a request come from.
type Keys struct {
	TenantHeader             string
	AccountHeader            string
	AccountBodyField         string
	TrustedHops              int
	UseExternalAddressHeader bool
	// IPv6Prefix is the prefix length IPv6 clients are keyed by in
	// ip-keyed buckets (default 64): one client usually owns a whole /64.
	IPv6Prefix int
	// UnreadableAccount is what a login whose account cannot be read
	// (partial, oversized or malformed body, field given twice, wrong
	// content type, no account at all, too many accounts) does in the
	// account-keyed buckets: it is never "no account".
	UnreadableAccount AccountPolicy
}

// AccountPolicy is what happens to a login whose account cannot be read.
type AccountPolicy uint8

const (
	// AccountShared counts it under one strict key shared by every such
	// login (match.UnreadableAccount): the default.
	AccountShared AccountPolicy = iota
	// AccountDeny refuses it (403) at the check.
	AccountDeny
)

func (a AccountPolicy) String() string {
	if a == AccountDeny {
		return "deny"
	}
	return "shared_key"
}

// Counting says what a bucket counts.
type Counting uint8

const (
	// CountRequests counts every admitted request at check time.
	CountRequests Counting = iota
	// CountFailures counts only failures reported after the fact (failed
	// logins); the check only peeks at the counter.
	CountFailures
	// CountConcurrency counts requests in flight: the check takes a lease
	// per request (package inflight), the access log releases it.
	CountConcurrency
)

// Action is what happens to a request a bucket cannot count.
type Action uint8

const (
	Allow Action = iota
	Deny
)

func (a Action) String() string {
	if a == Deny {
		return "deny"
	}
	return "allow"
}

// Bucket is one budget.
type Bucket struct {
	Name string
	// Limit is the bucket's own limit; HasLimit is false when the config
	// gives none and it comes from a route default or the built-in table
	// (see Configured).
	Limit    counter.Limit
	HasLimit bool
	Key      match.KeySpec
	// Shadow buckets count and report as usual but never deny.
	Shadow bool
	Count  Counting
	// Cost says what a hit costs: CostFailures for count: failures,
	// CostRequests (1 a request, or a route's constant) without cost.
	Cost        Cost
	Overridable bool
	// OnMissingKey applies when the request lacks the bucket's key: it is
	// never counted against a shared empty key.
	OnMissingKey Action
	// OnOverflow applies when the counter is at its key bound and cannot
	// track a new key. The default is Allow for buckets counting requests
	// and Deny for buckets counting failures: a lockout that lapses when
	// the key table is full is exactly what a guesser flooding keys wants.
	OnOverflow Action

	// Default is the route default of a bucket without a limit of its own
	// (HasDefault): every route that gives one gives the same, so the
	// bucket has one limit whatever route a request matched.
	Default    counter.Limit
	HasDefault bool

	// LeaseTTL is a concurrency bucket's lease time to live: a lease not
	// released by then expires and frees its slot.
	LeaseTTL time.Duration
}

// Configured returns the bucket's limit without a tenant override: its
// own ▸ the route default ▸ the built-in default of a shipped bucket's
// name (limits.Builtin). ok is false when none gives one.
func (b *Bucket) Configured() (counter.Limit, bool) {
	switch {
	case b.HasLimit:
		return b.Limit, true
	case b.HasDefault:
		return b.Default, true
	}
	return limits.Builtin(b.Name)
}

// Route is one route rule. A rule with several paths becomes several Routes
// with the same Name.
type Route struct {
	Name     string
	Method   string
	Path     string
	Buckets  []int
	Defaults map[int]counter.Limit // route defaults
	// Costs are the route's constant costs of a hit of its buckets that
	// count requests (1 for those it does not name); nil: none.
	Costs map[int]int64
	Line  int
}

// BucketIndex returns the index in Buckets of the named bucket,
// or -1.
func (r *Rules) BucketIndex(name string) int {
	for i := range r.Buckets {
		if r.Buckets[i].Name == name {
			return i
		}
	}
	return -1
}

// Descriptors returns the configuration of the request matcher.
func (r *Rules) Descriptors() match.Config {
	c := match.Config{
		TenantHeader:             r.Keys.TenantHeader,
		AccountHeader:            r.Keys.AccountHeader,
		AccountBodyField:         r.Keys.AccountBodyField,
		TrustedHops:              r.Keys.TrustedHops,
		UseExternalAddressHeader: r.Keys.UseExternalAddressHeader,
		IPv6Prefix:               r.Keys.IPv6Prefix,
	}
	for _, b := range r.Buckets {
		c.Buckets = append(c.Buckets, match.Bucket{Name: b.Name, Key: b.Key})
		if h := b.Cost.RequestHeader(); h != "" && !slices.Contains(c.CostHeaders, h) {
			c.CostHeaders = append(c.CostHeaders, h)
		}
	}
	for _, rt := range r.Routes {
		c.Routes = append(c.Routes, match.Route{
			Name: rt.Name, Method: rt.Method, Template: rt.Path, Buckets: rt.Buckets,
		})
	}
	return c
}
