// Package rls is Envoy's rate limit service (RLS v3 ShouldRateLimit, the
// API of Envoy's ratelimit filter), answered as envoyproxy/ratelimit
// answers it for the same configuration files (package rlsconfig), counted
// in the node's counters and so replicated like every count. The gRPC
// port calls ShouldRateLimit, the lean listener (internal/checkh2)
// AppendShouldRateLimit: one decision, the same answer, metrics and counts.
//
// Invariants:
//
//   - Every descriptor of a request is looked up and counted on its own, in
//     order, and gets one status; overall_code is OVER_LIMIT iff some status
//     is (OK with Settings.ShadowMode, statuses left as they are).
//   - n hits are admitted at once iff all n fit, else none is counted: a
//     denied hit is never counted (upstream counts it), so a key stays at
//     its limit and a limit of 0 is OVER_LIMIT from the first check.
//   - A charged rule counts its hits whether or not they fit; a
//     concurrency rule acquires a lease (Options.Leases) per request id,
//     and its is_negative_hits frees only that lease; any other
//     is_negative_hits counts nothing (OK).
//   - A descriptor-supplied limit replaces the rule in a configured domain;
//     an overridable rule takes its limit from Overrides, keyed by the
//     value of the descriptor's first entry (the tenant).
//   - With Settings.ResponseHeaders the reply carries the limit, remaining
//     and reset of one descriptor: the last one over the limit, else the
//     limited one with the least remaining (the first of equals).
//   - A Service is safe for concurrent use; a reload swaps the whole
//     configuration at once, and a call in flight finishes on the one it
//     started with. ShouldRateLimit does no I/O and takes no lock beyond the
//     counter's and the lease table's shard locks.
//
// Failure mode: only a malformed request is a gRPC error, InvalidArgument
// (Envoy's failure_mode_deny then decides): an empty domain or descriptor
// list, or more descriptors, entries, or longer keys or values than Options
// allow. Every decision is a response. A new key the counter cannot track
// (at its key bound) is allowed uncounted (OK, limit_remaining 0) unless
// Settings.DenyOverflow makes it OVER_LIMIT: this is the one place that
// choice is made.
//
// The semantics status by status (charges, leases and refills among
// them), and what differs from upstream and why: docs/design/rls.md.
package rls
