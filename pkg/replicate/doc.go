// Package replicate shares the counts of a counter store between the nodes
// of a cluster over NATS, so that a limit holds for the cluster rather than
// once per node. It depends on package counter; counter knows nothing of it.
//
// # What goes over the wire
//
// Every SyncInterval (100 ms by default; ticks are aligned to the wall
// clock like the windows) a node publishes one message on
// <prefix>.batch with the (bucket, key, window) counts its own hits changed
// since its previous batch — split into several messages only when one
// would exceed the server's max_payload; when nothing changed, a heartbeat
// at most once a second (see below). An
// entry carries the sender's own running count for that window, not an
// increment.
//
// A node also publishes early, between ticks, when a local hit leaves a
// key near its limit: at or below half of it remaining, counting what
// peers reported (counter.Store.NearLimit). The early batch is an ordinary
// batch of everything changed since the previous one, so peers learn that
// the key is filling up within the delivery delay rather than at the next
// tick. Early batches are spaced by at least EarlyGap (SyncInterval/10 by
// default, 10 ms; a hit within the gap is published at its end), and the
// ticks still run: a node publishes at most one batch per SyncInterval
// plus one per EarlyGap (each split only when too large for one message).
// Only admitted hits trigger one, so a key held at its limit by denials
// costs nothing more; a key that keeps being admitted above half its limit
// (a sliding window under sustained overload, say) keeps its node at up to
// one early batch per gap.
//
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
// (a hit near its limit adds one non-blocking channel send to it). The
// price is eventual consistency. Each node knows its peers' counts as of
// their last batch, so within one window the cluster admits at most
//
//	limit + (what the other nodes admit between their last batch and the
//	         moment they learn the limit is reached)
//
// For a key receiving R requests per second in all, over N nodes:
//
//   - once every node sees the key at least half used (after the first
//     batch that shows it), each admitted hit makes its node publish
//     within EarlyGap, so the overshoot is at most about (N−1)/N × R ×
//     (EarlyGap + delivery delay) — a few hits at 10 ms;
//   - before that, a node sees its own hits plus its peers' as of their
//     last batch; the early batches start when that reaches half the limit.
//     When one interval brings more than the limit (R × SyncInterval >
//     limit), every node may admit up to half the limit on its own before
//     the first batch: up to N/2 × limit in all (1.5× for 3 nodes; without
//     early batches, up to N×). Otherwise the first tick shows the key at
//     least half used, or it is reached with at most one interval's hits
//     unseen, as above;
//   - when the limit is reached right at a tick (a steady load filling a
//     1 s window in a multiple of 100 ms) the overshoot is close to zero.
//
// bench/results/REPORT.md reports the overshoot under load.
//
// With EarlyGap negative the bound is (N−1)/N × R × (SyncInterval +
// delivery delay). Clocks must be NTP-synchronised: a skewed node maps its
// hits to the wrong window at the edges. The largest skew over peers is
// exported.
//
// When NATS is unreachable — at start or later — the node fails open to
// per-node limits: it admits against its own counts plus what it last
// heard, publishes nothing (not even early batches), and keeps its
// changes marked; nats.go
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
// snapshot of its own live counts and publishes it again, a share with
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
