// Package authz is the Envoy ext_authz gRPC service: it implements
// envoy.service.auth.v3.Authorization/Check by turning the request into
// descriptors (package descriptors), resolving each bucket's limit, counting
// the hit through a Limiter (package counter) and answering.
//
// Every decision is an answer, never a gRPC error: an allowed request gets
// status OK with RateLimit-Policy and RateLimit response headers; a request
// over a limit gets a non-OK status with a DeniedHttpResponse that Envoy
// turns into HTTP 429 with Retry-After, the RateLimit fields and a small
// JSON body. A returned error would mean "authorization failed" to Envoy
// (status_on_error), so Check returns none.
//
// Fail-open or fail-closed is decided here and only here, per bucket, from
// the configuration:
//   - a request without the bucket's key (no tenant header) is never counted
//     under a shared empty key; on_missing_key decides: allow (default) or
//     deny with 403;
//   - a new key the counter cannot track because it is at its key bound:
//     on_overflow decides: allow (the default for buckets counting
//     requests) or deny with 429 (the default for buckets counting
//     failures: a lockout must not lapse when a flood fills the table);
//   - a login whose account cannot be read (descriptors.UnreadableAccount):
//     counted under that one shared key like any account, or, with
//     keys.unreadable_account: deny, refused with 403;
//   - shadow buckets count and report as usual but never deny;
//   - a path longer than 8 KiB (before its query) is denied with 414:
//     waved through uncounted, long paths would slip past every limit.
//
// A bucket keyed by account has one descriptor per account the login
// presents: every one is checked, and the RateLimit fields report the one
// with the least remaining.
//
// A request whose buckets all allow it is counted in each of them; when a
// later bucket denies, the hits already taken from earlier buckets are
// given back, so a denied request costs no budget.
//
// Each bucket's limit comes from the Limits given to New (the one
// resolver, limits.Resolver: tenant override ▸ config ▸ route
// default ▸ built-in), asked with the bucket and the request's key of it
// only; it answers from memory. A bucket it has no limit for (one only
// Envoy's context_extensions name) is skipped and counted as unknown.
//
// The gRPC server calls CheckWire (checkwire.Server) on the request as
// package checkwire decoded it, views into the received bytes; Check, on a
// whole *authv3.CheckRequest, is the reference path and decides
// identically. Constant answers (the bare allow, the 414) are sent from
// encodings built once.
//
// Check does no I/O, takes no lock beyond the counter's shard locks and
// starts no goroutine. Service is safe for concurrent use.
package authz
