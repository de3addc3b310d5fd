package replicate

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/netfault"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// gaugeOf is the value of the unlabelled metric name in reg, and how long
// gathering every metric took.
func gaugeOf(t testing.TB, reg prometheus.Gatherer, name string) (float64, time.Duration) {
	t.Helper()
	start := time.Now()
	mfs, err := reg.Gather()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		switch mf.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), took
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), took
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, took
}

// TestSilentCutIsNoticed: a node whose link to NATS drops every packet
// without a reset, while it publishes enough to fill the link's buffers,
// reads connected 0 and splits no budget within pingsOut + 2 pings, logs
// the disconnection once, and its metrics answer within a second
// throughout; once the link heals it reconnects and its peer hears from it
// again.
func TestSilentCutIsNoticed(t *testing.T) {
	srv := testnats.Run(t)
	relay := netfault.Start(t, srv.Addr().String())
	cfg := Config{PingInterval: 250 * time.Millisecond, Heartbeat: 250 * time.Millisecond}
	logs := &logbuf.Buffer{}
	a := startLive(t, relay.URL(), "a", cfg, nodeOpts{logs: logs})
	b := startLive(t, srv.ClientURL(), "b", cfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	poll.Until(t, waitLong, step, func() error {
		if n, _ := gaugeOf(t, a.reg, "ratelimit_authz_replicate_share_nodes"); n != 2 {
			return fmt.Errorf("a splits between %v nodes", n)
		}
		return nil
	})

	// a keeps publishing: one new key of limit 1 after another, each
	// near its limit at once.
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Add(1)
	go func() {
		defer load.Done()
		one := counter.Limit{Limit: 1, ScaleMS: long.ScaleMS}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a.store.Take(0, fmt.Sprintf("key-%d-%s", i, strings.Repeat("x", 200)), one, time.Now())
			if i%100 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	// The scrape, every 20 ms, timed.
	var slowest atomic.Int64
	scrapes := make(chan struct{})
	go func() {
		defer close(scrapes)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, took := gaugeOf(t, a.reg, "ratelimit_authz_replicate_connected")
			if int64(took) > slowest.Load() {
				slowest.Store(int64(took))
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	relay.Set(netfault.Faults{Cut: true})
	cut := time.Now()
	bound := time.Duration(pingsOut+2) * cfg.PingInterval
	poll.Until(t, waitLong, step, func() error {
		if c, _ := gaugeOf(t, a.reg, "ratelimit_authz_replicate_connected"); c != 0 {
			return fmt.Errorf("a reads connected %v %v into the cut", c, time.Since(cut))
		}
		if n, _ := gaugeOf(t, a.reg, "ratelimit_authz_replicate_share_nodes"); n != 1 {
			return fmt.Errorf("a splits between %v nodes", n)
		}
		return nil
	})
	noticed := time.Since(cut)
	t.Logf("a silent cut noticed after %v (bound %v, pings %v apart)", noticed, bound, cfg.PingInterval)
	if noticed > bound+cfg.PingInterval { // the poll's own step and the handlers' goroutine
		t.Errorf("the cut was noticed after %v, want within %v", noticed, bound)
	}
	time.Sleep(2 * bound) // the cut goes on: reconnects fail, nothing is logged again
	relay.Set(netfault.Faults{})
	poll.Until(t, waitLong, step, func() error {
		if c, _ := gaugeOf(t, a.reg, "ratelimit_authz_replicate_connected"); c != 1 {
			return fmt.Errorf("a reads connected %v after the heal", c)
		}
		if n, _ := gaugeOf(t, b.reg, "ratelimit_authz_replicate_share_nodes"); n != 2 {
			return fmt.Errorf("b splits between %v nodes after the heal", n)
		}
		return nil
	})
	close(stop)
	load.Wait()
	<-scrapes
	if s := time.Duration(slowest.Load()); s > time.Second {
		t.Errorf("a scrape of a took %v", s)
	} else {
		t.Logf("slowest scrape %v", s)
	}
	if n := strings.Count(logs.String(), "disconnected from NATS"); n != 1 {
		t.Errorf("the disconnection was logged %d times, want once:\n%s", n, logs)
	}
	if r, _ := gaugeOf(t, a.reg, "ratelimit_authz_replicate_reconnects_total"); r < 1 {
		t.Errorf("reconnects_total %v after the heal", r)
	}
}

// TestSharesHoldOnABadNetwork: three nodes, each behind a link to NATS
// that delays, jitters or loses packets (TCP retransmits them: they
// arrive late), one key offered at ten times its limit spread over them:
// every full window admits within the bound (1.5× in the key's first,
// while no node holds a count of it; 1.1× after), the first window after
// a step in the delay included.
func TestSharesHoldOnABadNetwork(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name          string
		before, after netfault.Faults // the faults of the first windows, and from the step on
	}{
		{"250ms one way", netfault.Faults{Delay: 250 * ms}, netfault.Faults{Delay: 250 * ms}},
		{"a step from 0 to 100ms", netfault.Faults{}, netfault.Faults{Delay: 100 * ms}},
		{"20% loss", netfault.Faults{Delay: 5 * ms, Loss: 0.2}, netfault.Faults{Delay: 5 * ms, Loss: 0.2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testnats.Run(t)
			var nodes []*live
			var relays []*netfault.Relay
			for _, id := range []string{"a", "b", "c"} {
				relay := netfault.Start(t, srv.Addr().String())
				relay.Set(tc.before)
				relays = append(relays, relay)
				nodes = append(nodes, startLive(t, relay.URL(), id, Config{}, nodeOpts{}))
			}
			for _, n := range nodes {
				n.waitReady(t)
			}
			poll.Until(t, waitLong, step, func() error {
				for _, n := range nodes {
					if v, _ := gaugeOf(t, n.reg, "ratelimit_authz_replicate_share_nodes"); v != 3 {
						return fmt.Errorf("%s splits between %v nodes", n.id, v)
					}
				}
				return nil
			})
			lim := counter.Limit{Limit: 100, ScaleMS: 1000}
			stop := make(chan struct{})
			wait := overload(nodes, "k", lim, 333, stop) // ten times the limit in all
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(3 * time.Second)))
			stepAt := counter.WindowOf(time.Now().UnixMilli(), lim.ScaleMS)
			for _, r := range relays {
				r.Set(tc.after)
			}
			time.Sleep(4 * time.Second)
			close(stop)
			per := wait()
			var line []string
			over := 0
			for w := stepAt - 2; w < stepAt+4; w++ {
				line = append(line, fmt.Sprint(per[w]))
				// The key's first full window: 1.5× while no node holds
				// a count of it (docs/design/budget-shares.md).
				if bound := int64(110); per[w] > bound && (w > stepAt-2 || per[w] > 150) {
					over++
				}
			}
			delay, _ := gaugeOf(t, nodes[0].reg, "ratelimit_authz_replicate_share_delay_seconds")
			t.Logf("admitted per window at 10× (limit 100), the step at the third: %s; share delay %.3fs", strings.Join(line, " "), delay)
			if over > 0 {
				t.Errorf("%d of %d windows admitted over 110", over, len(line))
			}
		})
	}
}
