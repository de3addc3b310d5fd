package counter

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// ipKeys returns n distinct IPv4 strings like "203.0.113.45".
func ipKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%d.%d.%d.%d", 100+i>>16, i>>8&0xff, i&0xff, 1+i*7%250)
	}
	return keys
}

var benchNow = time.Date(2025, 6, 2, 10, 0, 0, 250_000_000, time.UTC)

// benchLimit never denies, so every iteration takes the counting path.
func benchLimit(a Algorithm) Limit {
	return Limit{Limit: MaxLimit, ScaleMS: 60_000, Algorithm: a}
}

func BenchmarkTake(b *testing.B) {
	for _, a := range []Algorithm{Fixed, Sliding} {
		b.Run(a.String(), func(b *testing.B) {
			s := newStore(b, Config{})
			lim := benchLimit(a)
			keys := ipKeys(1024)
			for _, k := range keys {
				s.Take(0, k, lim, benchNow)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.Take(0, keys[i&1023], lim, benchNow)
				i++
			}
		})
	}
}

func BenchmarkTakeParallel(b *testing.B) {
	s := newStore(b, Config{})
	lim := benchLimit(Fixed)
	keys := ipKeys(1 << 14)
	for _, k := range keys {
		s.Take(0, k, lim, benchNow)
	}
	var seq atomic.Uint32
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1)) * 7919
		for pb.Next() {
			s.Take(0, keys[i&(1<<14-1)], lim, benchNow)
			i++
		}
	})
}

// BenchmarkTakeOneKeyParallel is the worst case: every goroutine hits the
// same key, so the same shard lock.
func BenchmarkTakeOneKeyParallel(b *testing.B) {
	s := newStore(b, Config{})
	lim := benchLimit(Fixed)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Take(0, "tenant-a", lim, benchNow)
		}
	})
}

func BenchmarkTakeNewKeys(b *testing.B) {
	keys := ipKeys(1 << 20)
	lim := benchLimit(Fixed)
	s := newStore(b, Config{MaxKeys: 4 << 20})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(keys) {
			b.StopTimer()
			s = newStore(b, Config{MaxKeys: 4 << 20})
			i = 0
			b.StartTimer()
		}
		s.Take(0, keys[i], lim, benchNow)
		i++
	}
}

func BenchmarkPeek(b *testing.B) {
	s := newStore(b, Config{})
	lim := benchLimit(Sliding)
	keys := ipKeys(1024)
	for _, k := range keys {
		s.Take(0, k, lim, benchNow)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Peek(0, keys[i&1023], lim, benchNow)
		i++
	}
}

// BenchmarkLongKey is a key that is digested on every call.
func BenchmarkLongKey(b *testing.B) {
	s := newStore(b, Config{})
	lim := benchLimit(Fixed)
	key := fmt.Sprintf("%0200d", 42)
	b.ReportAllocs()
	for b.Loop() {
		s.Take(0, key, lim, benchNow)
	}
}

// BenchmarkMemoryPerKey reports the heap held per live key (entry, table
// slot and key bytes together) after inserting 1,000,000 IPv4 keys.
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 1_000_000
	keys := ipKeys(n)
	for b.Loop() {
		perKey := heapPerKey(b, keys)
		b.ReportMetric(perKey, "B/key")
	}
}

// heapPerKey inserts keys into a fresh Store and returns the heap growth per
// key, measured after a GC on both sides.
func heapPerKey(tb testing.TB, keys []string) float64 {
	lim := benchLimit(Fixed)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := newStore(tb, Config{MaxKeys: 2 * len(keys)})
	for _, k := range keys {
		if r := s.Take(0, k, lim, benchNow); !r.Allowed {
			tb.Fatalf("Take(%q) = %+v", k, r)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.Len() != len(keys) {
		tb.Fatalf("Len = %d, want %d", s.Len(), len(keys))
	}
	runtime.KeepAlive(s)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(len(keys))
}

// TestMemoryPerKey guards against growth of a live key's memory: a 72-byte
// entry, a table slot (8 bytes at a load of 3/8 to 3/4) and the key's
// bytes (IPv4 client addresses, 9 to 15 bytes), with the arrays' growth
// slack, come to about 120 bytes; the bound leaves room for heap noise in a
// shared test binary, not for another pointer or allocation per key. The
// table and slab grow in steps, so the figure depends on where the count
// falls between two growths; 500,000 keys over 64 shards is right after a
// table growth, near the worst case.
func TestMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 500,000 keys")
	}
	keys := ipKeys(500_000)
	perKey := heapPerKey(t, keys)
	t.Logf("%.1f bytes per live key", perKey)
	if perKey > 130 {
		t.Errorf("%.1f bytes per live key, over the 130-byte guard", perKey)
	}
}

