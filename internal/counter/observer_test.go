package counter_test

import (
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

type observed struct {
	bucket  counter.Bucket
	key     string
	n       int64
	allowed bool
	window  int64
	scaleMS int64
}

type recorder struct{ got []observed }

func (r *recorder) Hit(bucket counter.Bucket, key string, n int64, allowed bool, window, scaleMS, ms int64) {
	r.got = append(r.got, observed{bucket, key, n, allowed, window, scaleMS})
}

// TestObserverSeesEveryDecision: Take, TakeN and Incr report what they
// decided, once each, with the stored form of the key (Incr's hits are
// spent: admitted); a Peek reports a denial, not an allowance; Release,
// an overflow and Incr of nothing report nothing.
func TestObserverSeesEveryDecision(t *testing.T) {
	rec := &recorder{}
	s, err := counter.New(counter.Config{Shards: 1, MaxKeys: 2, MaxKeyBytes: 8, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	lim := counter.Limit{Limit: 2, ScaleMS: 1000, Algorithm: counter.Fixed}
	now := time.UnixMilli(5_500)
	s.Take(1, "a", lim, now)
	s.Peek(1, "a", lim, now) // allowed: not reported
	s.Take(1, "a", lim, now)
	s.Take(1, "a", lim, now) // denied
	s.TakeN(2, "a-very-long-key", lim, 3, now)
	s.Release(1, "a", lim, 5)
	s.Take(3, "c", lim, now) // no room: overflow
	s.Incr(2, "a-very-long-key", lim, 2, now)
	s.Incr(2, "a-very-long-key", lim, 1, now) // 3 > 2: spent all the same
	s.Incr(2, "a-very-long-key", lim, 0, now) // nothing
	s.Peek(2, "a-very-long-key", lim, now)    // over: a refusal
	long := rec.got[3].key
	if len(long) != 33 || long[0] != '#' {
		t.Fatalf("long key reported as %q, want its digest", long)
	}
	want := []observed{
		{1, "a", 1, true, 5, 1000}, {1, "a", 1, true, 5, 1000}, {1, "a", 1, false, 5, 1000},
		{2, long, 3, false, 5, 1000}, {2, long, 2, true, 5, 1000}, {2, long, 1, true, 5, 1000},
		{2, long, 1, false, 5, 1000},
	}
	if len(rec.got) != len(want) {
		t.Fatalf("observed %+v, want %+v", rec.got, want)
	}
	for i := range want {
		if rec.got[i] != want[i] {
			t.Errorf("decision %d observed %+v, want %+v", i, rec.got[i], want[i])
		}
	}
}

// TestTakeObservedDoesNotAllocate: recording a decision in a top.Sketch
// keeps Take free of allocations.
func TestTakeObservedDoesNotAllocate(t *testing.T) {
	sk, err := top.New(top.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := counter.New(counter.Config{Observer: sk})
	if err != nil {
		t.Fatal(err)
	}
	lim := counter.Limit{Limit: 1000, ScaleMS: 60_000, Algorithm: counter.Sliding}
	now := time.UnixMilli(1_000_000)
	keys := []string{"k1", "k2", "k3", "tenant-with-a-longer-name"}
	for range 200 {
		for _, k := range keys {
			s.Take(0, k, lim, now)
		}
	}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		i++
		s.Take(0, keys[i%len(keys)], lim, now)
	}); n != 0 {
		t.Fatalf("Take with a top.Sketch observer allocates %v times", n)
	}
}

// BenchmarkTakeObserved is Take with no observer and with a top.Sketch,
// over 1024 keys (every key misses the summaries: the sketch's worst
// case), serial and from GOMAXPROCS goroutines.
func BenchmarkTakeObserved(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "10.1." + string(rune('a'+i%26)) + "." + string(rune('a'+i/26))
	}
	lim := counter.Limit{Limit: counter.MaxLimit, ScaleMS: 60_000, Algorithm: counter.Fixed}
	now := time.UnixMilli(1_000_000)
	for _, on := range []bool{false, true} {
		name := "off"
		cfg := counter.Config{}
		if on {
			name = "top"
			sk, err := top.New(top.Config{})
			if err != nil {
				b.Fatal(err)
			}
			cfg.Observer = sk
		}
		s, err := counter.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.Take(0, keys[i&1023], lim, now)
				i++
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					s.Take(0, keys[i&1023], lim, now)
					i += 7
				}
			})
		})
	}
}
