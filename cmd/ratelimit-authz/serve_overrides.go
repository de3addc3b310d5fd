package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

// overridesStartWait bounds how long serve waits for the first load of
// the tenant overrides before it serves without them (degraded).
const overridesStartWait = 5 * time.Second

// newOverrides wires the tenant overrides for serve. Without a database URL
// it returns a nil Overrides (config limits only) and a run function that
// does nothing. Otherwise it loads the overrides once, waiting at most
// overridesStartWait (a node that cannot reach Postgres starts anyway, on
// the configured limits, and says so), and returns the cache and its Run,
// which keeps it current and closes its connection when ctx ends.
func newOverrides(ctx context.Context, databaseURL string, r *rules.Rules, reg prometheus.Registerer, log *slog.Logger) (authz.Overrides, func(context.Context) error, error) {
	if databaseURL == "" {
		log.Info("tenant overrides off: no --database-url")
		return nil, func(context.Context) error { return nil }, nil
	}
	cache, err := tenantlimits.NewCache(tenantlimits.Config{URL: databaseURL}, r, reg, log.With("component", "overrides"))
	if err != nil {
		return nil, nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, overridesStartWait)
	defer cancel()
	// A failure is logged by the cache and retried by Run.
	cache.Load(lctx)
	return cache, cache.Run, nil
}
