// Package authz is the Envoy ext_authz gRPC service: it implements
// envoy.service.auth.v3.Authorization/Check by turning the request into
// descriptors (package match), resolving each bucket's limit, counting
// the hit through a Limiter (package counter) and answering.
//
// Invariants:
//
//   - Every decision is an answer, never a gRPC error (Envoy would take one
//     for "authorization failed"): an allowed request gets OK with
//     RateLimit-Policy and RateLimit headers; one over a limit, a denial
//     Envoy turns into HTTP 429 with Retry-After.
//   - A request whose buckets all allow it is counted in each of them (its
//     cost: 1, the route's constant, or what a request header or its
//     content-length says, all of it or a denial); when a later bucket
//     denies, the hits taken from earlier ones are given back, so a denied
//     request costs no budget. A bucket charged after the response (failed
//     logins, a response's cost) is only peeked at: the check denies once
//     it is spent and records the request's keys for the access log. A bucket keyed by account
//     checks every account the login presents.
//   - Each bucket's limit comes from the Limits given to New (the one
//     resolver, limits.Resolver), asked with the bucket and the request's
//     key of it only; it answers from memory.
//   - CheckWire, on the request as package checkwire decoded it, decides
//     identically to Check, the reference path. Check does no I/O, takes no
//     lock beyond the counter's shard locks and starts no goroutine; a
//     Service is safe for concurrent use.
//
// Failure mode: fail open or fail closed is decided here and only here, per
// bucket, from the configuration:
//
//   - a request without the bucket's key is never counted under a shared
//     empty key: on_missing_key allows (default) or denies with 403;
//   - a new key the counter cannot track (at its key bound): on_overflow
//     allows (the default for buckets counting requests) or denies with
//     429 (the default for buckets counting failures);
//   - a login whose account cannot be read is counted under one shared key,
//     or with keys.unreadable_account: deny refused with 403;
//   - a request whose cost of a bucket cannot be read (absent without a
//     configured missing, not a number, negative, repeated, above max) is
//     refused with 400, never let through free (configfile.Cost.Request);
//   - a concurrency bucket (requests in flight, package inflight) takes a
//     lease keyed by x-request-id: a request without a usable one is
//     refused with 400, one at the limit or a full lease table denied with
//     429 and Retry-After 1; the leases a request holds are in its dynamic
//     metadata for its access-log entry to release, and given back when a
//     later bucket denies;
//   - shadow buckets count and report but never deny, nor refuse an
//     unreadable cost;
//   - a path longer than 8 KiB is denied with 414.
//
// The reasoning behind each decision is in docs/design/ext-authz-check.md.
package authz
