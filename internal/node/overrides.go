package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Overrides are the tenant overrides kept in Postgres.
type Overrides struct {
	// DatabaseURL is the Postgres connection URL, a secret: it is never
	// logged. Empty: no overrides, the configured limits only.
	DatabaseURL string
	// SnapshotFile, when set, is where the node keeps its last known
	// overrides, served when it starts while Postgres cannot be reached
	// (its directory must be writable). Empty: none.
	SnapshotFile string
}

// overridesStartWait bounds how long New waits for the first load of the
// tenant overrides before it serves without Postgres: from the snapshot
// file when there is one, else on the configured limits, and says which.
const overridesStartWait = 5 * time.Second

// overridesOff is the state of a node without a database.
const overridesOff = "overrides: off (no database URL): the configured limits only"

// newOverrides wires the tenant overrides. Without a database URL it
// returns nil Overrides (config limits only) and a run function that
// does nothing. Otherwise it loads the overrides once, waiting at most
// overridesStartWait (a node that cannot reach Postgres starts anyway, on
// the snapshot file or the configured limits, and says so), and returns
// the cache and its Run, which keeps it current and closes its connection
// when ctx ends. state describes the overrides served in one line (for the
// /readyz body).
func newOverrides(ctx context.Context, cfg Overrides, snap *snapshot.Snapshot, reg prometheus.Registerer, log *slog.Logger) (over limits.Overrides, cache *overrides.Cache, run func(context.Context) error, state func() string, err error) {
	if cfg.DatabaseURL == "" {
		log.Info("tenant overrides off: no database URL (DATABASE_URL, DATABASE_URL_FILE or --database-url)")
		return nil, nil, func(context.Context) error { return nil }, func() string { return overridesOff }, nil
	}
	if cfg.SnapshotFile == "" {
		log.Warn("no --overrides-snapshot: a node started while Postgres cannot be reached serves no tenant overrides until it can")
	}
	cache, err = overrides.NewCache(overrides.Config{URL: cfg.DatabaseURL, SnapshotFile: cfg.SnapshotFile}, snap, reg, log.With("component", "overrides"))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, overridesStartWait)
	defer cancel()
	// A failure is logged by the cache (which then serves the snapshot
	// file, if any) and retried by Run.
	cache.Load(lctx)
	return cache, cache, cache.Run, cache.State, nil
}
