package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// clusterSync is the sync interval of the cluster scenarios' nodes.
const clusterSync = 100 * time.Millisecond

// errNoNATS: scripts/install-nats.sh could not provide nats-server.
var errNoNATS = errors.New("nats-server not available")

// clusterHarness is the nodes of a cluster scenario: ratelimit-authz
// serve --backend cluster, each a process of this run, on one nats-server
// that the scenario may stop and start again on the same address.
type clusterHarness struct {
	r        *runner
	name     string   // prefix of the process names
	natsArgs []string // to start nats-server again as it was
	natsMon  string   // its monitoring address (/healthz)
	natsURL  string
	nats     *proc
	restarts int
	nodes    []*server // named by node id
}

// startCluster installs nats-server (when this run has not yet), starts
// it and n nodes on it with config and sync interval, and waits until all
// are ready. The caller stops the harness.
func (r *runner) startCluster(ctx context.Context, name string, n int, config string, sync time.Duration) (*clusterHarness, error) {
	if _, err := r.natsServerBin(ctx); err != nil {
		return nil, err
	}
	addrs, err := freeport.Addrs(2)
	if err != nil {
		return nil, err
	}
	_, natsPort, _ := net.SplitHostPort(addrs[0])
	_, monPort, _ := net.SplitHostPort(addrs[1])
	h := &clusterHarness{r: r, name: name, natsArgs: []string{"-a", "127.0.0.1", "-p", natsPort, "-m", monPort},
		natsMon: addrs[1], natsURL: "nats://" + addrs[0]}
	if err := h.startNATS(ctx); err != nil {
		return nil, err
	}
	for i := range n {
		id := fmt.Sprintf("%s-node%d", name, i+1)
		node, err := r.startCheckServer(ctx, id, config, nil,
			"--backend", "cluster", "--nats-url", h.natsURL, "--sync-interval", sync.String(), "--node-id", id)
		if err != nil {
			h.stop()
			return nil, err
		}
		h.nodes = append(h.nodes, node)
	}
	return h, nil
}

// startNATS starts nats-server on the harness's address and waits until
// it is healthy.
func (h *clusterHarness) startNATS(ctx context.Context) error {
	name := h.name + "-nats"
	if h.restarts > 0 {
		name += fmt.Sprintf("-restart%d", h.restarts)
	}
	h.restarts++
	p, err := h.r.start(name, h.r.lifetime(), nil, h.r.bins.nats, h.natsArgs...)
	if err != nil {
		return err
	}
	h.nats = p
	return waitHTTP200(ctx, p, "http://"+h.natsMon+"/healthz", 20*time.Second)
}

// stopNATS stops nats-server (SIGTERM by PID) and waits for it.
func (h *clusterHarness) stopNATS() {
	if h.nats != nil {
		h.nats.stop()
		h.nats = nil
	}
}

// stop stops the nodes and nats-server.
func (h *clusterHarness) stop() {
	for _, n := range h.nodes {
		n.stop()
	}
	h.stopNATS()
}

// metric sums a metric of every node, in node order; an error if a node
// cannot be read.
func (h *clusterHarness) metric(name string) ([]float64, error) {
	var out []float64
	for _, n := range h.nodes {
		mt, err := scrape.Get(httpClient, "http://"+n.http+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.name, err)
		}
		out = append(out, mt.Sum(name))
	}
	return out, nil
}

// load is one run of the load tool: its name and arguments.
type load struct {
	name string
	args []string
}

// loadsAtOnce starts the loads together just after a 1 s window boundary,
// so that their first window is nearly whole; wait waits for them and
// returns their runs in order, or the first error.
func (r *runner) loadsAtOnce(ctx context.Context, budget time.Duration, loads []load) (wait func() ([]*loadRun, error)) {
	cli.Sleep(ctx, time.Until(nextBoundary(time.Now(), time.Second).Add(50*time.Millisecond)))
	runs := make([]*loadRun, len(loads))
	errs := make([]error, len(loads))
	var wg sync.WaitGroup
	for i, l := range loads {
		wg.Go(func() {
			if runs[i], errs[i] = r.load(ctx, l.name, budget, l.args...); errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", l.name, errs[i])
			}
		})
	}
	return func() ([]*loadRun, error) {
		wg.Wait()
		return runs, errors.Join(errs...)
	}
}
