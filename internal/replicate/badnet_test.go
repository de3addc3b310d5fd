package replicate

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
// while no node holds a count of it, 1.7× at 20% loss; 1.1× after, 1.2×
// at 20% loss, where one peer's report arrives at once and another's
// 400 ms later, and the nodes split by different weights meanwhile), the
// first window after a step in the delay included.
func TestSharesHoldOnABadNetwork(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name          string
		before, after netfault.Faults // the faults of the first windows, and from the step on
		first         int64           // the most the key's first full window may admit
		bound         int64           // the most a later window may admit
	}{
		{"250ms one way", netfault.Faults{Delay: 250 * ms}, netfault.Faults{Delay: 250 * ms}, 152, 110},
		{"a step from 0 to 100ms", netfault.Faults{}, netfault.Faults{Delay: 100 * ms}, 152, 110},
		{"a step from 0 to 250ms", netfault.Faults{}, netfault.Faults{Delay: 250 * ms}, 152, 110},
		{"20% loss", netfault.Faults{Delay: 5 * ms, Loss: 0.2}, netfault.Faults{Delay: 5 * ms, Loss: 0.2}, 170, 120},
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
			// The probes' first echoes: the delay the nodes work with.
			time.Sleep(time.Second)
			lim := counter.Limit{Limit: 100, ScaleMS: 1000}
			stop := make(chan struct{})
			wait := overload(nodes, "k", lim, 333, stop) // ten times the limit in all
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(2 * time.Second)))
			stepAt := counter.WindowOf(time.Now().UnixMilli(), lim.ScaleMS)
			for _, r := range relays {
				r.Set(tc.after)
			}
			time.Sleep(3 * time.Second)
			close(stop)
			per := wait()
			var line []string
			over := 0
			for w := stepAt - 1; w < stepAt+3; w++ {
				line = append(line, fmt.Sprint(per[w]))
				// The key's first full window (its second: the load
				// began within the one before): 1.5× while no node holds
				// a count of it, plus one per node for a share split by
				// weights, which each node rounds up; on a lossy link
				// more (docs/design/replication.md).
				if w == stepAt-1 && per[w] > tc.first || w > stepAt-1 && per[w] > tc.bound {
					over++
				}
			}
			delay, _ := gaugeOf(t, nodes[0].reg, "ratelimit_authz_replicate_share_delay_seconds")
			t.Logf("admitted per window at 10× (limit 100), the step at the second: %s; share delay %.3fs", strings.Join(line, " "), delay)
			if over > 0 {
				t.Errorf("%d of %d windows admitted over the bound (%d in the first, %d after)", over, len(line), tc.first, tc.bound)
			}
		})
	}
}

// TestProbesTimeTheLinkNotTheClock: a peer 100 ms from NATS (its link
// delayed each way) is 200 ms away as its probes' round trip, while its
// batches arrive 100 ms old: the clock skew reads about 0 and the share
// delay about the early gap plus 200 ms. Probes never reach an Answerer.
func TestProbesTimeTheLinkNotTheClock(t *testing.T) {
	srv := testnats.Run(t)
	relay := netfault.Start(t, srv.Addr().String())
	relay.Set(netfault.Faults{Delay: 100 * time.Millisecond})
	a := startLive(t, relay.URL(), "a", Config{}, nodeOpts{})
	b := startLive(t, srv.ClientURL(), "b", Config{}, nodeOpts{})
	var asked atomic.Int64
	a.r.SetAnswerer(func(q []byte) []byte { asked.Add(1); return q })
	a.waitReady(t)
	b.waitReady(t)
	var info PeerInfo
	poll.Until(t, waitLong, step, func() error {
		ps := b.r.Peers()
		if len(ps) != 1 || ps[0].RoundTripMS < 0 || ps[0].DelayMS < 90 {
			return fmt.Errorf("b's peers: %+v", ps)
		}
		info = ps[0]
		return nil
	})
	if info.RoundTripMS < 200 || info.RoundTripMS > 400 {
		t.Errorf("round trip to a %d ms, want 200 to 400 (100 ms each way, twice)", info.RoundTripMS)
	}
	if info.SkewMS < -50 || info.SkewMS > 50 {
		t.Errorf("a's clock skew %d ms with one clock (its batches arrive %d ms old)", info.SkewMS, info.DelayMS)
	}
	poll.Until(t, waitLong, step, func() error { // set at b's next tick
		if d, _ := gaugeOf(t, b.reg, "ratelimit_authz_replicate_share_delay_seconds"); d < 0.2 || d > 0.45 {
			return fmt.Errorf("b's share delay %vs, want the early gap plus 200 to 400 ms", d)
		}
		return nil
	})
	if n := asked.Load(); n != 0 {
		t.Errorf("a's Answerer was asked %d probes", n)
	}
}

