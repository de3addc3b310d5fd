package inflight

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAcquireRelease: one lease taken and released per iteration,
// on one key (every goroutine contends on one shard) and on a key per
// goroutine.
func BenchmarkAcquireRelease(b *testing.B) {
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = fmt.Sprintf("0f8fad5b-d9cb-469f-a165-%012d", i)
	}
	for _, c := range []struct {
		name    string
		keyOfGo func(g int64) string
	}{
		{"one_key", func(int64) string { return "tenant" }},
		{"key_per_goroutine", func(g int64) string { return fmt.Sprint("tenant-", g) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			tb, err := New(Config{})
			if err != nil {
				b.Fatal(err)
			}
			var gs atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				g := gs.Add(1)
				key := c.keyOfGo(g)
				i := int(g) << 12
				for pb.Next() {
					id := ids[i&(len(ids)-1)]
					tb.Acquire(1, key, id, 1<<20, time.Minute, t0)
					tb.Release(1, key, id)
					i++
				}
			})
		})
	}
}
