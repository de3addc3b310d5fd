// Package tenantlimits resolves the limit of every (bucket, key), keeps
// per-tenant limit overrides in PostgreSQL and serves them to the Check
// path from memory.
//
// # Resolution
//
// [Resolver] is the one place the order is decided: tenant override ▸ the
// bucket's configured limit ▸ the route default ▸ the built-in default of
// a shipped bucket. The Check and failure counting both ask it, with the
// bucket (a counter.Bucket, its index in [Buckets]) and the request's key
// of it, so a failure counts under the limit the Check peeks at. A node
// without a database resolves with no overrides. [ParseWindow] is the one
// grammar of a window length, for the configuration and overrides alike;
// overrides narrow it to [Scales].
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
// skips and counts them.
//
// # Whose override applies
//
// Only a bucket's key decides ([Cache.OverrideFor]): a bucket keyed by
// tenant takes its key's overrides; a bucket keyed by a path parameter or a
// header (a channel) takes the overrides of the tenant recorded as the
// key's owner in tenant_key_owners ([OwnerKeyName]: "channel" for
// path:channel, "header:NAME"); a key without an owner, and any bucket keyed
// by a client identity (ip, account), gets the configured limit. Nothing
// else a request carries, such as its tenant header, can change the limit
// (and so the window, and so reset the count) of a key other requests
// share.
//
// # Audit
//
// Every change, through the CLI or plain SQL, writes a row to
// tenant_limits_audit or tenant_key_owners_audit in the same transaction (a
// trigger). A row holds the claimed actor (the CLI's --actor, travelling in
// the transaction setting ratelimit_authz.actor, else "sql:" and the
// database user) and the database's own session_user and current_user,
// stamped by a trigger on the audit table so that no session can claim
// another. Trigger functions run with search_path pinned to pg_catalog,
// the schema, then pg_temp, so a temporary table cannot capture their
// writes. Statement triggers send NOTIFY ratelimit_authz_tenant_limits.
//
// # Cache
//
// [Cache] is a node's copy of both tables. [Cache.OverrideFor], called on
// the Check path, reads an immutable snapshot through one atomic load and
// one or two map lookups: no lock, no I/O, no allocation. [Cache.Run] keeps
// the snapshot current over one connection of its own: it LISTENs, refreshes
// when notified (a change reaches every node within milliseconds) and at
// least every RefreshInterval (30 s), and reloads everything at start and
// every FullRefreshInterval (1 h). Refreshes in between, reconnections
// included, are incremental: each row carries the transaction id of its
// last change, and a refresh reads the rows and deletions of transactions
// not yet finished at the previous refresh's snapshot (pg_snapshot_xmin), so
// a late commit is never missed and a million quiet tenants cost nothing.
// Only the shards of the snapshot a change touches are copied.
//
// With Config.SnapshotFile set, the cache writes what it serves to that
// file after every refresh that changed something (temporary file, fsync,
// rename, fsync of the directory), and reads it when its first load from
// Postgres fails. The file carries a SHA-256 of its content and its counts;
// a file that fails any check is rejected whole.
//
// # Failure mode
//
// Fail-open to the configuration, decided here: a key without a usable
// override gets the configured limit. Postgres unreachable or hung, at
// start or later, never fails a check and never stops the node: every
// connect and query is bounded (QueryTimeout on the client, and the
// server's statement_timeout); the last snapshot keeps serving, or at start
// the snapshot file, or else none (the configured limits); [Cache.Source]
// and the ratelimit_authz_overrides_source gauge say which, [Cache.State]
// says it in one line, ratelimit_authz_overrides_degraded is 1, the log
// says so, and the cache reconnects with exponential backoff and jitter. A
// row or entry that fails validation (possible only when the database
// checks were bypassed, for a bucket this node's configuration does not let
// tenants override, or for an owner key name none of its buckets uses) is
// skipped, logged and counted in ratelimit_authz_overrides_invalid_rows;
// the row's other entries and all other rows still apply.
package tenantlimits
