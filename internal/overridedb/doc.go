// Package overridedb is the PostgreSQL side of tenant overrides: the
// schema and its migrations, the queries behind `ratelimit-authz limits …`
// ([Store]: overrides, key owners, their audit logs) and the queries a
// node's overrides cache runs ([Listen], [Read]). Every SQL string of the
// product lives here.
//
// The schema is the product's own, embedded as versioned SQL
// (migrations/) and applied by [Migrate]. tenant_limits holds one row per
// tenant with its overrides as JSON ({"bucket": {"limit": N, "scale_ms":
// MS}}, read by [ParseLimits] and, allocation-free for the common shape,
// [FastEntries]); tenant_key_owners records which tenant owns a key such as
// a channel. Triggers write the audit rows, remember deletions for a day
// and send NOTIFY on [Channel].
//
// # Invariants
//
//   - The database checks refuse what validation refuses (shape, limit
//     bounds, windows, tenant and key text), so a direct SQL edit is held
//     to the CLI's rules; which buckets are overridable is configuration,
//     which SQL cannot see, and [Store] checks it against the compiled
//     snapshot (snapshot.Snapshot.ValidateOverride).
//   - A Store change is validated first (an invalid one writes nothing,
//     its error wraps limits.ErrInvalid) and runs in one transaction with
//     its audit row; the audit row names the claimed actor and the
//     database's own users, which no session can forge.
//   - [Migrate] is idempotent, one transaction, serialised by an advisory
//     lock; a database newer than the binary is left alone.
//   - [Read] reads one repeatable-read snapshot and returns the watermark
//     from which the next incremental Read misses no late commit.
//
// # Failure mode
//
// Every function returns its error, wrapped with what it was doing; a
// missing table wraps [ErrNoSchema] (run `ratelimit-authz migrate`). A
// Store wraps one connection and is not safe for concurrent use. Bounding
// time is the caller's: every function takes a context.
//
// The design of overrides as a whole is in docs/design/overrides.md.
package overridedb
