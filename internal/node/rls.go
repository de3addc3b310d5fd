package node

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
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
