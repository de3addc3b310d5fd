// Package replicate shares the counts of a counter store between the nodes
// of a cluster over NATS, so that a limit holds for the cluster rather than
// once per node. It depends on package counter; counter knows nothing of it.
//
// # What goes over the wire
//
// Every SyncInterval (100 ms by default; ticks are aligned to the wall
// clock like the windows) a node publishes one message on <prefix>.batch
// with the (bucket, key, window) counts that its store marked since its
// previous batch — split into several messages only when one would
// exceed the server's max_payload; when nothing changed, a heartbeat at
// most once a second (see below). An entry carries the sender's own
// running count for that window, not an increment.
//
// # Budget shares
//
// A node admits a key's hits, without asking anyone, only up to its
// share of the budget that no node has been told is spent (see
// counter.Store.SetShares): what remains of the limit after this node's
// count as last published and its peers' published counts, split over the
// live nodes (this one and the peers heard from in the last three
// heartbeats; processes, see "Identity" below) as the key's hits that
// every node knows of are: those published of its previous window and of
// this one, smoothed so that a node that had none still gets some. When
// every node holds the same published counts the shares add up to what
// remains, so the cluster admits about the limit before any node hears of
// the others' new hits. A key no node knows a count of has a first share
// of 1.5/N of the limit on every node: a key that bursts on every node at
// once may admit up to 1.5× its limit in that window (see
// docs/design/budget-shares.md).
//
// The store marks a key for publishing only when a hit brings this node's
// unpublished hits of it to half its share or more, or when a peer's
// report shrinks its share to twice its unpublished hits or less (they were
// admitted against the larger share); a key far below its share is never
// sent, so a flood of distinct keys costs no replication.
//
// A marked key is published early, between ticks, at most once per
// EarlyGap (SyncInterval/10 by default, 10 ms; a hit within the gap is
// published at its end). A peer that receives it and holds unpublished
// hits of the key that are now half its share or more publishes those
// within its own gap. So once the node's
// report is EarlyGap plus twice the delivery delay old (15 ms by default:
// see Config.ShareDelay; longer while the peers' batches take longer to
// arrive), it has the peers' answers, and its share is recomputed from
// what then remains. A node that has used its share denies until then
// (counter.Result.RetryAfterMS: until its share grows, a few ms). So a
// node carrying all of a key's traffic, its peers silent, takes most of
// what remains every round of about 2.5×EarlyGap (its published hits
// outweigh the peers' smoothing) and nears the limit within three rounds.
// A node that leaves publishes, in its final batch, every key it counted
// at least twice since its last report.
//
// Incr (failure counting, quota reports) is not admission: every change
// it makes is marked and published at the next tick, as without shares.
// ShareDelay negative turns shares off: every change is marked, each node
// admits on its own view up to the whole limit, and a key is published
// early once a hit leaves it at most half its limit remaining.
// Receivers keep, per peer, key and window, the highest count
// seen, and count the sum over peers of those in their decisions (see
// counter.Store.Merge). So:
//
//   - a lost batch is repaired by the next one that carries the same key;
//   - a repeated or reordered batch changes nothing;
//   - entries of windows that have ended are dropped by the sender and by
//     the receiver (for a sliding window, the previous window is still
//     live: it weighs in the estimate).
//
// Batches name buckets (configurations may differ during a rollout: a name
// the receiver does not know is dropped and counted) and carry the
// window's length, the sender's node id, a random per-process incarnation
// (a restarted node is a new peer, so its fresh counts add to its old ones
// rather than hiding under them), the sender's clock and a sequence number.
// The encoding is a compact versioned binary format (see wire.go);
// connections use nats.NoEcho, so a node never reads its own batches.
//
// # Identity
//
// A node is a process: its node id (a name: Config.NodeID, or the host
// name) and its incarnation. Peers, budget shares (their number and this
// node's rank, from the sorted identities), sync replies and
// anti-entropy all go by the pair, so processes that share a name —
// started with one --node-id, or without one on one host — are nodes of
// their own, and the cluster holds its limits as with distinct names (a
// restarted process is two until the old one is no longer live: the
// cluster then admits less, never more). Two processes of one name heard
// from in turns (not one after the other, as in a restart) are logged
// once per episode, naming both, and counted (duplicate_node_ids_total);
// nothing else changes.
//
// # Warm start and catching up
//
// On start, and after every reconnection, a node publishes a request on
// <prefix>.sync; each peer answers with every count of a live window it
// holds — its own and those it merged, each with the node that made it —
// and the node merges them as if they were batches. Ready is closed once
// one peer's answer is complete (plus a short grace for the others), when
// no peer is subscribed, or when WarmStartTimeout has passed: a node never
// waits longer than that to serve.
//
// # Guarantees and the failure mode
//
// Admission stays local and immediate: Check never waits on NATS and this
// package never blocks a counter operation for more than a shard lock
// (a hit near its share adds one non-blocking channel send to it). What a
// cluster of N nodes admits of a key in one window:
//
//   - at most the limit, plus what a node admits on shares computed from
//     counts that a peer's newer report (still in flight, or later than
//     ShareDelay) would have lowered: a few hits at any load. Rounding
//     adds at most N−1 hits when fewer than N remain (a share of 0 counts
//     as 1, so a small limit is not left unspendable);
//   - at least the limit less what the shares leave unspent on nodes that
//     receive less than their share, which they give back as the others'
//     reports shrink their share: under-admission is a matter of rounds
//     of about 2.5×EarlyGap at the end of a window;
//   - for sliding windows the previous window still weighs in the
//     estimate: a node publishes its unpublished hits of it once the key
//     moves to the next window (its first hit there, or a peer's report
//     of it), so they count until then only on this node.
//
// What shares trade: a node that alone receives a burst larger than its
// share within a round denies the excess for that round, although the
// cluster has budget left (ratelimit_authz_counter_share_denials_total
// counts these); a peer's reported view of a key (Result.Remaining on
// another node) leaves out this node's unpublished hits; and a warm start
// gets every count its peers hold, unpublished ones included.
//
// bench/results/REPORT.md reports what a cluster admits, 2× to 1000×
// offered, evenly spread and skewed.
//
// With EarlyGap negative, marked keys wait for the next tick, and a round
// takes SyncInterval. Clocks must be NTP-synchronised: a skewed node maps its
// hits to the wrong window at the edges. The largest skew over peers is
// exported: a peer's is the least receive minus send time of its batches
// over ten to twenty heartbeats, as a batch's delivery delay is never
// negative but grows while batches wait (a stall of either node or of
// NATS); a batch that waited is logged as such, not as skew.
//
// When NATS is unreachable — at start or later — the node fails open to
// per-node limits: shares are off (it admits against its own counts plus
// what it last heard, up to the whole limit), it publishes nothing (not
// even early batches), and keeps its changes marked; nats.go
// reconnects in the background, and once connected the node publishes its
// pending changes at their latest counts and asks its peers to sync. No
// restart is needed.
//
// # Liveness and repair
//
// A node that has published nothing for Heartbeat (1 s) publishes an empty
// batch, so its peers keep it (a peer silent for PeerExpiry, 1 min, is
// forgotten; if it speaks again it gets its old peer id back, so its
// counts never add twice). Every AntiEntropy (10 s) a node takes a
// snapshot of its own live counts that it published (a key kept below its
// share stays unsent) and publishes it again, a share with
// each tick's batch, over the next period: a lost batch of a key that
// stopped changing is repaired within two periods. A NATS slow-consumer
// event (messages dropped before they were read) is counted and followed
// by a resync.
//
// # Hostile input
//
// With Config.Keys every message is sealed (seal.go: AES-256-GCM, a key
// id in clear, the message kind and subject prefix authenticated with it)
// and a message that does not open is dropped and counted: whoever can
// publish on the subjects without the key can only drop traffic. Every
// decoded field is checked before use: node ids are printable ASCII of at
// most 128 bytes (nothing from the wire is a metric label), window
// offsets are −1, 0 or +1, a message must be sent within MaxClockSkew
// (30 s) of the receiver's clock (so a replay later than that is dropped,
// and an earlier one merges by max under the same peer id: it changes
// nothing), window lengths and counts are checked against the Table's
// Bounds (counts above the bound are merged at it), algorithms against its
// Algorithms. The Table follows reloads (Replicator.Update): a node whose
// configuration differs from a peer's, for a moment or for a rollout,
// drops and counts what it does not share (reasons unknown_bucket, scale,
// algorithm) and merges the rest. Sync requests are answered
// only to _INBOX. subjects, at most SyncAnswersPerSecond (4) in all, from
// a snapshot taken at most once a second. A panic in a NATS handler is
// recovered, counted and logged.
//
// Messages larger than MaxMessageBytes, of another version, or that do not
// decode are dropped and counted; the decoder bounds every length by what
// the message can hold. At most MaxPeers peers are tracked at once (a
// message from another is dropped and counted); the counter bounds the
// keys (MaxKeys) and the peers counted per key (MaxPeersPerKey). Deferred
// and retried counts are bounded too.
//
// # Structure
//
// A Replicator is three parts over one read-only core (configuration,
// store, clock, metrics, identity, cluster key, peer table):
//
//   - the publisher (publish.go) owns the batch state — sequence number,
//     the counts of a publish that failed, the anti-entropy queue, scratch
//     buffers — and is driven by Run's loop alone: ticks, early batches,
//     the final batch;
//   - the receiver (receive.go) opens, validates and merges peers'
//     batches, one message at a time, and keeps the counts deferred to
//     their window;
//   - the syncer (sync.go) runs the warm start and the resyncs (at most
//     one at a time, at most one a second) and answers peers' requests
//     from a cached snapshot.
//
// conn.go makes the connection and its handlers; the peer table
// (peers.go) maps peers to the counter's peer ids and tracks their
// liveness and skew; wire.go is the codec and seal.go the sealing, both
// internal. Every time is read from Config.Now (ticks, send times, peer
// expiry, periods, durations); windows are computed only by package
// counter (counter.WindowOf, counter.Live), so both ends agree on them.
package replicate
