package top_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// t0 is a fixed instant at the start of an epoch and of a 1-s window.
var t0 = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

func newSketch(t testing.TB, cfg top.Config) *top.Sketch {
	t.Helper()
	s, err := top.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hit records one hit at at in 1-s windows.
func hit(s *top.Sketch, b counter.Bucket, key string, allowed bool, at time.Time) {
	ms := at.UnixMilli()
	s.Hit(b, key, 1, allowed, counter.WindowOf(ms, 1000), 1000, ms)
}

// TestBoundHolds checks the documented error bound on random streams
// (skewed and uniform, several shards, both outcomes): totals are exact,
// every listed key's true count is within [Hits−Error, Hits], every key
// not listed has at most Unlisted, and Unlisted ≤ total/K.
func TestBoundHolds(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		k := 1 + r.IntN(12)
		s := newSketch(t, top.Config{K: k, Shards: 1 + r.IntN(4)})
		keys := 1 + r.IntN(300)
		zipf := rand.NewZipf(r, 1.1+r.Float64(), 1, uint64(keys-1))
		truth := [2]map[string]uint64{{}, {}}
		hits := 500 + r.IntN(5000)
		for range hits {
			key := fmt.Sprint("k", zipf.Uint64())
			if seed%3 == 0 {
				key = fmt.Sprint("k", r.IntN(keys))
			}
			allowed := r.IntN(3) > 0
			n := int64(1 + r.IntN(3))
			at := t0.Add(time.Duration(r.IntN(50_000)) * time.Millisecond)
			s.Hit(3, key, n, allowed, counter.WindowOf(at.UnixMilli(), 1000), 1000, at.UnixMilli())
			o := 1
			if allowed {
				o = 0
			}
			truth[o][key] += uint64(n)
		}
		got := s.Read(3, t0.Add(50*time.Second), 0)
		m := got.Minute
		for o, c := range []struct {
			total, unlisted uint64
			list            []top.Key
		}{{m.Admitted, m.UnlistedAdmitted, m.TopAdmitted}, {m.Denied, m.UnlistedDenied, m.TopDenied}} {
			var total uint64
			for _, v := range truth[o] {
				total += v
			}
			if c.total != total {
				t.Fatalf("seed %d outcome %d: total %d, want %d", seed, o, c.total, total)
			}
			if c.unlisted > total/uint64(k) {
				t.Fatalf("seed %d outcome %d: unlisted bound %d > total/k = %d", seed, o, c.unlisted, total/uint64(k))
			}
			listed := map[string]bool{}
			for _, e := range c.list {
				listed[e.Key] = true
				if v := truth[o][e.Key]; v > e.Hits || v < e.Hits-e.Error {
					t.Fatalf("seed %d outcome %d: key %q has %d hits, listed as %d (error %d)", seed, o, e.Key, v, e.Hits, e.Error)
				}
			}
			for key, v := range truth[o] {
				if !listed[key] && v > c.unlisted {
					t.Fatalf("seed %d outcome %d: key %q with %d hits is not listed, bound %d", seed, o, key, v, c.unlisted)
				}
			}
		}
	}
}

// TestFloodKeepsOffender: a million distinct keys, one hit each, do not
// grow the sketch, and the tenant sending a tenth of the hits stays first.
func TestFloodKeepsOffender(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys")
	}
	s := newSketch(t, top.Config{Shards: 4})
	at := t0.Add(time.Second)
	for i := range 64 { // every shard holds the bucket before memory is measured
		hit(s, 1, fmt.Sprint("warm", i), false, at)
	}
	before := s.MemoryBytes()
	const flood = 1_000_000
	for i := range flood {
		hit(s, 1, fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), false, at)
		if i%10 == 0 {
			hit(s, 1, "offender", false, at)
		}
	}
	if after := s.MemoryBytes(); after != before {
		t.Fatalf("memory %d bytes after the flood, %d before", after, before)
	}
	got := s.Read(1, at, 3)
	for _, p := range []*top.Period{&got.Minute, got.Window} {
		if len(p.TopDenied) == 0 || p.TopDenied[0].Key != "offender" {
			t.Fatalf("top denied %+v, want offender first", p.TopDenied)
		}
		if e := p.TopDenied[0]; e.Hits-e.Error > flood/10 || e.Hits < flood/10 {
			t.Fatalf("offender listed with %d hits (error %d), sent %d", e.Hits, e.Error, flood/10)
		}
	}
}

