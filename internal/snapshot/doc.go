// Package snapshot compiles every configuration source — the rules file,
// the envoyproxy/ratelimit directory (rlsconfig), the quota section's
// participants counts — into one immutable Snapshot with one Bucket type,
// the one description of a bucket every component reads. A Resolver
// decides the limit of a (bucket, key) from it, by the bucket's index in
// Snapshot.Buckets: tenant override ▸ Bucket.Limit. It fails open to the
// configuration: no override answer, the bucket's limit; no limit at all
// (a bucket only Envoy's context_extensions name), none, and its caller
// decides. OverrideBucket, ValidateOverride and CheckOwnerKeyName are what
// the CLI, the override store and cache check a tenant override or a key
// owner against: a rules bucket, or an overridable RLS rule by its name.
//
// Invariants:
//
//   - A bucket's counter id is derived, never allocated: the hash of what
//     makes its counts comparable (name, window, algorithm, reserve; see
//     Key and ID). A reload keeps a bucket's counts exactly when its Key
//     is unchanged, and the ids to drop are those of the old snapshot the
//     new one lacks or gives another Key (Dropped). Ids never leave the
//     process: peers name buckets.
//   - Compile refuses, and returns no snapshot, what no component could
//     serve: no rules, routes that do not compile, an overridable RLS
//     rule named as a rules bucket, a name given twice, two keys with one
//     id (a collision: rename a bucket).
//   - A Snapshot is immutable and safe for concurrent use.
//
// The package is configuration: it imports no front end, driver or
// network package (internal/deps enforces it). How a node reloads with
// it is in docs/design/node.md.
package snapshot
