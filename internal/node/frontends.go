package node

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlqs"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// preparer is a component that serves from a snapshot: Prepare validates
// one and returns the swap that makes it serve it, changing nothing
// itself, so that a reload swaps only once every component has accepted
// the snapshot.
type preparer interface {
	Prepare(*snapshot.Snapshot) (swap func(), err error)
}

// part is a component a reload swaps: what it is called in a refused
// reload's error and how it takes a snapshot.
type part struct {
	name string
	svc  preparer
}

// frontEnd is one protocol the node serves: a part, what it adds to the
// listeners and what runs beside them.
type frontEnd struct {
	part
	serve func(*server.Services)
	run   func(context.Context) error // nil: nothing
}

// core is what every front end is built on: the first snapshot, the
// counter, the tenant overrides (nil: none), the replicator (nil: the
// local backend), the node's configuration, metrics and log.
type core struct {
	snap  *snapshot.Snapshot
	store *counter.Store
	over  limits.Overrides
	repl  *replicate.Replicator
	// leases are the concurrency buckets' leases.
	leases *inflight.Sync
	cfg    *Config
	reg    prometheus.Registerer
	log    *slog.Logger
}

// frontEnds are the protocols a node may serve, each built from the
// core; a constructor returns nil when the configuration does not ask for
// its protocol. Adding a front end is a line here.
func frontEnds() []func(*core) (*frontEnd, error) {
	return []func(*core) (*frontEnd, error){newCheck, newFailures, newRLQS, newRLS}
}

// newCheck serves ext_authz Check.
func newCheck(c *core) (*frontEnd, error) {
	svc, err := authz.New(authz.ConfigFrom(c.snap), c.snap.Matcher, c.store, snapshot.NewResolver(c.snap, c.over), c.reg, c.log, authz.Options{Overrides: c.over, Leases: c.leases.Table()})
	if err != nil {
		return nil, err
	}
	return &frontEnd{part: part{"check", svc}, serve: func(s *server.Services) { s.Authz = svc }}, nil
}

// newFailures counts failed logins from Envoy's access log and POST
// /v1/failures.
func newFailures(c *core) (*frontEnd, error) {
	rec, err := accesslog.New(accesslog.ConfigFrom(c.snap), c.store, snapshot.NewResolver(c.snap, c.over), c.reg, c.log,
		accesslog.Options{Token: c.cfg.FailuresToken, Overrides: c.over, Leases: c.leases})
	if err != nil {
		return nil, err
	}
	return &frontEnd{part: part{"failure counting", rec}, serve: func(s *server.Services) { s.AccessLog, s.Failures = rec, rec }}, nil
}

// newRLQS serves StreamRateLimitQuotas when the rules file has a quota
// section: on a cluster node with the live nodes as the replicator counts
// them, and two replication intervals for the participants that join at
// once on several nodes to be known.
func newRLQS(c *core) (*frontEnd, error) {
	if c.snap.Rules.Quota == nil {
		return nil, nil
	}
	opts := rlqs.Options{Overrides: c.over}
	if c.cfg.Cluster != nil && c.repl != nil {
		opts.Nodes, opts.Settle = c.repl.Nodes, 2*c.cfg.Cluster.SyncInterval
	}
	svc, err := rlqs.New(rlqs.ConfigFrom(c.snap, snapshot.NewResolver(c.snap, c.over)), c.store, c.reg, c.log, opts)
	if err != nil {
		return nil, err
	}
	// The server ends its streams after the drain delay.
	return &frontEnd{part: part{"RLQS", svc}, serve: func(s *server.Services) { s.RateLimitQuota = svc }, run: svc.Run}, nil
}

// newRLS serves Envoy's ratelimit filter (ShouldRateLimit) when the node
// has an RLS configuration (Config.RLS).
func newRLS(c *core) (*frontEnd, error) {
	if c.cfg.RLS == nil {
		return nil, nil
	}
	if c.snap.RLS == nil {
		return nil, errors.New("ShouldRateLimit: no RLS rules")
	}
	svc, err := rls.New(rls.Config{Snapshot: c.snap, Settings: c.cfg.RLS.Settings}, c.store, c.over, c.reg, c.log, rls.Options{Leases: c.leases})
	if err != nil {
		return nil, err
	}
	return &frontEnd{part: part{"ShouldRateLimit", svc}, serve: func(s *server.Services) { s.RateLimit = svc }}, nil
}
