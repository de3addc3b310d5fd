package node

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/failures"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlqs"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rules"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
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

// loadRLS reads the RLS configuration, at start and at every reload; nil
// c: no RLS, a nil Config.
func loadRLS(c *RLS, log *slog.Logger) (*rlsconfig.Config, error) {
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
	log.Info("RLS configuration loaded", "dir", c.Layout.ConfigDir(), "domains", len(cfg.Domains()), "rules", len(cfg.Rules()))
	return cfg, nil
}

// checkRLSNames refuses an overridable rule named as an ext_authz bucket:
// a tenant override names one bucket.
func checkRLSNames(c *rlsconfig.Config, r *rules.Rules) error {
	for _, rule := range c.Rules() {
		for _, b := range r.Buckets {
			if rule.Overridable && rule.Name == b.Name {
				return fmt.Errorf("%s:%d:%d: overridable rule %q has the name of an ext_authz bucket: tenant overrides could not tell them apart", rule.File, rule.Line, rule.Column, rule.Name)
			}
		}
	}
	return nil
}

// services are what the listeners serve; a nil rlsSvc (no RLS) or
// rlqsSvc (no quota section) leaves its field unset, not a nil pointer in
// the interface.
func services(authz *authz.Service, rlsSvc *rls.Service, rlqsSvc *rlqs.Service, rec *failures.Recorder) server.Services {
	svc := server.Services{Authz: authz, AccessLog: rec, Failures: rec}
	if rlsSvc != nil {
		svc.RateLimit = rlsSvc
	}
	if rlqsSvc != nil {
		svc.RateLimitQuota = rlqsSvc
	}
	return svc
}
