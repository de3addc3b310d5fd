package monitoring_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/promqltest"

	"github.com/ratelimit-authz/ratelimit-authz/internal/netfault"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// alertExpr is the expression of the shipped alert name.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r.Expr
			}
		}
	}
	t.Fatalf("no alert %s", name)
	return ""
}

// TestNATSDisconnectedFiresOnASilentCut: a real node whose link to a real
// nats-server drops every packet without a reset reads
// replicate_connected 0 within five seconds, its /metrics answers within
// a second throughout, and the shipped RatelimitAuthzNATSDisconnected
// expression, evaluated by Prometheus's engine over what was scraped,
// selects the node during the cut and not before it; after the heal the
// node is connected again.
func TestNATSDisconnectedFiresOnASilentCut(t *testing.T) {
	nats := testnats.StartProcess(t)
	relay := netfault.Start(t, nats.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addrs, node := startNode(ctx, t, "RATELIMIT_AUTHZ_NODE_ID=a", "NATS_URL="+relay.URL())
	client := &http.Client{Timeout: time.Second}
	// connected is scraped every step; each scrape must answer within a
	// second.
	const step = 500 * time.Millisecond
	var values []string
	connected := func() float64 {
		t.Helper()
		start := time.Now()
		s, err := scrape.Get(client, "http://"+addrs[1]+"/metrics")
		if err != nil {
			t.Fatalf("a scrape %v into the test: %v\n%s", time.Since(start), err, node.Tail(20))
		}
		v, ok := s.Get("ratelimit_authz_replicate_connected")
		if !ok {
			t.Fatal("no replicate_connected")
		}
		values = append(values, fmt.Sprint(v))
		time.Sleep(time.Until(start.Add(step)))
		return v
	}
	for connected() != 1 {
		if len(values) > 20 {
			t.Fatal("not connected to NATS through the relay")
		}
	}
	before := len(values) - 1
	relay.Set(netfault.Faults{Cut: true})
	cutAt := len(values)
	for connected() != 0 {
		if len(values)-cutAt > 10 {
			t.Fatalf("connected still 1 %v into a silent cut\n%s", time.Duration(len(values)-cutAt)*step, node.Tail(20))
		}
	}
	noticed := len(values) - 1
	t.Logf("the cut noticed within %v", time.Duration(noticed-cutAt+1)*step)
	for range 4 {
		connected()
	}
	relay.Set(netfault.Faults{})
	healAt := len(values)
	for connected() != 1 {
		if len(values)-healAt > 40 {
			t.Fatalf("not connected again %v after the heal\n%s", time.Duration(len(values)-healAt)*step, node.Tail(20))
		}
	}

	// What Prometheus would have stored, one sample a step.
	series := `ratelimit_authz_replicate_connected{job="ratelimit-authz",instance="a"}`
	storage := promqltest.LoadedStorage(t, fmt.Sprintf("load %v\n  %s %s\n", step, series, strings.Join(values, " ")))
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	expr := alertExpr(t, "RatelimitAuthzNATSDisconnected")
	fires := func(i int) bool {
		t.Helper()
		q, err := engine.NewInstantQuery(ctx, storage, nil, expr, time.Unix(0, 0).Add(time.Duration(i)*step))
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		r := q.Exec(ctx)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		v, err := r.Vector()
		if err != nil {
			t.Fatal(err)
		}
		return len(v) > 0
	}
	if fires(before) {
		t.Errorf("%s selects the node while it is connected", expr)
	}
	if !fires(noticed + 2) {
		t.Errorf("%s does not select the node during the cut (samples %v)", expr, values)
	}
}