func TestHitDoesNotAllocate(t *testing.T) {
	s := newSketch(t, top.Config{})
	long := strings.Repeat("x", 1000)
	keys := []string{"a", "tenant-42", long, long + "y"}
	ms := t0.UnixMilli()
	for _, k := range keys { // the first hit of a bucket in a shard makes its summaries
		for range 1000 {
			s.Hit(2, k, 1, true, ms/1000, 1000, ms)
		}
	}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		i++
		s.Hit(2, keys[i%len(keys)], 1, i%2 == 0, ms/1000, 1000, ms)
	}); n != 0 {
		t.Fatalf("Hit allocates %v times", n)
	}
}

// TestPeriods: the minute forgets epochs older than Epochs; the window
// holds only the bucket's window holding the read instant.
func TestPeriods(t *testing.T) {
	s := newSketch(t, top.Config{Shards: 2})
	hit(s, 0, "old", false, t0)
	hit(s, 0, "old", false, t0)
	got := s.Read(0, t0.Add(55*time.Second), 0)
	if got.Minute.Denied != 2 || got.Epochs[1].Denied != 2 {
		t.Fatalf("minute at +55 s: %+v epochs %+v", got.Minute, got.Epochs)
	}
	if got.Window != nil {
		t.Fatalf("window at +55 s: %+v, want none (the last hit was at +0 s)", got.Window)
	}
	at := t0.Add(75 * time.Second) // epoch t0+70 s: t0's is the 8th back
	hit(s, 0, "new", false, at)
	got = s.Read(0, at, 0)
	if len(got.Minute.TopDenied) != 1 || got.Minute.TopDenied[0].Key != "new" || got.Minute.Denied != 1 {
		t.Fatalf("minute at +75 s: %+v", got.Minute)
	}
	if got.Epochs[top.Epochs-1].Denied != 1 {
		t.Fatalf("epochs %+v: the current epoch is last", got.Epochs)
	}
	if w := s.Read(0, at.Add(500*time.Millisecond), 0).Window; w == nil || w.Denied != 1 || !w.Start.Equal(at) {
		t.Fatalf("window at +75.5 s: %+v", w)
	}
}

// TestHostileKeys: long and binary keys are kept in at most MaxKeyBytes,
// two long keys with one prefix stay apart, and a key is returned as
// bytes, unescaped (escaping is the page's job).
func TestHostileKeys(t *testing.T) {
	s := newSketch(t, top.Config{MaxKeyBytes: 32, Shards: 1})
	long := strings.Repeat("<script>", 100)
	hit(s, 0, long+"a", false, t0)
	hit(s, 0, long+"b", false, t0)
	hit(s, 0, long+"b", false, t0)
	bin := "\x00\xff<b>\n"
	hit(s, 0, bin, true, t0)
	got := s.Read(0, t0, 0).Minute
	if len(got.TopDenied) != 2 {
		t.Fatalf("two long keys read as %+v", got.TopDenied)
	}
	for _, e := range got.TopDenied {
		if len(e.Key) != 32 || !strings.HasPrefix(e.Key, long[:23]+"~") {
			t.Fatalf("long key kept as %q", e.Key)
		}
	}
	if got.TopDenied[0].Hits != 2 || got.TopDenied[1].Hits != 1 {
		t.Fatalf("long keys counted %+v", got.TopDenied)
	}
	if len(got.TopAdmitted) != 1 || got.TopAdmitted[0].Key != bin {
		t.Fatalf("binary key read as %+v", got.TopAdmitted)
	}
}

