// Package rlqs serves Envoy's rate limit quota service (RLQS,
// envoy.service.rate_limit_quota.v3 StreamRateLimitQuotas): the server of
// the rate_limit_quota HTTP filter, which enforces locally what the server
// assigns to each bucket id and streams its usage back every reporting
// interval, instead of one call per request.
//
// Each stream is a participant of every bucket id it reports. A bucket id
// maps to a bucket of the rules file and a counter key (Mapping, from the
// file's quota section); the usage a report carries (num_requests_allowed)
// is counted into that (bucket, key) with Counter.Incr — it already
// happened, so nothing refuses it — and so replicates to the other nodes
// like any hit (Envoy reports every few seconds: the requests are taken as
// spread over the span since the previous report, and the part in the
// current window is counted). Each participant is then assigned its share
// of what remains of the window's budget: the remainder split evenly over
// the cluster's participants of the (bucket, key) — each node adds its own
// to a replicated participants count (ParticipantsWindow); until that
// count can hold the participants other nodes got at about the same time
// (Options.Settle), every live node counts as one (Options.Nodes) — as a
// token bucket holding the share, refilled once a window for a
// participant whose latest report stayed within its share (see encode);
// DENY_ALL when nothing is left; ALLOW_ALL for a bucket without limit or
// in shadow mode.
//
// Invariants: within a window, the shares this node hands out at one
// instant add up to at most what remains. A window's share goes out in a
// full token bucket (ALLOW_ALL then the token bucket, in one message: Envoy
// 1.40 keeps a replaced token bucket's tokens and starts one full only
// after a blanket rule). Within the window a share only shrinks (a plain
// replacement caps what Envoy has left) unless the participant is alone
// and all of the window's usage is counted, or the share counted every
// live node (a plain replacement: Envoy scales the tokens left to the
// new cap); between reports only DENY_ALL, the first share of a new
// window, a refresh of the unchanged assignment and abandon_action are
// sent. Every assignment carries the configured TTL: an Envoy that loses
// its server enforces it until then — a refilled bucket goes on admitting
// about its share a window — then falls back to its
// expired_assignment_behavior. A shutdown serves the streams through the
// drain delay; CloseStreams then ends them.
//
// Bounds (hostile input: bucket id values are a client's header values):
// streams (quota.max_streams: ResourceExhausted), bucket ids per stream
// (quota.max_bucket_ids: past it a new one is counted but not tracked, and
// assigned its bucket's on_overflow), entries and bytes per bucket id
// (MaxIDEntries, MaxIDBytes: DENY_ALL, not kept), the message size (the
// gRPC server's receive bound). Each is a metric. Failure mode: an id the
// server cannot place fails as configured (unmatched, on_missing_key,
// on_overflow); an oversized one fails closed, since only a client's own
// requests build it.
package rlqs
