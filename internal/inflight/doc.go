// Package inflight is the concurrency budget of ratelimit-authz: a table
// of leases, one per request in flight on a (bucket, key), acquired when
// Check admits the request and released when Envoy's access log reports
// it done, and the in-flight gauge of each key on this node and, as last
// reported, on each peer. It is a leaf like package counter: it never
// reads the clock (every method takes now) and knows nothing of gRPC,
// NATS or Prometheus.
//
// Invariants:
//
//   - A lease is named by (request id, bucket, key): a release frees that
//     lease only, once; a release naming another request, bucket or key,
//     an expired lease or one already released frees nothing. Request ids
//     are held as 128-bit hashes under the table's secret seeds.
//   - Acquire admits while the key's leases here plus the peers' gauges
//     are below the limit, atomically per key (racing acquisitions admit
//     exactly the limit on one node), and, with shares
//     ([Table.SetShares]), while this node's leases its peers do not
//     know of stay within its share of the free slots: a burst on every
//     node at once holds the limit, not nodes × limit.
//   - A lease not released within its time to live is swept and counted
//     as expired unreleased: its slot comes back after the time to live,
//     never before, and at most a sweep interval later.
//   - A peer's gauge replaces the one before (a gauge, not a count) and
//     vanishes when not repeated within Config.GaugeExpiry.
//   - Memory is bounded: live leases by Config.MaxLeases, keys by
//     Config.MaxKeys (digested beyond Config.MaxKeyBytes, as the counter
//     does), request ids by Config.MaxRequestIDBytes, peers' gauges by
//     Config.MaxPeersPerKey per key.
//
// Failure mode: fail closed. A full table, an empty, over-long or
// repeated request id deny the acquisition ([Outcome]); a peer's gauge
// that does not fit is dropped and counted (the key then counts without
// it, which admits more, never fewer).
//
// [Sync] carries the gauges and the releases between the nodes over the
// replicator's sealed messages. The design, the cluster's admission bound
// and the figures are in docs/design/inflight.md.
package inflight