func TestBounds(t *testing.T) {
	var nilSketch *top.Sketch
	nilSketch.Hit(0, "k", 1, true, 0, 1000, 0)
	if got := nilSketch.Read(0, t0, 10); got.Minute.Admitted != 0 || nilSketch.MemoryBytes() != 0 {
		t.Fatalf("nil sketch read %+v", got)
	}
	s := newSketch(t, top.Config{Buckets: 4, Shards: 1})
	for b := range counter.Bucket(4) {
		hit(s, b<<20, "k", true, t0) // ids are hashes: any value
	}
	hit(s, 4<<20, "k", true, t0) // a fifth bucket: skipped
	if got := s.Read(4<<20, t0, 10); got.Minute.Admitted != 0 {
		t.Fatalf("bucket beyond Config.Buckets read %+v", got)
	}
	if got := s.Read(3<<20, t0, 10); got.Minute.Admitted != 1 {
		t.Fatalf("bucket within Config.Buckets read %+v", got)
	}
	s.Forget([]counter.Bucket{0})
	hit(s, 4<<20, "k", true, t0) // room again
	if got := s.Read(4<<20, t0, 10); got.Minute.Admitted != 1 || s.Read(0, t0, 10).Minute.Admitted != 0 {
		t.Fatalf("after Forget: the fifth bucket read %+v", got)
	}
	for _, c := range []top.Config{{K: -1}, {K: top.MaxK + 1}, {Buckets: top.MaxBuckets + 1}, {MaxKeyBytes: 8}, {MaxKeyBytes: 256}, {Shards: 65}} {
		if _, err := top.New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// TestConcurrent: hits recorded from many goroutines at once are all
// counted (run under -race).
func TestConcurrent(t *testing.T) {
	s := newSketch(t, top.Config{Shards: 4})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				hit(s, 0, fmt.Sprint("k", (g*i)%50), i%4 != 0, t0)
				if i%100 == 0 {
					s.Read(0, t0, 5)
				}
			}
		})
	}
	wg.Wait()
	got := s.Read(0, t0, 5).Minute
	if got.Admitted+got.Denied != 8*2000 {
		t.Fatalf("counted %d + %d hits, sent %d", got.Admitted, got.Denied, 8*2000)
	}
}

// TestMergeBoundHolds: a stream split over three sketches (a cluster's
// nodes), each read with a few keys per list, merges into lists whose
// bounds hold for the whole stream, and into its exact totals.
func TestMergeBoundHolds(t *testing.T) {
	for seed := range uint64(30) {
		r := rand.New(rand.NewPCG(seed, 99))
		var nodes []*top.Sketch
		for range 3 {
			nodes = append(nodes, newSketch(t, top.Config{K: 4 + r.IntN(8), Shards: 1 + r.IntN(3)}))
		}
		zipf := rand.NewZipf(r, 1.2, 1, 200)
		truth := map[string]uint64{}
		var total uint64
		for range 3000 {
			key := fmt.Sprint("k", zipf.Uint64())
			truth[key]++
			total++
			hit(nodes[r.IntN(3)], 0, key, false, t0)
		}
		n := 1 + r.IntN(6)
		var parts []top.Tops
		for _, s := range nodes {
			parts = append(parts, s.Read(0, t0, n))
		}
		m := top.Merge(parts, n)
		got := m.Minute
		if got.Denied != total || m.Window == nil || m.Window.Denied != total || len(m.Epochs) != top.Epochs {
			t.Fatalf("seed %d: merged totals %d, window %+v, epochs %d; want %d", seed, got.Denied, m.Window, len(m.Epochs), total)
		}
		listed := map[string]bool{}
		for _, k := range got.TopDenied {
			listed[k.Key] = true
			if v := truth[k.Key]; v > k.Hits || v < k.Hits-k.Error {
				t.Fatalf("seed %d: %q had %d hits, merged as %d ± %d", seed, k.Key, v, k.Hits, k.Error)
			}
		}
		for key, v := range truth {
			if !listed[key] && v > got.UnlistedDenied {
				t.Fatalf("seed %d: %q with %d hits is not listed, bound %d", seed, key, v, got.UnlistedDenied)
			}
		}
	}
}
