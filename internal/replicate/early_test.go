package replicate

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// slowTicks is a sync interval no test waits for: whatever a peer learns
// within it came from an early batch (or the warm start, which these tests
// keep out of the way).
const slowTicks = 5 * time.Second

// tickFar sets cfg's clock to the real one shifted to just past a tick,
// so that the first tick is a whole SyncInterval away, and returns the
// (real) time it will fire at the earliest.
func tickFar(cfg *Config) (tickAt time.Time) {
	start := time.Now()
	shift := untilTick(start, cfg.SyncInterval)
	cfg.Now = func() time.Time { return time.Now().Add(shift) }
	return start.Add(cfg.SyncInterval)
}

// startUnticked starts nodes a and b with cfg, both ticking far in the
// future (a's first tick at tickAt), and waits until both are ready: what
// crosses between them is only what early batches publish. b's ticks are
// moved too: a tick would split b's budget with a (heard from since it
// answered b's warm start), and these tests count on b's view alone.
func startUnticked(t *testing.T, url string, cfg Config) (a, b *live, tickAt time.Time) {
	t.Helper()
	aCfg, bCfg := cfg, cfg
	tickAt = tickFar(&aCfg)
	tickFar(&bCfg)
	a = startLive(t, url, "a", aCfg, nodeOpts{})
	b = startLive(t, url, "b", bCfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	return a, b, tickAt
}

func TestClusterEarlyBatchNearLimit(t *testing.T) {
	srv := testnats.Run(t)
	cfg := Config{SyncInterval: slowTicks, WarmStartTimeout: 200 * time.Millisecond}
	a, b, tickAt := startUnticked(t, srv.ClientURL(), cfg)

	lim := counter.Limit{Limit: 10, ScaleMS: counter.MaxScaleMS} // near: 5 left
	count := func(n *live) int64 {
		_, tot := counts(n.store, 0, "acme", lim, time.Now())
		return tot
	}
	for range 4 { // 6 left: not near
		if !a.store.Take(0, "acme", lim, time.Now()).Allowed {
			t.Fatal("denied under the limit")
		}
	}
	if p := a.store.Pending(); p != 1 {
		t.Fatalf("%d keys pending after hits short of the margin, want 1 (no early batch)", p)
	}
	if !a.store.Take(0, "acme", lim, time.Now()).Allowed { // 5 left: near
		t.Fatal("denied under the limit")
	}
	if d := time.Until(tickAt); d < 100*time.Millisecond {
		t.Fatalf("setup left only %v before a's first tick", d)
	}
	poll.Until(t, time.Until(tickAt), step, func() error {
		if got := count(b); got != 5 {
			return fmt.Errorf("b sees %d of a's 5 hits", got)
		}
		return nil
	})
	if !time.Now().Before(tickAt) {
		t.Fatal("b learned the count only once a's tick could have sent it")
	}
	early, sent := metric(t, a.r.m.earlyBatches), metric(t, a.r.m.batchesSent)
	if early != 1 || sent != 1 {
		t.Errorf("a sent %v batches, %v of them early; want the one early batch", sent, early)
	}
	// b's view is current: the rest of the budget is b's, and a learns it
	// from b's early batches (b's ticks are not held off: no deadline).
	for range 5 {
		if !b.store.Take(0, "acme", lim, time.Now()).Allowed {
			t.Fatal("b denied a hit of the budget")
		}
	}
	if b.store.Take(0, "acme", lim, time.Now()).Allowed {
		t.Fatal("b admitted over the cluster limit")
	}
	poll.Until(t, waitLong, step, func() error {
		if got := count(a); got != 10 {
			return fmt.Errorf("a sees %d of 10 hits", got)
		}
		return nil
	})
	if a.store.Take(0, "acme", lim, time.Now()).Allowed {
		t.Error("a admitted over the cluster limit")
	}
}

// Under a flood of hits near their limits, early batches go out at most
// once per EarlyGap, not once per hit.
func TestClusterEarlyBatchesBoundedByGap(t *testing.T) {
	srv := testnats.Run(t)
	watch, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var fromA atomic.Int64
	if _, err := watch.Subscribe("ratelimit.batch", func(m *nats.Msg) {
		var msg message
		if decode(m.Data, &msg) == nil && msg.Node == "a" {
			fromA.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	const gap = 50 * time.Millisecond
	cfg := Config{SyncInterval: slowTicks, EarlyGap: gap, WarmStartTimeout: 200 * time.Millisecond}
	tickFar(&cfg)
	a := startLive(t, srv.ClientURL(), "a", cfg, nodeOpts{})
	a.waitReady(t)

	// 1000 keys, each within its near-limit margin, so every hit signals.
	lim := counter.Limit{Limit: counter.MaxLimitFor(counter.MaxScaleMS), ScaleMS: counter.MaxScaleMS}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		a.store.Incr(0, keys[i], lim, lim.Limit-lim.Limit/2, time.Now())
	}
	start := time.Now()
	var hits atomic.Int64
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := g; time.Since(start) < 10*gap; i++ {
				if !a.store.Take(0, keys[i%len(keys)], lim, time.Now()).Allowed {
					t.Error("denied within the margin")
					return
				}
				hits.Add(1)
			}
		})
	}
	wg.Wait()
	a.stop(t) // the final batch
	elapsed := time.Since(start)
	watch.Flush()

	early := metric(t, a.r.m.earlyBatches)
	maxEarly := float64(elapsed/gap) + 1
	if early < 2 || early > maxEarly {
		t.Errorf("%v early batches in %v for %d hits near the limit; want 2..%v (one per %v)",
			early, elapsed.Round(time.Millisecond), hits.Load(), maxEarly, gap)
	}
	// Every message of a: the early ones, ticks (a whole interval away) and
	// the final batch.
	maxAll := int64(maxEarly) + int64(elapsed/slowTicks) + 2
	poll.Until(t, waitLong, step, func() error {
		if got := int64(metric(t, a.r.m.batchesSent)); fromA.Load() < got {
			return fmt.Errorf("watcher got %d of a's %d batches", fromA.Load(), got)
		}
		return nil
	})
	if got := fromA.Load(); got > maxAll {
		t.Errorf("a published %d batches in %v; want at most %d", got, elapsed.Round(time.Millisecond), maxAll)
	}
	t.Logf("%d hits near the limit in %v: %v early batches, %d batches in all", hits.Load(), elapsed.Round(time.Millisecond), early, fromA.Load())
}

