package node

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/descriptors"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/failures"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rls"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/server"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

// RLS serves Envoy's ratelimit filter (RLS v3 ShouldRateLimit) on the
// gRPC port, from envoyproxy/ratelimit configuration files.
type RLS struct {
	// Layout is where the files are (upstream's RUNTIME_* settings).
	Layout rlsconfig.Layout
	// Options are how they are read (MERGE_DOMAIN_CONFIG, the default
	// algorithm).
	Options rlsconfig.Options
	// Settings are the service's global switches (SHADOW_MODE, the
	// response headers, on overflow).
	Settings rls.Settings
}

// rlsNode is the RLS configuration of a node and the counter buckets of
// its rules: rule i is bucket first+i, limit bucket j first+rules+j, after
// every ext_authz bucket. A nil rlsNode (no RLS) has no buckets.
type rlsNode struct {
	cfg      *rlsconfig.Config
	first    counter.Bucket
	settings rls.Settings
}

// newRLS loads the RLS configuration; nil c: no RLS, a nil rlsNode. An
// overridable rule must not share its name with an ext_authz bucket: a
// tenant override names one bucket.
func newRLS(c *RLS, r *rules.Rules, log *slog.Logger) (*rlsNode, error) {
	if c == nil {
		return nil, nil
	}
	cfg, err := rlsconfig.Load(c.Layout, c.Options)
	switch {
	case errors.Is(err, rlsconfig.ErrNoSubdirectory) && cfg != nil:
		// upstream's nil loader: no files, every domain unknown
		log.Warn("no RLS configuration: every ShouldRateLimit domain is unknown", "err", err)
	case err != nil:
		return nil, fmt.Errorf("load the RLS configuration in %s: %w", c.Layout.ConfigDir(), err)
	}
	for _, rule := range cfg.Rules() {
		for _, b := range r.Buckets {
			if rule.Overridable && rule.Name == b.Name {
				return nil, fmt.Errorf("%s:%d:%d: overridable rule %q has the name of an ext_authz bucket: tenant overrides could not tell them apart", rule.File, rule.Line, rule.Column, rule.Name)
			}
		}
	}
	log.Info("RLS configuration loaded", "dir", c.Layout.ConfigDir(), "domains", len(cfg.Domains()), "rules", len(cfg.Rules()))
	return &rlsNode{cfg: cfg, first: counter.Bucket(len(r.Buckets)), settings: c.Settings}, nil
}

// config is the service's Config.
func (n *rlsNode) config() rls.Config {
	c := rls.Config{Rules: n.cfg, Settings: n.settings}
	id := n.first
	for range n.cfg.Rules() {
		c.RuleIDs = append(c.RuleIDs, id)
		id++
	}
	for range n.cfg.LimitBuckets() {
		c.LimitIDs = append(c.LimitIDs, id)
		id++
	}
	return c
}

// service is the ShouldRateLimit service; nil without RLS.
func (n *rlsNode) service(store *counter.Store, limits rls.Limits, reg prometheus.Registerer, log *slog.Logger) (*rls.Service, error) {
	if n == nil {
		return nil, nil
	}
	return rls.New(n.config(), store, limits, reg, log, rls.Options{})
}

// buckets are the RLS buckets as limit resolution sees them, by id after
// the ext_authz buckets: an overridable rule under its name, keyed by
// tenant (the descriptor's first value), the others under their bucket
// names without overrides.
func (n *rlsNode) buckets() tenantlimits.Buckets {
	if n == nil {
		return nil
	}
	var bs tenantlimits.Buckets
	for _, r := range n.cfg.Rules() {
		l, ok := r.Limit()
		b := tenantlimits.Bucket{Name: r.Bucket, Limit: l, HasLimit: ok}
		if r.Overridable {
			b.Name, b.Overridable, b.Key = r.Name, true, descriptors.KeySpec{Kind: descriptors.KeyTenant}
		}
		bs = append(bs, b)
	}
	for _, lb := range n.cfg.LimitBuckets() {
		bs = append(bs, tenantlimits.Bucket{Name: lb.Bucket})
	}
	return bs
}

// names are the replication names of the RLS buckets, by id after the
// ext_authz buckets.
func (n *rlsNode) names() []string {
	if n == nil {
		return nil
	}
	var names []string
	for _, r := range n.cfg.Rules() {
		names = append(names, r.Bucket)
	}
	for _, lb := range n.cfg.LimitBuckets() {
		names = append(names, lb.Bucket)
	}
	return names
}

// bounds is what a peer may report of the RLS buckets (see peerBounds):
// a rule's window with its limit × replicate.PeerCountFactor, and every
// tenant override window of an overridable one; a bucket of
// descriptor-supplied limits its unit's window with any count a
// requests_per_unit allows. Unlimited rules and limits of 0 count
// nothing: no peer count of theirs is merged.
func (n *rlsNode) bounds() replicate.BucketWindows {
	if n == nil {
		return nil
	}
	var w replicate.BucketWindows
	for _, r := range n.cfg.Rules() {
		m := map[int64]int64{}
		if l, ok := r.Limit(); ok {
			m[l.ScaleMS] = replicate.BoundFor(min(l.Limit, counter.MaxLimit))
			if r.Overridable {
				for _, sc := range tenantlimits.Scales {
					m[sc.MS] = replicate.BoundFor(counter.MaxLimit)
				}
			}
		}
		w = append(w, m)
	}
	for _, lb := range n.cfg.LimitBuckets() {
		m := map[int64]int64{}
		if ms := lb.Unit.Seconds() * 1000; ms <= counter.MaxScaleMS {
			m[ms] = replicate.BoundFor(counter.MaxLimit)
		}
		w = append(w, m)
	}
	return w
}

// services are what the listeners serve; a nil rlsSvc (no RLS) leaves
// RateLimit unset, not a nil *rls.Service in the interface.
func services(authz *authz.Service, rlsSvc *rls.Service, rec *failures.Recorder) server.Services {
	svc := server.Services{Authz: authz, AccessLog: rec, Failures: rec}
	if rlsSvc != nil {
		svc.RateLimit = rlsSvc
	}
	return svc
}
