// Package authz is the Envoy ext_authz gRPC service: it implements
// envoy.service.auth.v3.Authorization/Check by turning the request into
// descriptors (package match), resolving each bucket's limit, counting
// the hit through a Limiter (package counter) and answering.
//
// Invariants:
//
//   - Every decision is an answer, never a gRPC error: an allowed request
//     gets OK with RateLimit-Policy and RateLimit headers; one over a limit,
//     a denial Envoy turns into HTTP 429 with Retry-After.
//   - A request whose buckets all allow it is counted in each of them (its
//     cost: 1, the route's constant, a request header or its
//     content-length, all of it or a denial); when a later bucket denies,
//     what earlier ones took is given back (hits and leases), so a denied
//     request costs no budget. A bucket charged after the response (failed
//     logins, a response's cost) is only peeked at, and the request's keys
//     are recorded for the access log (package accesslog).
//   - Limits come from the one resolver, asked with the bucket and the key
//     only; it answers from memory.
//   - CheckWire, on the request as package checkwire decoded it, decides
//     identically to Check, the reference path. Check does no I/O, takes no
//     lock beyond the counter's and the lease table's shard locks and starts
//     no goroutine; a Service is safe for concurrent use.
//
// Failure mode: fail open or closed is decided here and only here, per
// bucket, from the configuration: a missing key (on_missing_key), a new key
// at the counter's bound (on_overflow), an unreadable login account
// (keys.unreadable_account); an unreadable cost or a missing x-request-id
// for a concurrency bucket is refused with 400, never let through free; a
// concurrency bucket at its limit or with a full lease table denies with
// 429 and Retry-After 1; shadow buckets count and report but never deny;
// a path longer than 8 KiB is denied with 414.
//
// The reasoning behind each decision is in docs/design/ext-authz-check.md.
package authz
