// Package rlqs serves Envoy's rate limit quota service (RLQS,
// envoy.service.rate_limit_quota.v3 StreamRateLimitQuotas): the server of
// the rate_limit_quota HTTP filter, which enforces locally what the server
// assigns to each bucket id and streams its usage back every reporting
// interval, instead of one call per request.
//
// Each stream is a participant of every bucket id it reports. A bucket id
// maps to a bucket of the rules file and a counter key ([Mapping]); the
// usage a report carries is counted into that (bucket, key) with
// Counter.Incr, so it replicates like any hit, each request at its
// mapping entry's Cost in the bucket's unit, and each participant is
// assigned its share of what remains of the window's budget
// (share.Participant) as a token bucket of the requests it pays for
// (share / Cost): DENY_ALL when that is none, ALLOW_ALL for a bucket
// without limit or in shadow mode.
//
// Invariants: within a window, the shares this node hands out at one
// instant add up to at most what remains, and within the window a share
// only shrinks (but for the cases docs/design/rlqs.md names). Every
// assignment carries the configured TTL: an Envoy that loses its server
// enforces it until then, then falls back to its
// expired_assignment_behavior. A shutdown serves the streams through the
// drain delay; CloseStreams then ends them.
//
// Failure mode: hostile input is bounded — streams (quota.max_streams:
// ResourceExhausted), bucket ids per stream (quota.max_bucket_ids: past it
// a new one is counted but not tracked, and assigned its bucket's
// on_overflow), entries and bytes per bucket id (MaxIDEntries, MaxIDBytes:
// DENY_ALL, not kept), the message size — each a metric. An id the server
// cannot place fails as configured (unmatched, on_missing_key,
// on_overflow); an oversized one fails closed, since only a client's own
// requests build it.
//
// The design (participants and their shares, the invariants in detail,
// bounds) is in docs/design/rlqs.md.
package rlqs
