package inflight

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newTable(t testing.TB, cfg Config) *Table {
	t.Helper()
	tb, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func wantOutcome(t *testing.T, r Result, want Outcome, inFlight int64) {
	t.Helper()
	if r.Outcome != want || r.InFlight != inFlight {
		t.Fatalf("got %+v, want outcome %d with %d in flight", r, want, inFlight)
	}
}

func TestAcquireUpToLimitThenRelease(t *testing.T) {
	tb := newTable(t, Config{})
	const b = counter.Bucket(7)
	for i := range 3 {
		wantOutcome(t, tb.Acquire(b, "tenant-a", fmt.Sprint("req-", i), 3, time.Minute, t0), Acquired, int64(i+1))
	}
	wantOutcome(t, tb.Acquire(b, "tenant-a", "req-3", 3, time.Minute, t0), DeniedLimit, 3)
	// Other keys and buckets have their own slots.
	wantOutcome(t, tb.Acquire(b, "tenant-b", "req-3", 3, time.Minute, t0), Acquired, 1)
	wantOutcome(t, tb.Acquire(b+1, "tenant-a", "req-3", 3, time.Minute, t0), Acquired, 1)

	if !tb.Release(b, "tenant-a", "req-1") {
		t.Fatal("release of a held lease reported none")
	}
	wantOutcome(t, tb.Acquire(b, "tenant-a", "req-3", 3, time.Minute, t0), Acquired, 3)
	if st := tb.Stats(); st.DeniedLimit != 1 || st.Leases != 5 {
		t.Fatalf("stats %+v, want 1 denied at the limit and 5 leases", st)
	}
}

func TestReleaseFreesOnlyItsOwnLease(t *testing.T) {
	tb := newTable(t, Config{})
	const b = counter.Bucket(1)
	tb.Acquire(b, "tenant-a", "req-a", 2, time.Minute, t0)
	tb.Acquire(b, "tenant-b", "req-b", 2, time.Minute, t0)
	for _, c := range []struct {
		name         string
		bucket       counter.Bucket
		key, id      string
		want         bool
		wantA, wantB int64
	}{
		{"unknown id", b, "tenant-a", "req-x", false, 1, 1},
		{"other tenant's id", b, "tenant-a", "req-b", false, 1, 1},
		{"other bucket", b + 1, "tenant-a", "req-a", false, 1, 1},
		{"empty id", b, "tenant-a", "", false, 1, 1},
		{"its own", b, "tenant-a", "req-a", true, 0, 1},
		{"replayed", b, "tenant-a", "req-a", false, 0, 1},
	} {
		if got := tb.Release(c.bucket, c.key, c.id); got != c.want {
			t.Fatalf("%s: Release = %v, want %v", c.name, got, c.want)
		}
		a, _ := tb.InFlight(b, "tenant-a")
		bb, _ := tb.InFlight(b, "tenant-b")
		if a != c.wantA || bb != c.wantB {
			t.Fatalf("%s: in flight a=%d b=%d, want %d %d", c.name, a, bb, c.wantA, c.wantB)
		}
	}
}

func TestRepeatedRequestIDIsDenied(t *testing.T) {
	tb := newTable(t, Config{MaxRequestIDBytes: 8})
	const b = counter.Bucket(1)
	wantOutcome(t, tb.Acquire(b, "k", "same", 5, time.Minute, t0), Acquired, 1)
	wantOutcome(t, tb.Acquire(b, "k", "same", 5, time.Minute, t0), DeniedRequestID, 1)
	wantOutcome(t, tb.Acquire(b, "k", "", 5, time.Minute, t0), DeniedRequestID, 0)
	wantOutcome(t, tb.Acquire(b, "k", "123456789", 5, time.Minute, t0), DeniedRequestID, 0)
	wantOutcome(t, tb.Acquire(b, "k", "12345678", 5, time.Minute, t0), Acquired, 2)
	wantOutcome(t, tb.Acquire(b, "k", "x", 0, time.Minute, t0), DeniedInvalid, 0)
	wantOutcome(t, tb.Acquire(b, "k", "x", 1, 0, t0), DeniedInvalid, 0)
	// At the limit a repeated id is still refused as repeated (400), not
	// as over the limit (429): the answer does not depend on the load.
	wantOutcome(t, tb.Acquire(b, "k", "same", 2, time.Minute, t0), DeniedRequestID, 2)
	wantOutcome(t, tb.Acquire(b, "k", "other", 2, time.Minute, t0), DeniedLimit, 2)
}

// A lease never released frees its slot once its time to live has
// passed, not before, and counts as expired unreleased.
func TestLeaseExpiresAfterItsTTLNotBefore(t *testing.T) {
	var clk testclock.Clock
	clk.Set(t0)
	tb := newTable(t, Config{})
	const b = counter.Bucket(3)
	wantOutcome(t, tb.Acquire(b, "k", "r1", 1, 10*time.Second, clk.Now()), Acquired, 1)
	clk.Add(10*time.Second - time.Millisecond)
	tb.Sweep(clk.Now())
	wantOutcome(t, tb.Acquire(b, "k", "r2", 1, 10*time.Second, clk.Now()), DeniedLimit, 1)
	if st := tb.Stats(); st.Expired != 0 {
		t.Fatalf("expired %d before the time to live", st.Expired)
	}
	clk.Add(time.Millisecond)
	// Acquire sweeps a key at its limit once a lease may have expired.
	wantOutcome(t, tb.Acquire(b, "k", "r2", 1, 10*time.Second, clk.Now()), Acquired, 1)
	if st := tb.Stats(); st.Expired != 1 || st.Leases != 1 {
		t.Fatalf("stats %+v, want 1 expired and 1 lease", st)
	}
	// The expired lease's late release frees nothing.
	if tb.Release(b, "k", "r1") {
		t.Fatal("the release of an expired lease freed a slot")
	}
	if l, _ := tb.InFlight(b, "k"); l != 1 {
		t.Fatalf("in flight %d, want 1", l)
	}
}

// When the table is full, acquisitions are denied (fail closed), and
// the slots come back as leases expire or are released.
func TestFullTableFailsClosed(t *testing.T) {
	var clk testclock.Clock
	clk.Set(t0)
	tb := newTable(t, Config{Shards: 1, MaxLeases: 4, MaxKeys: 3})
	const b = counter.Bucket(1)
	for i := range 4 {
		wantOutcome(t, tb.Acquire(b, "k", fmt.Sprint(i), 100, time.Second, clk.Now()), Acquired, int64(i+1))
	}
	wantOutcome(t, tb.Acquire(b, "k", "x", 100, time.Second, clk.Now()), DeniedFull, 0)
	tb.Release(b, "k", "0")
	wantOutcome(t, tb.Acquire(b, "other", "x", 100, time.Second, clk.Now()), Acquired, 1)
	tb.Release(b, "k", "1")
	tb.Release(b, "k", "2")
	wantOutcome(t, tb.Acquire(b, "third", "x", 100, time.Second, clk.Now()), Acquired, 1)
	// Three keys held: a fourth is refused although leases are free.
	wantOutcome(t, tb.Acquire(b, "fourth", "x", 100, time.Second, clk.Now()), DeniedFull, 0)
	clk.Add(time.Second)
	tb.Sweep(clk.Now())
	wantOutcome(t, tb.Acquire(b, "k", "y", 100, time.Second, clk.Now()), Acquired, 1)
	if st := tb.Stats(); st.Expired != 3 || st.DeniedFull != 2 {
		t.Fatalf("stats %+v, want 3 expired, 2 denied full", st)
	}
}

// A flood of distinct request ids and keys without releases stays within
// the bounds, and the table empties once their leases expire.
func TestFloodIsBounded(t *testing.T) {
	var clk testclock.Clock
	clk.Set(t0)
	tb := newTable(t, Config{MaxLeases: 1000, MaxKeys: 200})
	const b = counter.Bucket(1)
	admitted := 0
	for i := range 20000 {
		if tb.Acquire(b, fmt.Sprint("key-", i%500), fmt.Sprint("req-", i), 1<<20, time.Minute, clk.Now()).Allowed() {
			admitted++
		}
	}
	st := tb.Stats()
	// The bounds are per shard (64 shards): a little above is the rounding.
	if st.Leases > 1000+64 || st.Keys > 200+64 || admitted != st.Leases {
		t.Fatalf("after the flood: %+v, %d admitted", st, admitted)
	}
	clk.Add(time.Minute)
	tb.Sweep(clk.Now())
	tb.Changes(nil, t0)
	tb.Sweep(clk.Now())
	if st := tb.Stats(); st.Leases != 0 || st.Keys != 0 || st.Expired != uint64(admitted) {
		t.Fatalf("after expiry: %+v, want empty with %d expired", st, admitted)
	}
}

func TestLongKeysAreDigested(t *testing.T) {
	tb := newTable(t, Config{MaxKeyBytes: 16})
	long := strings.Repeat("k", 10000)
	tb.Acquire(1, long, "r", 2, time.Minute, t0)
	ch := tb.Changes(nil, t0)
	if len(ch) != 1 || len(ch[0].Key) != 33 || ch[0].Key[0] != '#' {
		t.Fatalf("changes %v, want one digested key", ch)
	}
	if l, _ := tb.InFlight(1, long); l != 1 {
		t.Fatalf("in flight %d, want 1", l)
	}
}

func TestPeerGaugesReplaceAndExpire(t *testing.T) {
	var clk testclock.Clock
	clk.Set(t0)
	tb := newTable(t, Config{GaugeExpiry: 3 * time.Second})
	const b = counter.Bucket(1)
	tb.SetPeer(1, b, "k", 3, clk.Now())
	tb.SetPeer(2, b, "k", 1, clk.Now())
	tb.SetPeer(1, b, "k", 2, clk.Now()) // replaces, not adds or maxes
	if _, r := tb.InFlight(b, "k"); r != 3 {
		t.Fatalf("remote %d, want 3", r)
	}
	wantOutcome(t, tb.Acquire(b, "k", "a", 4, time.Minute, clk.Now()), Acquired, 4)
	wantOutcome(t, tb.Acquire(b, "k", "b", 4, time.Minute, clk.Now()), DeniedLimit, 4)
	tb.SetPeer(2, b, "k", 0, clk.Now())
	wantOutcome(t, tb.Acquire(b, "k", "b", 4, time.Minute, clk.Now()), Acquired, 4)
	clk.Add(2 * time.Second)
	tb.SetPeer(1, b, "k", 2, clk.Now()) // repeated: kept alive
	clk.Add(2 * time.Second)
	tb.Sweep(clk.Now())
	if _, r := tb.InFlight(b, "k"); r != 2 {
		t.Fatalf("remote %d after 2 s of silence, want 2", r)
	}
	clk.Add(time.Second)
	tb.Sweep(clk.Now())
	if _, r := tb.InFlight(b, "k"); r != 0 {
		t.Fatalf("remote %d after 3 s of silence, want 0", r)
	}
	if tb.SetPeer(1, b, "k", -1, clk.Now()) {
		t.Fatal("a negative gauge was kept")
	}
}

func TestPeerGaugesBounded(t *testing.T) {
	tb := newTable(t, Config{Shards: 1, MaxKeys: 2, MaxPeersPerKey: 2})
	for p := range uint32(3) {
		ok := tb.SetPeer(p, 1, "k", 1, t0)
		if ok != (p < 2) {
			t.Fatalf("peer %d: SetPeer = %v", p, ok)
		}
	}
	tb.SetPeer(0, 1, "k2", 1, t0)
	if tb.SetPeer(0, 1, "k3", 1, t0) {
		t.Fatal("a third key was kept past MaxKeys")
	}
	if st := tb.Stats(); st.RefusedGauges != 2 {
		t.Fatalf("refused %d, want 2", st.RefusedGauges)
	}
}

func TestChangesReportEachKeyOnceWithItsLatestCount(t *testing.T) {
	tb := newTable(t, Config{})
	tb.Acquire(1, "k", "a", 5, time.Minute, t0)
	tb.Acquire(1, "k", "b", 5, time.Minute, t0)
	tb.Release(1, "k", "a")
	ch := tb.Changes(nil, t0)
	if len(ch) != 1 || ch[0].N != 1 || ch[0].Key != "k" {
		t.Fatalf("changes %+v", ch)
	}
	if ch := tb.Changes(nil, t0); len(ch) != 0 {
		t.Fatalf("changes again %+v", ch)
	}
	tb.Release(1, "k", "b")
	if ch := tb.Changes(nil, t0); len(ch) != 1 || ch[0].N != 0 {
		t.Fatalf("changes after the last release %+v, want k at 0", ch)
	}
	if st := tb.Stats(); st.Keys != 0 {
		t.Fatalf("%d keys held after the last release was reported", st.Keys)
	}
	if all := tb.All(nil); len(all) != 0 {
		t.Fatalf("all %+v", all)
	}
}

// Racing acquisitions on one key admit exactly the limit.
func TestConcurrentAcquireAdmitsExactlyTheLimit(t *testing.T) {
	tb := newTable(t, Config{})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if tb.Acquire(1, "k", fmt.Sprint(g, "-", i), 50, time.Minute, t0).Allowed() {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted.Load(); n != 50 {
		t.Fatalf("admitted %d, want 50", n)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{{Shards: -1}, {MaxLeases: -1}, {Shards: 1 << 17}, {GaugeExpiry: -1}} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("New(%+v) accepted", cfg)
		}
	}
}

func TestAcquireReleaseAllocations(t *testing.T) {
	tb := newTable(t, Config{})
	tb.Acquire(1, "tenant", "warm", 1<<20, time.Minute, t0)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("req-", i)
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		tb.Acquire(1, "tenant", ids[i%1000], 1<<20, time.Minute, t0)
		tb.Release(1, "tenant", ids[i%1000])
		i++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per acquire and release of a known key, want 0", allocs)
	}
}

