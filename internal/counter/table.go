package counter

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"unsafe"
)

// A shard's keys live in three flat, pointer-free arrays, so that a live key
// costs its entry, one table slot and its key bytes, with no allocation of
// its own and nothing for the garbage collector to scan:
//
//   - entries is a slab of entries indexed by uint32; a freed entry (scale
//     0) is on a free list threaded through its key field and is reused by
//     the next insert.
//   - slots is an open-addressing hash table (linear probing, a power of two
//     long, at most 3/4 full) of tag<<32 | index+1, 0 for an empty slot; the
//     tag is the low 32 bits of the key's hash, so most probes that do not
//     match never touch an entry, and a slot's home is tag & mask. Deletion
//     shifts the following run back (no tombstones), so a lookup stops at
//     the first empty slot.
//   - arena holds each live key as a uvarint length and its bytes; an entry
//     names its key by offset. Bytes are only appended: a deleted key's bytes
//     stay until compactArena copies the live keys into a fresh arena, once
//     the dead bytes outweigh the live ones. So the bytes at an offset never
//     change while an entry names them, and a key can never be read through
//     another key's bytes. Views of the arena (keyView) are used under the
//     shard lock only and never retained: what leaves the store is a copy.

// noEntry is what find returns for a key not in the table.
const noEntry = -1

// maxArena bounds a shard's arena, whose offsets are uint32.
const maxArena = math.MaxUint32

// minSlots is the size of a new or rebuilt table.
const minSlots = 8

// hashKey is the hash of (bucket, key) under seed. Its top bits pick the
// shard, its low 32 bits are the tag within the shard.
func hashKey(seed maphash.Seed, bucket Bucket, key string) uint64 {
	h := maphash.String(seed, key)
	h ^= uint64(bucket) * 0x9e3779b97f4a7c15
	return h * 0xbf58476d1ce4e5b9
}

// keyBytes returns the stored key at off in the arena.
func (sh *shard) keyBytes(off uint32) []byte {
	a := sh.arena[off:]
	if n := a[0]; n < 0x80 {
		return a[1 : 1+int(n)] // most keys: a one-byte length
	}
	return longKey(a)
}

// longKey decodes a key with a length prefix of two or more bytes.
func longKey(a []byte) []byte {
	n, w := binary.Uvarint(a)
	return a[w : w+int(n)]
}

