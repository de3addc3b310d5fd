// Package counter is the in-memory window counter store of ratelimit-authz:
// it admits and counts hits per (bucket, key) against a [Limit], peeks
// without counting, rolls a hit back, merges counts replicated from peer
// nodes, and expires what can no longer matter. It is a leaf: it knows
// nothing of gRPC, NATS, Postgres or Prometheus, and it never reads the
// clock on its own — every method that needs the time takes it as now
// (only [Store.Run], the background sweeper, calls time.Now).
//
// The methods take their arguments in one order — what is counted
// (bucket, key, limit), then the window when one is addressed, then a
// count, then the time: [Store.Take](bucket, key, lim, now),
// [Store.Peek](bucket, key, lim, now), [Store.Incr](bucket, key, lim, n,
// now), [Store.Release](bucket, key, lim, window).
//
// # Windows
//
// Windows are aligned to the wall clock, never to a key's first hit:
//
//	window = floor(now_ms / ScaleMS)   // now_ms = now.UnixMilli()
//
// so every node maps the same instant to the same window number and a
// window counted on one node can be merged into the same window on another.
// [WindowOf] is that formula and [Live] says which windows still matter at
// an instant; the server computes windows with them only (replication
// too), so every node and both ends of a message agree.
// [Fixed] counts the current window only. [Sliding] estimates
//
//	previous × (1 − elapsed/ScaleMS) + current
//
// from the same two fixed windows (elapsed = now_ms − window start), so it
// replicates exactly like Fixed and removes the 2× burst a fixed window
// allows across its edge. The arithmetic is exact integer arithmetic: a hit
// is admitted iff previous×(ScaleMS−elapsed) + (current+1)×ScaleMS ≤
// Limit×ScaleMS. Each entry keeps the counts of its newest window and the one
// before it, split into this node's own hits (local) and the hits merged from
// peers (remote); decisions use local + remote.
//
// # Replication hooks
//
// The store is what a cluster of nodes shares, but it knows nothing of the
// network; package replicate moves the counts. Four methods serve it:
//
//   - With Config.Track set, every local count a Take or Incr changes marks
//     its (bucket, key, window) — with shares on ([Store.SetShares]), a
//     Take or TakeN only once this node's unreported hits reach half its
//     share; [Store.Changes] returns this node's running count of each
//     marked window and clears the marks. Marking
//     copies the key into a per-shard buffer that is reused between calls,
//     so a Take on an existing key still does not allocate, and costs one
//     predictable branch when Track is off.
//   - With Track set, [Store.NearLimit] receives when a local Take admits
//     a hit (or an Incr counts) that leaves the key at most half its limit
//     remaining — with shares on, when a Take marks the key — so that replication can publish at once rather than at
//     its next tick. It is a buffered(1) channel sent to without blocking,
//     after the shard lock is released: no allocation, and nothing at all
//     when Track is off.
//   - [Store.Merge] takes a peer's running count of one window and keeps,
//     per (peer, key, window), the highest seen; the key's remote count is
//     the sum over peers. A lost report is repaired by the next one, a
//     repeated or reordered one changes nothing. Windows that have ended
//     (Fixed: before now's; Sliding: before the previous) are refused as
//     Stale, on both sides. Per-peer counts live in a per-shard side table
//     keyed like the entries, only for keys peers reported, bounded by
//     Config.MaxPeersPerKey and swept with their entries; an entry stays
//     72 bytes and pointer-free.
//   - [Store.Snapshot] lists every live count with the node that made it,
//     for a peer that warm-starts; it merges them with Merge.
//
// # Bounded memory and the failure mode
//
// Keys come from requests, so an attacker controls them. Two bounds keep
// memory bounded under a flood of distinct keys:
//
//   - Keys longer than Config.MaxKeyBytes (and keys starting with '#', the
//     digest marker, so a digest can never collide with a raw key) are stored
//     as "#" + 32 hex digits of their SHA-256: distinct keys stay distinct, a
//     stored key is at most max(MaxKeyBytes, 33) bytes.
//   - The number of live keys is bounded by Config.MaxKeys, enforced per shard
//     (ceil(MaxKeys/Shards) each). When a shard is full, entries in it that
//     have expired are reclaimed first; if none can be, the new key is
//     refused: the call returns a [Result] with Overflow set (Allowed false),
//     nothing is stored, and the refusal is counted in [Store.Refused].
//     Existing keys keep working. Whether an overflowing request is let
//     through (fail open) or denied (fail closed) is the caller's decision,
//     made in one place there; this package only reports it.
//   - Config.ReservedKeys of that room is kept for the Config.Reserved
//     buckets (those that fail closed when full): the keys of every other
//     bucket are refused once a shard holds its share of MaxKeys −
//     ReservedKeys, so a flood of other keys never fills the reserve. The
//     reserved set follows reloads ([Store.SetReserved]); [Store.DropBuckets]
//     frees the keys of buckets a reload removed or changed, one shard at a
//     time.
//
// Because the bound is per shard, refusals can start slightly before MaxKeys
// keys are live in total (hashing is not perfectly even), and the total never
// exceeds Shards × ceil(MaxKeys/Shards).
//
// # Memory per key
//
// Each shard keeps its keys in three flat, pointer-free arrays (table.go):
// a slab of 72-byte entries indexed by uint32, an open-addressing table of
// 8-byte slots (hash tag and index) at most 3/4 full, and an arena of the
// key bytes. A live key costs its entry, a slot and its bytes (about 100
// bytes for an IPv4 key at 1,000,000 keys, BenchmarkMemoryPerKey), with no
// allocation of its own, and the garbage collector scans none of it.
//
// Memory also comes back once a flood has expired: neither the slab nor a
// Go map shrinks by itself, so when a sweep (or a full shard's reclaim
// pass) leaves a shard's entries or per-peer table with under a quarter of
// the most entries it held (at least 1024), the live entries are copied
// into fresh arrays sized for them under the shard lock and the old ones
// become garbage, a copy paid for by the deletions before it. Short of
// that, a deleted key's bytes stay in the arena until the dead bytes
// outweigh the live ones; the live keys are then copied to a fresh arena,
// so under churn the arena stays within twice its live bytes (plus 4 KiB).
//
// # Concurrency
//
// A [Store] is safe for concurrent use by any number of goroutines. It is
// sharded by a seeded hash of (bucket, key); each shard is one mutex and one
// table, so a Take is one short critical section and admit-and-count is
// atomic: N goroutines racing on one key in one window admit exactly Limit
// hits. Looking up an existing key does not allocate (a key that must be
// digested costs a small allocation per call); inserting one copies the
// key (which may be a substring of a large header) into the shard's arena
// and allocates only when an array grows. A full shard's reclaim pass, and [Store.Sweep], hold one shard
// lock for one pass over that shard's entries.
//
// # Zero value
//
// The zero value of Store is not usable; [New] is the constructor. [Limit]
// and [Config] are plain values: a zero Config field means its default, a
// zero Limit is invalid (see [Limit.Validate]).
package counter
