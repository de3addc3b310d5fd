// Package limits decides the limit of every (bucket, key) and holds the
// rules an override must follow: the configuration side of tenant
// overrides, with no database behind it.
//
// [Resolver] is the one place the order is decided: tenant override ▸ the
// bucket's configured limit ▸ the route default ▸ the built-in default of
// a shipped bucket. The Check, failure counting, RLS and RLQS all ask it,
// with the bucket (a counter.Bucket, its index in [Buckets]) and the
// request's key of it. The overrides come through the [Overrides]
// interface (the overrides cache is one; nil for a node without a
// database). [ParseWindow] is the one grammar of a window length, for the
// configuration and overrides alike; overrides narrow it to [Scales].
// [Validate], [CheckBucket], [CheckOwnerKeyName] and the Validate helpers
// are what the CLI, the store and the cache check an override or a key
// owner against.
//
// # Invariants
//
//   - Only a bucket's key can select an override: a Resolver applies one
//     only to an overridable bucket with a configured limit, asked with a
//     non-empty key, so nothing else a request carries can change the
//     limit (and reset the count) of a key other requests share.
//   - Every validation error wraps [ErrInvalid]; the windows an override
//     may use are exactly [Scales], the same list the database checks.
//   - A Resolver is immutable and safe for concurrent use; Limit does not
//     allocate.
//   - The package imports no database, NATS, gRPC or front-end package
//     (internal/deps holds it to that).
//
// # Failure mode
//
// Fail-open to the configuration: a bucket without an override answer
// gets its configured limit; a bucket with no limit at all (one only
// Envoy's context_extensions name) resolves to none, ok false, and its
// caller decides.
//
// The design of overrides as a whole (schema, audit, the cache, the
// snapshot file) is in docs/design/overrides.md.
package limits