// keyView returns the stored key at off as a string sharing the arena's
// bytes, for a lookup or a comparison under the shard lock; it must not be
// retained (copy it for anything that outlives the lock).
func (sh *shard) keyView(off uint32) string {
	b := sh.keyBytes(off)
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// find returns the index of the entry of (bucket, key), whose hash has the
// low 32 bits tag, or noEntry.
func (sh *shard) find(tag uint32, bucket Bucket, key string) int {
	mask := uint32(len(sh.slots) - 1)
	for i := tag & mask; ; i = (i + 1) & mask {
		s := sh.slots[i]
		if s == 0 {
			return noEntry
		}
		if uint32(s>>32) == tag {
			j := int(uint32(s)) - 1
			if e := &sh.entries[j]; e.bucket == bucket && string(sh.keyBytes(e.key)) == key {
				return j
			}
		}
	}
}

// put stores slot value v (tag<<32 | index+1) in the first empty slot of
// its run; the table must have an empty slot.
func (sh *shard) put(v uint64) {
	mask := uint32(len(sh.slots) - 1)
	i := uint32(v>>32) & mask
	for sh.slots[i] != 0 {
		i = (i + 1) & mask
	}
	sh.slots[i] = v
}

// resize replaces the table with one of n slots (a power of two, more than
// 4/3 of the live entries) holding every live entry.
func (sh *shard) resize(n int) {
	old := sh.slots
	sh.slots = make([]uint64, n)
	for _, v := range old {
		if v != 0 {
			sh.put(v)
		}
	}
}

// slotsFor is the table size for n live entries: the smallest power of two
// that holds them at most 3/4 full.
func slotsFor(n int) int {
	size := minSlots
	for size*3/4 < n+1 {
		size <<= 1
	}
	return size
}

// add stores a new entry e for (bucket, key) with hash tag and returns its
// index, or noEntry when the arena cannot take the key. The key bytes are
// copied into the arena: the caller's string may be a substring of a large
// header.
func (sh *shard) add(tag uint32, key string, e entry) int {
	need := binary.MaxVarintLen64 + len(key)
	if len(sh.arena)+need > maxArena {
		sh.compactArena()
		if len(sh.arena)+need > maxArena {
			return noEntry
		}
	}
	if (sh.n+1)*4 > len(sh.slots)*3 {
		sh.resize(2 * len(sh.slots))
	}
	e.key = uint32(len(sh.arena))
	sh.arena = binary.AppendUvarint(sh.arena, uint64(len(key)))
	sh.arena = append(sh.arena, key...)
	sh.liveKeyBytes += len(sh.arena) - int(e.key)
	var i int
	if sh.free != 0 {
		i = int(sh.free - 1)
		sh.free = sh.entries[i].key
		sh.entries[i] = e
	} else {
		i = len(sh.entries)
		sh.entries = append(sh.entries, e)
	}
	sh.n++
	sh.put(uint64(tag)<<32 | uint64(i+1))
	return i
}

// remove deletes entry i from the table and puts it on the free list. Its
// key bytes become dead (reclaimed by compactArena). The caller drops it
// from the changed list and from peers.
func (sh *shard) remove(i int) {
	e := &sh.entries[i]
	kb := sh.keyBytes(e.key)
	tag := uint32(hashKey(sh.seed, e.bucket, unsafe.String(unsafe.SliceData(kb), len(kb))))
	sh.liveKeyBytes -= uvarintLen(len(kb)) + len(kb)
	mask := uint32(len(sh.slots) - 1)
	want := uint64(tag)<<32 | uint64(i+1)
	at := tag & mask
	for sh.slots[at] != want {
		at = (at + 1) & mask
	}
	// Backward shift: move each later slot of the run whose home is not in
	// (at, j] into the hole, so that no lookup meets an empty slot before
	// its key.
	for j := (at + 1) & mask; sh.slots[j] != 0; j = (j + 1) & mask {
		home := uint32(sh.slots[j]>>32) & mask
		if (j-home)&mask >= (j-at)&mask {
			sh.slots[at] = sh.slots[j]
			at = j
		}
	}
	sh.slots[at] = 0
	*e = entry{key: sh.free}
	sh.free = uint32(i + 1)
	sh.n--
}

func uvarintLen(n int) int {
	w := 1
	for n >= 0x80 {
		n >>= 7
		w++
	}
	return w
}

// compactArena copies the live keys into a fresh arena sized for them and
// points their entries at the copies. The old arena becomes garbage; no
// key's bytes are overwritten in place.
func (sh *shard) compactArena() {
	a := make([]byte, 0, sh.liveKeyBytes)
	for i := range sh.entries {
		e := &sh.entries[i]
		if e.scale == 0 {
			continue
		}
		kb := sh.keyBytes(e.key)
		e.key = uint32(len(a))
		a = binary.AppendUvarint(a, uint64(len(kb)))
		a = append(a, kb...)
	}
	sh.arena = a
	sh.arenaCompactions++
}

// arenaFloor is the dead key bytes below which an arena is not compacted.
const arenaFloor = 4096

// reclaimArena compacts the arena when its dead bytes outweigh its live
// ones: each compaction copies fewer bytes than were deleted since the
// previous one, so its cost is amortised over the deletions.
func (sh *shard) reclaimArena() {
	if dead := len(sh.arena) - sh.liveKeyBytes; dead >= arenaFloor && dead > sh.liveKeyBytes {
		sh.compactArena()
	}
}

// compactEntries copies the live entries into a slab, a table and an arena
// sized for them, empties the free list and renumbers the changed list. The
// old arrays become garbage.
func (sh *shard) compactEntries() {
	old := sh.entries
	sh.entries = make([]entry, 0, sh.n)
	sh.slots = make([]uint64, slotsFor(sh.n))
	oldArena := sh.arena
	sh.arena = make([]byte, 0, sh.liveKeyBytes)
	sh.free = 0
	for i := range old {
		e := old[i]
		if e.scale == 0 {
			continue
		}
		a := oldArena[e.key:]
		n, w := binary.Uvarint(a)
		kb := a[w : w+int(n)]
		e.key = uint32(len(sh.arena))
		sh.arena = append(sh.arena, a[:w+int(n)]...)
		j := len(sh.entries)
		sh.entries = append(sh.entries, e)
		old[i].key = uint32(j) // the new index, for the changed list below
		tag := uint32(hashKey(sh.seed, e.bucket, unsafe.String(unsafe.SliceData(kb), len(kb))))
		sh.put(uint64(tag)<<32 | uint64(j+1))
	}
	for c := range sh.changed {
		sh.changed[c].e = old[sh.changed[c].e].key
	}
}
