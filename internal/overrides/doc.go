// Package overrides keeps a node's in-memory copy of the tenant overrides
// and key owners in PostgreSQL, so that the Check path never waits for the
// database.
//
// [Cache.OverrideFor] (a limits.Overrides) reads an immutable snapshot
// through one atomic load and one or two map lookups. [Cache.Run] keeps the
// snapshot current over one connection of its own: it LISTENs, refreshes
// when notified and at least every RefreshInterval, reloads everything at
// start and every FullRefreshInterval, and reads only what changed in
// between (the queries are package overridedb's). [Cache.Prepare] re-files
// the overrides held under a new configuration's buckets. With
// Config.SnapshotFile set, what it serves is also written to a file, read
// when the first load from Postgres fails.
//
// # Invariants
//
//   - OverrideFor takes no lock, does no I/O and does not allocate; a
//     reader sees one snapshot, whose bucket ids and owner indices agree.
//   - Only a bucket's key selects an override: the tenant for a bucket
//     keyed by tenant, the key's recorded owner for one keyed by a path
//     parameter or a header, nothing for a client identity.
//   - A refresh copies only the snapshot shards a change touches; a late
//     commit is never missed.
//   - The snapshot file is replaced atomically and carries a digest and
//     counts; one that fails any check is rejected whole.
//
// # Failure mode
//
// Fail-open to the configuration: Postgres unreachable or hung, at start
// or later, never fails a check and never stops the node. Every connect
// and query is bounded; the last snapshot keeps serving, or at start the
// snapshot file, or else none (the configured limits). [Cache.Source],
// [Cache.State] and the ratelimit_authz_overrides_* metrics say which;
// the cache reconnects with backoff and jitter. A row or entry that fails
// validation is skipped, logged and counted in
// ratelimit_authz_overrides_invalid_rows; the others still apply.
//
// The design, with the schema and the audit, is in
// docs/design/overrides.md.
package overrides
