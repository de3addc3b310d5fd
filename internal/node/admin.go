package node

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// newSketch is the top-keys sketch the counter reports its decisions to
// when the admin listener is on, its memory exported; nil, recording
// nothing, when it is off.
func newSketch(cfg *admin.Config, reg prometheus.Registerer) (*top.Sketch, error) {
	if cfg == nil {
		return nil, nil
	}
	sk, err := top.New(top.Config{})
	if err != nil {
		return nil, fmt.Errorf("create the top-keys sketch: %w", err)
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "ratelimit_authz", Subsystem: "top", Name: "memory_bytes",
		Help: "Bytes the top-keys sketch holds: fixed per bucket that has had hits, whatever the keys.",
	}, func() float64 { return float64(sk.MemoryBytes()) })); err != nil {
		return nil, fmt.Errorf("register the top-keys metrics: %w", err)
	}
	return sk, nil
}

// newAdmin is the admin listener over the node's sketch and registry; nil
// when it is off.
func (n *Node) newAdmin(sk *top.Sketch) (*admin.Server, error) {
	if n.cfg.Admin == nil {
		return nil, nil
	}
	deps := admin.Deps{Buckets: n.adminBuckets, Sketch: sk, Gatherer: n.reg, State: adminState{n}, InFlight: n.heldNow}
	if n.repl != nil {
		deps.Cluster, deps.Ask = adminCluster(n.repl), adminAsk(n.repl)
	}
	srv, err := admin.New(*n.cfg.Admin, deps, n.log)
	if err != nil {
		return nil, err
	}
	if n.repl != nil {
		n.repl.SetAnswerer(srv.Answer) // peers gather this node's tops
	}
	return srv, nil
}

// heldNow calls f with every key of bucket holding leases on this node.
func (n *Node) heldNow(bucket counter.Bucket, f func(key string, leases int64)) {
	n.leases.Table().EachHeld(bucket, f)
}

// adminAsk asks the cluster's peers a query of the admin listener.
func adminAsk(r *replicate.Replicator) func(context.Context, []byte) ([]admin.PeerAnswer, []string, error) {
	return func(ctx context.Context, q []byte) ([]admin.PeerAnswer, []string, error) {
		answers, missing, err := r.Ask(ctx, q)
		out := make([]admin.PeerAnswer, 0, len(answers))
		for _, a := range answers {
			out = append(out, admin.PeerAnswer{Peer: fmt.Sprintf("%s/%016x", a.Node, a.Incarnation), Body: a.Body})
		}
		var names []string
		for _, p := range missing {
			names = append(names, fmt.Sprintf("%s/%016x", p.Node, p.Incarnation))
		}
		return out, names, err
	}
}

// adminBuckets are the buckets of the configuration served: the rules
// file's, then the RLS rules. A bucket without a limit of its own shows
// its route default, or none (its keys' limits come from elsewhere).
func (n *Node) adminBuckets() []admin.Bucket {
	n.mu.Lock()
	snap := n.cur
	n.mu.Unlock()
	var bs []admin.Bucket
	for i, b := range snap.Rules.Buckets {
		lim := b.Limit
		if !b.HasLimit {
			lim = b.Default
		}
		ab := admin.Bucket{ID: snap.Buckets[i].ID, Name: b.Name, Limit: lim.Limit, WindowMS: lim.ScaleMS, Algorithm: lim.Algorithm, Protocol: "ext_authz"}
		ab.Unit, ab.DeniedUnit = units(&snap.Buckets[i])
		if snap.Buckets[i].Kind == snapshot.InFlight {
			ab.WindowMS = 0 // requests in flight have no window
		}
		bs = append(bs, ab)
	}
	if snap.RLS != nil {
		for i, r := range snap.RLS.Rules() {
			lim, _ := r.Limit()
			ab := admin.Bucket{ID: snap.RLSRules[i].ID, Name: r.Bucket, Limit: lim.Limit, WindowMS: lim.ScaleMS, Algorithm: r.Algorithm, Protocol: "rls", Unit: "hits", DeniedUnit: "hits"}
			switch snap.RLSRules[i].Kind {
			case snapshot.InFlight:
				ab.Unit, ab.DeniedUnit, ab.WindowMS = admin.UnitInFlight, admin.UnitInFlight, 0
			case snapshot.ResponseCost:
				ab.Unit, ab.DeniedUnit = "cost", "requests"
			}
			bs = append(bs, ab)
		}
	}
	return bs
}

// units are what a rules bucket's admitted and denied hits count in the
// live view: acquisitions of a concurrency bucket; a cost taken at the
// check, admitted or denied; a cost or a failure charged from the
// response, and the requests a check refused on it.
func units(b *snapshot.Bucket) (admitted, denied string) {
	switch b.Kind {
	case snapshot.InFlight:
		return admin.UnitInFlight, admin.UnitInFlight
	case snapshot.Failures:
		return "failures", "requests"
	case snapshot.Requests:
		return "requests", "requests"
	}
	u := b.Cost.QuotaUnit()
	if u == "" {
		u = "cost"
	}
	if b.Kind.AfterResponse() {
		return u, "requests"
	}
	return u, u
}

// adminCluster is the replicator's view of the cluster, for the status
// page.
func adminCluster(r *replicate.Replicator) func() admin.Cluster {
	return func() admin.Cluster {
		id, inc := r.Identity()
		c := admin.Cluster{Self: fmt.Sprintf("%s/%016x", id, inc), Sealed: r.Sealed()}
		for _, p := range r.Peers() {
			c.Peers = append(c.Peers, admin.Peer{Node: p.Node, Incarnation: p.Incarnation, LastHeard: p.LastHeard, DelayMS: p.DelayMS, SkewMS: p.SkewMS, RoundTripMS: p.RoundTripMS})
		}
		return c
	}
}

// adminState is the node's configuration and overrides as the status
// page reads them: it takes neither the reload lock nor a database
// connection.
type adminState struct{ n *Node }

var _ admin.State = adminState{}

func (a adminState) Config() admin.ConfigState {
	gen, applied, last := a.n.reloads.state()
	c := admin.ConfigState{Generation: gen, Applied: applied}
	if last != nil {
		c.Last = &admin.Reload{At: last.at}
		if last.err != nil {
			c.Last.Err = last.err.Error()
			if ps, ok := problem.As(last.err); ok {
				for _, p := range ps {
					c.Last.Problems = append(c.Last.Problems, p.String())
				}
			}
		}
	}
	return c
}

func (a adminState) Overrides() admin.OverridesState {
	// The cache's line names what it describes first; the page names it
	// once.
	c := a.n.overrides
	if c == nil {
		return admin.OverridesState{Source: "off", Detail: "no database URL: the configured limits only"}
	}
	return admin.OverridesState{Source: c.SourceName(), Detail: strings.TrimPrefix(c.State(), "overrides: ")}
}
