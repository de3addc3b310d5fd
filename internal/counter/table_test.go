package counter

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// checkShard verifies the invariants of a shard's arrays: every live entry
// is found under its own key and hash, the table holds exactly the live
// entries, the free list holds exactly the free ones, and the arena's live
// byte count is exact.
func checkShard(t *testing.T, s *Store, sh *shard) {
	t.Helper()
	live, keyBytes := 0, 0
	for i := range sh.entries {
		e := &sh.entries[i]
		if e.scale == 0 {
			continue
		}
		live++
		k := sh.keyView(e.key)
		keyBytes += uvarintLen(len(k)) + len(k)
		if got := sh.find(uint32(hashKey(s.seed, e.bucket, k)), e.bucket, k); got != i {
			t.Fatalf("entry %d (%d, %q): find = %d", i, e.bucket, k, got)
		}
	}
	used := 0
	for _, v := range sh.slots {
		if v != 0 {
			used++
		}
	}
	free := 0
	for f := sh.free; f != 0; f = sh.entries[f-1].key {
		if sh.entries[f-1].scale != 0 {
			t.Fatalf("live entry %d on the free list", f-1)
		}
		if free++; free > len(sh.entries) {
			t.Fatal("free list has a cycle")
		}
	}
	if live != sh.n || used != sh.n || free != len(sh.entries)-sh.n || keyBytes != sh.liveKeyBytes {
		t.Fatalf("n %d: %d live entries, %d used slots, %d free of %d, %d live key bytes (counted %d)",
			sh.n, live, used, free, len(sh.entries), keyBytes, sh.liveKeyBytes)
	}
	if used*4 > len(sh.slots)*3 {
		t.Fatalf("%d of %d slots used, over 3/4", used, len(sh.slots))
	}
}

// TestArenaReusedAfterSweep churns a shard: each round a new set of keys
// arrives and the previous one expires. The arena's dead bytes are
// reclaimed (it stays within twice its live bytes plus the floor and the
// growth of one round), freed entries are reused (the slab does not grow
// past the most keys live at once), and every live key keeps its own count.
func TestArenaReusedAfterSweep(t *testing.T) {
	s := newStore(t, Config{Shards: 1})
	sh := &s.shards[0]
	lim := Limit{Limit: 100, ScaleMS: 1000}
	const perRound = 500
	t0 := at(t, "10:00:00.000")
	maxArena, maxSlab := 0, 0
	for r := range 40 {
		now := t0.Add(time.Duration(r) * time.Second)
		s.Sweep(now) // the previous round's keys have expired
		for i := range perRound {
			k := fmt.Sprintf("round-%d-key-%d", r, i)
			for range 1 + i%3 {
				s.Take(Bucket(i%2), k, lim, now)
			}
		}
		checkShard(t, s, sh)
		for i := range perRound {
			k := fmt.Sprintf("round-%d-key-%d", r, i)
			if local, _ := s.Count(Bucket(i%2), k, lim, now.Unix()); local != int64(1+i%3) {
				t.Fatalf("round %d: %q counts %d, want %d", r, k, local, 1+i%3)
			}
		}
		if s.Len() != perRound {
			t.Fatalf("round %d: Len %d, want %d", r, s.Len(), perRound)
		}
		maxArena, maxSlab = max(maxArena, len(sh.arena)), max(maxSlab, len(sh.entries))
	}
	if sh.arenaCompactions == 0 {
		t.Error("the arena was never compacted under churn")
	}
	round := perRound * (uvarintLen(20) + len("round-39-key-499"))
	if bound := 2*sh.liveKeyBytes + arenaFloor + round; maxArena > bound {
		t.Errorf("arena reached %d bytes for %d live key bytes, over %d", maxArena, sh.liveKeyBytes, bound)
	}
	if maxSlab > perRound {
		t.Errorf("slab reached %d entries for %d live keys at a time: freed entries not reused", maxSlab, perRound)
	}
}

