package top_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// BenchmarkHit records hits of one hot key among many distinct ones, as
// a flood looks; Parallel does it from GOMAXPROCS goroutines at once.
func BenchmarkHit(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprint("10.0.", i>>8, ".", i&255)
	}
	keys[0] = "offender"
	ms := t0.UnixMilli()
	// hit i: every other one the offender's, denied a third of the time.
	hit := func(s *top.Sketch, i int) {
		k := keys[0]
		if i%2 == 1 {
			k = keys[i%len(keys)]
		}
		s.Hit(1, k, 1, i%3 != 0, ms/1000, 1000, ms)
	}
	b.Run("Serial", func(b *testing.B) {
		s := newSketch(b, top.Config{})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			hit(s, i)
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		s := newSketch(b, top.Config{})
		var seq atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(1)) * 7919
			for pb.Next() {
				i++
				hit(s, i)
			}
		})
	})
}
