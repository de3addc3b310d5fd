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