// A charge that spends a key's budget is published at once, within the
// early gap of the batch before it: the peers, which only peek at such a
// key, deny once they hear of it.
func TestClusterChargeThatSpendsIsPublishedAtOnce(t *testing.T) {
	srv := testnats.Run(t)
	const gap = 400 * time.Millisecond
	cfg := Config{SyncInterval: slowTicks, EarlyGap: gap, WarmStartTimeout: 200 * time.Millisecond}
	a, b, tickAt := startUnticked(t, srv.ClientURL(), cfg)

	lim := counter.Limit{Limit: 10, ScaleMS: counter.MaxScaleMS}
	seen := func(want int64) func() error {
		return func() error {
			if got := b.store.Peek(0, "acme", lim, time.Now()).Count; got != want {
				return fmt.Errorf("b sees %d of a's %d", got, want)
			}
			return nil
		}
	}
	a.store.Incr(0, "acme", lim, 5, time.Now()) // half the limit: an early batch, and the gap starts
	poll.Until(t, gap, step, seen(5))
	charged := time.Now()
	a.store.Incr(0, "acme", lim, 5, charged) // spends it, within the gap
	poll.Until(t, gap, step, seen(10))
	if took := time.Since(charged); took >= gap/2 {
		t.Errorf("b heard of the charge that spent the budget after %v, the early gap being %v", took, gap)
	}
	if !time.Now().Before(tickAt) {
		t.Fatal("a's tick could have sent it")
	}
	if b.store.Peek(0, "acme", lim, time.Now()).Allowed {
		t.Error("b still admits")
	}
	if early := metric(t, a.r.m.earlyBatches); early != 2 {
		t.Errorf("a sent %v early batches, want 2", early)
	}
}