// TestReusedBytesNeverAlias deletes keys, reuses their entries and arena
// space for keys of the same length, and checks that no old key is found
// through a new key's bytes or entry, and that no new key inherits an old
// key's count.
func TestReusedBytesNeverAlias(t *testing.T) {
	s := newStore(t, Config{Shards: 1})
	sh := &s.shards[0]
	short := Limit{Limit: 10, ScaleMS: 1000}
	long := Limit{Limit: 10, ScaleMS: 60_000}
	now := at(t, "10:00:00.500")
	// Keys a-0000…a-2999 expire; b-… outlive them. 3000 dead keys of 6
	// bytes, 3000×7 bytes, pass the arena floor, so the sweep compacts.
	for i := range 3000 {
		s.Incr(0, fmt.Sprintf("a-%04d", i), short, 5, now)
		s.Incr(0, fmt.Sprintf("b-%04d", i), long, 3, now)
	}
	later := now.Add(time.Second)
	if n := s.Sweep(later); n != 3000 {
		t.Fatalf("Sweep removed %d, want 3000", n)
	}
	checkShard(t, s, sh)
	// New keys of the same length take the freed entries.
	for i := range 3000 {
		k := fmt.Sprintf("c-%04d", i)
		if r := s.Take(0, k, short, later); !r.Allowed || r.Count != 1 {
			t.Fatalf("new key %q in a reused entry: %+v, want a fresh count of 1", k, r)
		}
	}
	checkShard(t, s, sh)
	if len(sh.entries) != 6000 {
		t.Errorf("slab of %d entries, want the 6000 it held (freed ones reused)", len(sh.entries))
	}
	for i := range 3000 {
		if r := s.Peek(0, fmt.Sprintf("a-%04d", i), short, later); r.Count != 0 {
			t.Fatalf("a deleted key reads %d through a reused entry", r.Count)
		}
		if local, _ := s.Count(0, fmt.Sprintf("b-%04d", i), long, later.UnixMilli()/60_000); local != 3 {
			t.Fatalf("b-%04d counts %d after reuse, want 3", i, local)
		}
		if local, _ := s.Count(0, fmt.Sprintf("c-%04d", i), short, later.Unix()); local != 1 {
			t.Fatalf("c-%04d counts %d, want 1", i, local)
		}
	}
	// A key handed out by Snapshot is a copy: it stays what it was while
	// the arena is compacted and its bytes reused.
	snap := s.LiveCounts(nil, later)
	keys := make([]string, len(snap))
	for i, pc := range snap {
		keys[i] = strings.Clone(pc.Key)
	}
	s.Sweep(later.Add(time.Second)) // the c- keys expire: another compaction
	for i := range 5000 {
		s.Take(1, fmt.Sprintf("d-%04d", i), short, later.Add(time.Second))
	}
	for i, pc := range snap {
		if pc.Key != keys[i] {
			t.Fatalf("a Snapshot key changed from %q to %q as the store was reused", keys[i], pc.Key)
		}
	}
}

// TestFloodMemoryBounded floods a small store with live distinct keys, four
// times its bound, in keys up to MaxKeyBytes long: the arrays stay sized
// for MaxKeys, whatever the flood, and the heap the store holds stays
// within what MaxKeys of the longest keys cost.
func TestFloodMemoryBounded(t *testing.T) {
	const maxKeys = 8_000
	cfg := Config{MaxKeys: maxKeys, Shards: 4, MaxKeyBytes: 200}
	lim := Limit{Limit: 10, ScaleMS: 60_000}
	now := at(t, "10:00:00.000")
	before := liveHeap()
	s := newStore(t, cfg)
	pad := strings.Repeat("x", 190)
	for i := range 4 * maxKeys {
		s.Take(0, fmt.Sprintf("%s%08d", pad, i), lim, now)
	}
	after := liveHeap()
	runtime.KeepAlive(s)
	if s.Len() > maxKeys || s.Refused() < 3*maxKeys {
		t.Fatalf("Len %d, Refused %d for a flood of %d keys over a bound of %d", s.Len(), s.Refused(), 4*maxKeys, maxKeys)
	}
	perShard := maxKeys / 4
	for i := range s.shards {
		sh := &s.shards[i]
		checkShard(t, s, sh)
		if len(sh.entries) > perShard || len(sh.slots) > slotsFor(perShard) || len(sh.arena) > perShard*(2+200) {
			t.Errorf("shard %d: %d entries, %d slots, %d arena bytes for a bound of %d keys", i, len(sh.entries), len(sh.slots), len(sh.arena), perShard)
		}
	}
	// Each key: an entry, two slots at worst, its bytes; with slack for
	// the arrays' growth.
	perKey := int64(56 + 16 + 202)
	if grew := after - before; grew > 2*maxKeys*perKey {
		t.Errorf("the flood grew the heap by %d bytes, over %d for %d keys", grew, 2*maxKeys*perKey, maxKeys)
	}
}