// BenchmarkTakeTracked is BenchmarkTake with change tracking on (the
// cluster backend): every first hit of a key in an interval is marked.
// Changes is called every 1024 hits, as a sync interval would.
func BenchmarkTakeTracked(b *testing.B) {
	s := newStore(b, Config{Track: true})
	lim := benchLimit(Fixed)
	keys := ipKeys(1024)
	for _, k := range keys {
		s.Take(0, k, lim, benchNow)
	}
	var buf []WindowCount
	buf, _ = s.Changes(buf, benchNow)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Take(0, keys[i&1023], lim, benchNow)
		i++
		if i&(1<<16-1) == 0 {
			b.StopTimer()
			buf, _ = s.Changes(buf[:0], benchNow)
			b.StartTimer()
		}
	}
}

// BenchmarkTakeTrackedNearLimit is BenchmarkTakeTracked with every key
// within its near-limit margin, so every Take also signals NearLimit (a
// non-blocking send on a full channel: nobody reads it here).
func BenchmarkTakeTrackedNearLimit(b *testing.B) {
	s := newStore(b, Config{Track: true})
	lim := benchLimit(Fixed)
	keys := ipKeys(1024)
	for _, k := range keys {
		s.Incr(0, k, lim, lim.Limit-nearMargin(lim.Limit), benchNow)
	}
	var buf []WindowCount
	buf, _ = s.Changes(buf, benchNow)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if !s.Take(0, keys[i&1023], lim, benchNow).Allowed {
			b.Fatal("denied: the margin is used up")
		}
		i++
		if i&(1<<16-1) == 0 {
			b.StopTimer()
			buf, _ = s.Changes(buf[:0], benchNow)
			b.StartTimer()
		}
	}
}

// BenchmarkChanges is one sync interval's collection of 1024 changed keys.
func BenchmarkChanges(b *testing.B) {
	s := newStore(b, Config{Track: true})
	lim := benchLimit(Fixed)
	keys := ipKeys(1024)
	var buf []WindowCount
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for _, k := range keys {
			s.Take(0, k, lim, benchNow)
		}
		b.StartTimer()
		buf, _ = s.Changes(buf[:0], benchNow)
	}
	b.ReportMetric(float64(len(buf)), "keys/op")
}

// BenchmarkMerge merges a peer's running counts of existing keys.
func BenchmarkMerge(b *testing.B) {
	s := newStore(b, Config{Track: true})
	lim := benchLimit(Fixed)
	keys := ipKeys(1024)
	w := benchNow.UnixMilli() / lim.ScaleMS
	for _, k := range keys {
		s.Take(0, k, lim, benchNow)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Merge(1, WindowCount{Key: keys[i&1023], ScaleMS: lim.ScaleMS, Window: w, Count: int64(i>>10 + 1)}, benchNow)
		i++
	}
}

// BenchmarkTakeShared is BenchmarkTakeTracked with budget shares on (a
// node of three): each Take also computes this node's share, from the
// first share for keys nobody reported ("new") or from the counts this
// node and its peers reported ("known"). The limit is never reached.
func BenchmarkTakeShared(b *testing.B) {
	for _, known := range []bool{false, true} {
		b.Run(map[bool]string{false: "new", true: "known"}[known], func(b *testing.B) {
			s := newStore(b, Config{Track: true})
			if err := s.SetShares(share.Split{Nodes: 3, Rank: 0, Delay: 15 * time.Millisecond}); err != nil {
				b.Fatal(err)
			}
			lim := benchLimit(Fixed)
			keys := ipKeys(1024)
			w := benchNow.UnixMilli() / lim.ScaleMS
			for _, k := range keys {
				s.Take(0, k, lim, benchNow)
				if known {
					s.Merge(1, WindowCount{Key: k, ScaleMS: lim.ScaleMS, Window: w, Count: 1000}, benchNow)
				}
			}
			var buf []WindowCount
			if known {
				s.MarkUnreported(1)
			}
			buf, _ = s.Changes(buf, benchNow)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !s.Take(0, keys[i&1023], lim, benchNow).Allowed {
					b.Fatal("denied")
				}
				i++
				if i&(1<<16-1) == 0 {
					b.StopTimer()
					buf, _ = s.Changes(buf[:0], benchNow)
					b.StartTimer()
				}
			}
		})
	}
}
