// Package top keeps, per bucket, the keys that spend the most: the top
// keys by admitted and by denied hits over the last minute and over the
// bucket's current window, in memory that does not grow with the keys.
//
// A [Sketch] is fed by [Sketch.Hit] on the decision path (the counter calls
// it once per decision) and read by [Sketch.Read] for the admin listener.
// Each bucket's hits are kept in Space-Saving summaries (Metwally et al.)
// of Config.K entries: one per outcome for each 10-s epoch of the last
// minute ([Epochs] of them, the current one included, so "the last minute"
// is the last 60 to 70 s) and one per outcome for the newest window the
// bucket counted in.
//
// Error bound: a summary of k entries that recorded N hits overestimates
// a listed key by at most its entry's error, and any key it does not list
// has at most its smallest count, which is ≤ N/k. A read merges summaries
// (the shards and the epochs): a key's Hits is the sum of its counts where
// listed plus each full summary's smallest count where not, an upper
// bound; Hits − Error is a lower bound. Unlisted ([Period.Unlisted]) is the
// sum of the smallest counts: no key missing from the merged list has more
// hits, and it is at most N/k over the period however the hits fall, so a
// key with more than N/k hits is always listed. A flood of distinct keys
// therefore cannot evict a key that holds more than 1/k of a bucket's hits.
//
// Invariants: Hit does not allocate once a bucket's summaries exist (they
// are made on its first hit in each shard), never retains the caller's
// key (its bytes are copied, at most Config.MaxKeyBytes of them: a longer
// key is kept as a prefix, "~" and a hash of the whole key), and takes one
// of several shard locks, tried in turn from a random one, so goroutines
// recording at once rarely wait on each other. Memory is bounded by
// Config.Buckets × shards × the summaries' fixed size ([Sketch.MemoryBytes]),
// whatever the keys; a bucket beyond Config.Buckets is not recorded
// (Forget frees the room of buckets a reload removed).
// A Sketch is safe for concurrent use; a nil *Sketch records nothing.
//
// Failure mode: none at run time — a bucket id out of range is skipped.
// The reasoning is in docs/design/top.md.
package top
