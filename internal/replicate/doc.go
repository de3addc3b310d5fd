// Package replicate shares the counts of a counter store between the nodes
// of a cluster over NATS, so that a limit holds for the cluster rather than
// once per node. It depends on package counter; counter knows nothing of it.
// A [Replicator] publishes what the store marked (every SyncInterval, and
// early for a key near its budget share), merges its peers' counts,
// warm-starts from them and follows reloads ([Replicator.Prepare]).
//
// Invariants:
//
//   - Admission stays local and immediate: Check never waits on NATS, and
//     this package holds no counter operation up longer than a shard lock.
//   - A message carries the sender's running count of a window, never an
//     increment; a receiver keeps the highest per (peer, key, window), so a
//     lost batch is repaired by the next one and a repeated or reordered
//     one changes nothing.
//   - A node is a process (node id and a random incarnation): a restarted
//     node is a new peer, and processes sharing a name stay distinct.
//   - With budget shares (the share.Split this package sets with
//     counter.Store.SetShares) a cluster admits of a key in one window at
//     most its limit plus the few hits admitted on shares that a report
//     still in flight would have lowered.
//   - Windows are computed by package counter alone (counter.WindowOf,
//     counter.Live) and every time is read from Config.Now, so both ends of
//     a message agree.
//
// Failure mode: when NATS is unreachable, at start or later, the node fails
// open to per-node limits (shares off, nothing published, changes kept
// marked) and catches up once nats.go reconnects; Ready never waits longer
// than WarmStartTimeout. Every received message is checked before use and
// whatever fails a check is dropped and counted: a message that does not
// open under Config.Keys, is larger than MaxMessageBytes, of another
// version, does not decode, was sent outside MaxClockSkew, comes from a
// peer beyond MaxPeers, or names a bucket, window or algorithm this node's
// buckets do not hold; counts above a bucket's Bounds merge at the bound.
//
// The design (the wire, budget shares, identity, warm start, guarantees,
// liveness, hostile input, structure) is in docs/design/replication.md.
package replicate
