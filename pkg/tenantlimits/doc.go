// Package tenantlimits keeps per-tenant limit overrides in PostgreSQL and
// serves them to the Check path from memory.
//
// # Data
//
// The schema is the product's own, embedded here as versioned SQL and
// applied by [Migrate] (`ratelimit-authz migrate`): idempotent, one
// transaction, serialised by an advisory lock. The table tenant_limits holds
// one row per tenant with its overrides as JSON:
//
//	{"activity_create": {"limit": 200, "scale_ms": 1000}}
//
// Database checks refuse a bad shape, a limit outside 1…2147483647 and a
// window other than 1 s, 1 min, 1 h or 1 day, with a message that says
// which, so a direct SQL edit is held to the same rules as the CLI. Which
// buckets may be overridden is the server's configuration (`overridable:
// true`), which SQL cannot see: [Store] refuses other buckets, and a node
// skips and counts them. Every change, through the CLI or plain SQL, writes
// a row to tenant_limits_audit in the same transaction (a trigger; the
// CLI's actor travels in the transaction setting ratelimit_authz.actor),
// and a statement trigger sends NOTIFY ratelimit_authz_tenant_limits.
//
// # Cache
//
// [Cache] is a node's copy of the table. [Cache.Override], called on the
// Check path, reads an immutable snapshot through one atomic load and a map
// lookup: no lock, no I/O, no allocation. [Cache.Run] keeps the snapshot
// current over one connection of its own: it LISTENs, refreshes when
// notified (a change reaches every node within milliseconds) and at least
// every RefreshInterval (30 s), and reloads everything at start and every
// FullRefreshInterval (1 h). Refreshes in between, reconnections included, are
// incremental: each row carries the transaction id of its last change, and
// a refresh reads the rows and deletions of transactions not yet finished
// at the previous refresh's snapshot (pg_snapshot_xmin), so a late commit is
// never missed and a million quiet tenants cost nothing. Only the shards of
// the snapshot a change touches are copied.
//
// # Failure mode
//
// Fail-open to the configuration, decided here: a tenant without a usable
// override gets the configured limit. Postgres unreachable at start or
// later never fails a check and never stops the node: the last snapshot
// (or, before the first load, none, so the configured limits) keeps
// serving, ratelimit_authz_overrides_degraded is 1, the log says so, and
// the cache reconnects with exponential backoff and jitter. A row or entry
// that fails validation (possible only when the database checks were
// bypassed, or for a bucket this node's configuration does not let tenants
// override) is skipped, logged and counted in
// ratelimit_authz_overrides_invalid_rows; the row's other entries and all
// other rows still apply.
package tenantlimits
