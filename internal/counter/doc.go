// Package counter is the in-memory window counter store of ratelimit-authz:
// it admits and counts hits per (bucket, key) against a [Limit], peeks
// without counting, rolls a hit back, merges counts replicated from peer
// nodes, and expires what can no longer matter. It is a leaf: it knows
// nothing of gRPC, NATS, Postgres or Prometheus, and it never reads the
// clock on its own — every method that needs the time takes it as now
// (only [Store.Run], the background sweeper, calls time.Now).
//
// Invariants:
//
//   - Windows are aligned to the wall clock ([WindowOf]; [Live] says which
//     still matter), so every node maps an instant to the same window.
//     [Fixed] counts the current window, [Sliding] weighs the previous one
//     in, in exact integer arithmetic.
//   - Admit-and-count is atomic: N goroutines racing on one key in one
//     window admit exactly Limit hits. A [Store] is safe for concurrent use.
//   - A peer's count is merged by maximum per (peer, key, window)
//     ([Store.Merge]): a lost report is repaired by the next, a repeated or
//     reordered one changes nothing; ended windows are refused as Stale.
//   - Memory is bounded whatever the keys: a key longer than
//     Config.MaxKeyBytes is stored as its digest, live keys are bounded by
//     Config.MaxKeys per shard (Config.ReservedKeys of it kept for the
//     Config.Reserved buckets), and arrays shrink back after a flood.
//     Looking up an existing key does not allocate.
//
// Failure mode: a new key that does not fit is refused — the [Result] has
// Overflow set (Allowed false), nothing is stored, [Store.Refused] counts
// it — and existing keys keep working. Whether an overflow is let through
// (fail open) or denied (fail closed) is the caller's decision; this package
// only reports it. A zero Config field means its default; a zero Limit is
// invalid ([Limit.Validate]).
//
// Config.Observer, when set, is told of each decision Take, TakeN and
// Incr make (the admin listener's top keys, docs/design/top.md).
//
// The design (the methods' one order of arguments among it) is in
// docs/design/counter.md; budget shares (the split itself is package
// share) in docs/design/budget-shares.md.
package counter