type hitRecorder struct{ got []string }

func (r *hitRecorder) Hit(bucket counter.Bucket, key string, n int64, allowed bool, window, scaleMS, ms int64) {
	r.got = append(r.got, fmt.Sprintf("%d %s %d %v %d %d", bucket, key, n, allowed, window, scaleMS))
}

// The Observer sees each acquisition admitted or denied by the limit or
// a full table, as one hit without a window; a refused request id and a
// release are not acquisitions.
func TestAcquisitionsObserved(t *testing.T) {
	rec := &hitRecorder{}
	tb := newTable(t, Config{Observer: rec, MaxKeys: 1, Shards: 1})
	const b = counter.Bucket(1)
	tb.Acquire(b, "k", "r1", 1, time.Minute, t0)
	tb.Acquire(b, "k", "r2", 1, time.Minute, t0)     // the limit
	tb.Acquire(b, "k", "r1", 1, time.Minute, t0)     // a repeated id
	tb.Acquire(b, "other", "r3", 1, time.Minute, t0) // no room for a key
	tb.Release(b, "k", "r1")
	want := []string{"1 k 1 true 0 0", "1 k 1 false 0 0", "1 other 1 false 0 0"}
	if !slices.Equal(rec.got, want) {
		t.Errorf("observed %q, want %q", rec.got, want)
	}
}