// TestSilentCutUnderLoad: three nodes at ten times a key's limit; one
// node's link is cut silently for 6 s. The cut node notices within four
// pings and limits on its own counts (the documented fail-open: the
// cluster admits up to twice the limit while it is cut), the others split
// the budget between the two of them once it is silent; after the heal
// the first full window is back within the bound.
func TestSilentCutUnderLoad(t *testing.T) {
	srv := testnats.Run(t)
	var nodes []*live
	var relays []*netfault.Relay
	for _, id := range []string{"a", "b", "c"} {
		relay := netfault.Start(t, srv.Addr().String())
		relays = append(relays, relay)
		nodes = append(nodes, startLive(t, relay.URL(), id, Config{}, nodeOpts{}))
	}
	for _, n := range nodes {
		n.waitReady(t)
	}
	lim := counter.Limit{Limit: 100, ScaleMS: 1000}
	stop := make(chan struct{})
	wait := overload(nodes, "k", lim, 333, stop)
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(2 * time.Second)))
	cutAt := counter.WindowOf(time.Now().UnixMilli(), lim.ScaleMS)
	relays[0].Set(netfault.Faults{Cut: true})
	time.Sleep(6 * time.Second)
	relays[0].Set(netfault.Faults{})
	healAt := counter.WindowOf(time.Now().UnixMilli(), lim.ScaleMS)
	time.Sleep(3 * time.Second)
	close(stop)
	per := wait()
	var line []string
	for w := cutAt - 1; w <= healAt+2; w++ {
		line = append(line, fmt.Sprint(per[w]))
		switch {
		case w < cutAt || w > healAt+1:
			if per[w] > 110 {
				t.Errorf("window %d (cut at %d, healed in %d) admitted %d, over 110", w, cutAt, healAt, per[w])
			}
		case per[w] > 210: // the cut node's own limit, the other two's
			t.Errorf("window %d of the cut admitted %d, over 210", w, per[w])
		}
	}
	t.Logf("admitted per window at 10× (limit 100) from the window before the cut to 2 after the heal: %s", strings.Join(line, " "))
}

// TestHostileEchoes: an echo counts only when it is one of this process's
// probes, sent within MaxClockSkew, from a peer known from its batches:
// another body, a send time in the future or of long ago, a send time
// beyond int64, or an unknown sender changes nothing and adds no peer.
func TestHostileEchoes(t *testing.T) {
	a := newNode(t, "a", Config{})
	a.r.probe.epoch = time.Now().Add(-time.Minute)
	a.r.peers.get("b", 7, a.now, true)
	echo := func(node string, inc uint64, body []byte) {
		t.Helper()
		m := message{header: header{Kind: kindAnswer, Node: node, Incarnation: inc, SentAtMS: a.now.UnixMilli()}, Body: string(body)}
		a.r.onEcho(&nats.Msg{Data: m.encode(nil)})
	}
	probe := func(sent uint64) []byte {
		b := append([]byte(probeMarker), make([]byte, 8)...)
		binary.LittleEndian.PutUint64(b[len(probeMarker):], sent)
		return b
	}
	since := uint64(time.Since(a.r.probe.epoch))
	for name, body := range map[string][]byte{
		"not a probe":  []byte(`{"query":1}`),
		"short":        []byte(probeMarker + "1234"),
		"future":       probe(since + uint64(time.Hour)),
		"long ago":     probe(0), // a minute old, past MaxClockSkew
		"beyond int64": probe(math.MaxUint64),
	} {
		echo("b", 7, body)
		if got := a.r.Peers()[0].RoundTripMS; got != -1 {
			t.Errorf("%s: round trip %d ms, want none", name, got)
		}
	}
	echo("mallory", 1, probe(since-uint64(50*time.Millisecond)))
	if ps := a.r.Peers(); len(ps) != 1 {
		t.Errorf("an echo from an unknown node added a peer: %+v", ps)
	}
	echo("b", 7, probe(since-uint64(50*time.Millisecond)))
	if got := a.r.Peers()[0].RoundTripMS; got < 50 || got > 1000 {
		t.Errorf("a real echo: round trip %d ms, want about 50", got)
	}
}
