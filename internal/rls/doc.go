// Package rls is Envoy's rate limit service, RLS v3:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, the API of
// Envoy's ratelimit filter, answered the way envoyproxy/ratelimit answers it
// for the same configuration files (package rlsconfig reads them), counted
// in the node's in-memory counters (package counter) and so replicated
// like every other count.
//
// # Semantics
//
// Every descriptor of a request is looked up and counted on its own, in
// order, and gets one status:
//
//   - unknown domain, no matching rule, a rule another matched rule
//     replaces, or a descriptor without entries: {code: OK};
//   - an unlimited rule: OK, limit_remaining 4294967295, nothing counted;
//   - requests_per_unit 0 (or a descriptor-supplied limit of 0):
//     OVER_LIMIT for every addend, 0 included, nothing counted;
//   - otherwise the descriptor's hits (its own hits_addend when set, 0
//     included; else the request's, at least 1) are counted against the
//     rule's limit: OK with the limit, limit_remaining and
//     duration_until_reset, or OVER_LIMIT with limit_remaining 0. An
//     addend of 0 counts nothing and is over iff one more hit would be
//     refused (upstream: iff the count exceeds the limit; it counts denied
//     hits, so its key is past the limit once a hit was denied, where a
//     key here stays at it). A rule in shadow_mode answers OK where it would be over.
//
// A descriptor-supplied limit (descriptor.limit) replaces the configured
// rule whenever the request's domain is configured, as upstream: it counts
// in one bucket per (domain, unit) keyed by every entry's key and value,
// with a fixed window. Its unit must be one the counter holds (SECOND to
// MONTH, and WEEK); UNKNOWN, another value and YEAR are ignored and the
// descriptor is matched against the configuration instead.
//
// Overridable rules (the extension rate_limit.overridable) take their
// limit from Limits, asked with the rule's bucket and the value of the
// descriptor's first entry, the tenant: a tenant override from Postgres
// applies there and current_limit reports it.
//
// overall_code is OVER_LIMIT iff some status is; with Settings.ShadowMode
// (upstream's SHADOW_MODE) it is OK and the statuses are left as they are.
// With Settings.ResponseHeaders (LIMIT_RESPONSE_HEADERS_ENABLED) the reply
// carries three headers for one descriptor: the last one over the limit,
// else the limited one with the least remaining (the first of equals).
//
// # What differs from envoyproxy/ratelimit
//
// A hit that does not fit is not counted here (upstream INCRBYs it, unless
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): n hits are admitted at once iff
// all n fit, else none is counted. limit_remaining and later decisions
// differ from upstream's only where upstream's counting of a denied addend
// would lock the key for the rest of its window — with addends above 1, a
// batch that did not fit leaves room here for a smaller one. With a
// sliding window (rate_limit.algorithm: sliding, an extension),
// duration_until_reset of an OVER_LIMIT status is when one hit would be
// admitted again (what a Retry-After would say) and of an OK status the
// end of the current window. Counts are in whole windows of the counter
// (duration_until_reset rounded up to whole seconds, at least 1, as
// upstream's 1..unit range). Since denied hits are not counted, a check
// without counting (an addend of 0) is over when one more hit would be
// refused: a key exactly at its limit is OVER_LIMIT here and OK upstream,
// so a limit of 0 (a block list) is OVER_LIMIT from the first check.
// Descriptor is_negative_hits (a refill) is ignored, as upstream: a client
// must not give budget back.
//
// # Errors and failure mode
//
// Only a malformed request is a gRPC error, InvalidArgument, which Envoy
// handles as a failed call (its failure_mode_deny decides): an empty
// domain or descriptor list (upstream's texts), more descriptors, more
// entries in one, or longer entry keys or values than Options allow.
// Every decision is a response. A new key the counter cannot track,
// because it is at its key bound, is allowed uncounted (OK, limit_remaining
// 0) unless Settings.DenyOverflow, when it is OVER_LIMIT: this is the one
// place that choice is made.
//
// # Concurrency and cost
//
// A Service is safe for concurrent use. Update swaps the whole
// configuration at once: a call in flight finishes on the configuration it
// started with. ShouldRateLimit does no I/O, starts no goroutine, takes no
// lock beyond the counter's shard locks and allocates the response and
// little else.
package rls
