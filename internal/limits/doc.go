// Package limits holds the rules a limit and an override must follow: the
// configuration side of tenant overrides, with no database behind it.
//
// [Builtin] is the last step of a bucket's configured limit (own ▸ route
// default ▸ built-in, configfile.Bucket.Configured); snapshot.Resolver
// puts a tenant override, through the [Overrides] interface (the
// overrides cache is one), in front of it. [ParseWindow] is the one
// grammar of a window length, for the configuration and overrides alike;
// overrides narrow it to [Scales]. [Override.Validate], [ParseRate],
// [ValidateTenant], [ValidateKeyName] and [ValidateKeyValue] check an
// override's or a key owner's values; which bucket an override may name
// is the configuration's (snapshot.Snapshot.OverrideBucket), and
// [OwnerKeyName] is the name a bucket's key owners are filed under.
//
// # Invariants
//
//   - Every validation error wraps [ErrInvalid]; the windows an override
//     may use are exactly [Scales], the same list the database checks.
//   - The package imports no database, NATS, gRPC or front-end package
//     (internal/deps holds it to that).
//
// The design of overrides as a whole (schema, audit, the cache, the
// snapshot file) is in docs/design/overrides.md.
package limits