// TestLongStoredKeys stores keys whose length needs a two-byte length
// prefix in the arena, beside short and empty ones, through a compaction.
func TestLongStoredKeys(t *testing.T) {
	s := newStore(t, Config{Shards: 1, MaxKeyBytes: 4096})
	sh := &s.shards[0]
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	keys := []string{""} // an empty key: a one-byte prefix and no bytes
	for i := range 200 {
		keys = append(keys, strings.Repeat(string(rune('a'+i%26)), i*17%4096)+fmt.Sprint(i))
	}
	for i, k := range keys {
		s.Incr(Bucket(i%3), k, lim, int64(i+1), now)
	}
	checkShard(t, s, sh)
	for i, k := range keys {
		if local, _ := s.Count(Bucket(i%3), k, lim, now.Unix()); local != int64(i+1) {
			t.Fatalf("key %d (%d bytes) counts %d, want %d", i, len(k), local, i+1)
		}
	}
	sh.compactArena()
	checkShard(t, s, sh)
	for i, k := range keys {
		if local, _ := s.Count(Bucket(i%3), k, lim, now.Unix()); local != int64(i+1) {
			t.Fatalf("after compaction key %d counts %d, want %d", i, local, i+1)
		}
	}
}

// FuzzTable runs a sequence of operations, one per input byte pair, on a
// one-shard store and on a reference map, and checks that they agree and
// that the shard's invariants hold: any order of inserts, hits, deletions,
// sweeps, compactions and rebuilds keeps every key's own count.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 1, 2, 0, 3, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0})
	f.Add([]byte("\x00\x05\x00\x06\x00\x07\x02\x05\x02\x06\x05\x00\x00\x05"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 4096 {
			return
		}
		s := newStore(t, Config{Shards: 1, MaxKeys: 64, MaxKeyBytes: 300})
		sh := &s.shards[0]
		lim := Limit{Limit: MaxLimit, ScaleMS: 1000}
		now := at(t, "10:00:00.000")
		ref := map[string]int64{}
		key := func(b byte) string {
			// Lengths from 0 to 255 bytes: one- and two-byte prefixes.
			return strings.Repeat("k", int(b)&0x7f*2) + string(rune('A'+b%32))
		}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%6, ops[i+1]
			k := key(arg)
			switch op {
			case 0, 1: // a hit
				r := s.Take(0, k, lim, now)
				if r.Overflow {
					if _, ok := ref[k]; ok || len(ref) < 64 {
						t.Fatalf("Take(%q) overflowed with %d keys", k, len(ref))
					}
					continue
				}
				ref[k]++
				if r.Count != ref[k] {
					t.Fatalf("Take(%q) = %d, want %d", k, r.Count, ref[k])
				}
			case 2: // drop one key
				if _, ok := ref[k]; ok {
					i := sh.find(uint32(hashKey(s.seed, 0, k)), 0, k)
					sh.remove(i)
					delete(ref, k)
				}
			case 3: // everything expires
				s.Sweep(now.Add(time.Second))
				clear(ref)
			case 4:
				sh.compactArena()
			case 5:
				sh.compactChanged()
				sh.compactEntries()
			}
			checkShard(t, s, sh)
		}
		for k, n := range ref {
			if local, _ := s.Count(0, k, lim, now.Unix()); local != n {
				t.Fatalf("%q counts %d, want %d", k, local, n)
			}
		}
		if s.Len() != len(ref) {
			t.Fatalf("Len %d, want %d", s.Len(), len(ref))
		}
	})
}

// TestMemoryBytes checks that MemoryBytes follows the heap the store's
// arrays take: it grows with the keys, and comes back down once they have
// expired and the shards were rebuilt.
func TestMemoryBytes(t *testing.T) {
	s := newStore(t, Config{Shards: 4})
	empty := s.MemoryBytes()
	lim := Limit{Limit: 10, ScaleMS: 1000}
	now := at(t, "10:00:00.000")
	before := liveHeap()
	for i := range 50_000 {
		s.Take(0, fmt.Sprintf("key-%06d", i), lim, now)
	}
	grew := liveHeap() - before
	full := s.MemoryBytes()
	runtime.KeepAlive(s)
	// Entry, slot and key bytes: at least 72+8+11 per key.
	if full-empty < 50_000*75 || full > grew+grew/10 || full < grew-grew/10 {
		t.Errorf("MemoryBytes %d (empty %d) for 50,000 keys whose heap grew by %d", full, empty, grew)
	}
	s.Sweep(now.Add(time.Second))
	if after := s.MemoryBytes(); after > full/100 {
		t.Errorf("MemoryBytes %d after every key expired, of %d", after, full)
	}
}
