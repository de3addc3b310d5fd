package counter

import "time"

// Test-only methods: the counts of one window read directly, and remote
// hits added without a peer. Production code reads counts through Peek,
// Changes and Snapshot and merges peers' counts through Merge.

// Add adds n hits counted by peers to the remote count of (bucket, key) in
// window, for merging replicated counts. It reports whether they were
// stored. Nothing is stored, and false returned, when:
//   - the window is stale (older than now's previous window) or in the
//     future beyond now's window + 1;
//   - the entry already holds newer windows than window + 1 (it is stale
//     for this key);
//   - window is now's window + 1 and storing it would drop the previous
//     window's counts that a Sliding limit still needs at now (the caller
//     should offer the count again later; replicated counts are running
//     counts, so nothing is lost);
//   - the key is new and the store is full (counted in Refused);
//   - n < 0 or lim is invalid.
//
// n == 0 stores nothing and reports whether the window is acceptable.
func (s *Store) Add(bucket Bucket, key string, lim Limit, window int64, n int64, now time.Time) bool {
	if !lim.valid() || n < 0 {
		return false
	}
	ms := now.UnixMilli()
	w, _ := windowSplit(ms, lim.ScaleMS)
	if window < w-1 || window > w+1 {
		return false
	}
	if n == 0 {
		return true
	}
	k := mapKey{bucket, s.storedKey(key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(tag, bucket, k.key)
	if i == noEntry {
		if i = sh.insert(k, tag, lim, window, ms, s.room(sh, bucket)); i == noEntry {
			return false
		}
	}
	e := &sh.entries[i]
	if int64(e.scale) != lim.ScaleMS {
		e.scale = uint32(lim.ScaleMS)
		e.reset(window)
		sh.noteExpiry(e)
	}
	if window < e.newest-1 {
		return false
	}
	if window > e.newest {
		if lim.Algorithm == Sliding && window == w+1 && e.total(w-1) != 0 {
			return false // would drop the previous window a Sliding limit reads at now
		}
		e.advance(window)
	}
	if e.alg != lim.Algorithm {
		e.alg = lim.Algorithm
		sh.noteExpiry(e)
	}
	e.remote[window&1] = satAdd(e.remote[window&1], n)
	return true
}

// Count returns the counts of (bucket, key) in window for lim (only its
// window length matters): local is this node's own hits (Take and Incr
// minus Release), total is local plus the remote hits merged by Add and
// Merge. Both are 0 when the key is
// unknown, counted in another scale, the window is not held or lim is
// invalid.
func (s *Store) Count(bucket Bucket, key string, lim Limit, window int64) (local, total int64) {
	if !lim.valid() {
		return 0, 0
	}
	k := mapKey{bucket, s.storedKey(key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(tag, bucket, k.key)
	if i == noEntry {
		return 0, 0
	}
	e := &sh.entries[i]
	if int64(e.scale) != lim.ScaleMS || (window != e.newest && window != e.newest-1) {
		return 0, 0
	}
	return e.local[window&1], e.local[window&1] + e.remote[window&1]
}

// storedKeys returns the live keys of sh as the table stores them.
func (sh *shard) storedKeys() []mapKey {
	var ks []mapKey
	for i := range sh.entries {
		if e := &sh.entries[i]; e.scale != 0 {
			ks = append(ks, mapKey{e.bucket, sh.keyView(e.key)})
		}
	}
	return ks
}
