package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// Cluster scenario shape.
const (
	clusterNodes = 3
	// clusterLimit per 1 s window. The overshoot is a matter of how much of
	// the limit arrives within one sync interval, which depends on the
	// multiple, not on the limit itself; 20/s keeps 100× (2000/s per key)
	// affordable on two cores.
	clusterLimit = 20
	clusterSync  = 100 * time.Millisecond
)

var clusterMultiples = []int{2, 10, 100}

func (r *runner) clusterEstimate() time.Duration {
	return time.Duration(r.opt.clusterWin+5)*time.Second + 6*time.Second
}

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
	if r.bins.nats == "" {
		out, err := r.runTool(ctx, "install-nats", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-nats.sh"))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errNoNATS, err)
		}
		r.bins.nats = lastLine(out)
		if v, err := commandOutput(ctx, r.root, r.bins.nats, "--version"); err == nil {
			r.res.Env.NATSVersion = v
		}
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

func (h *clusterHarness) targets() []string {
	var out []string
	for _, n := range h.nodes {
		out = append(out, n.grpc)
	}
	return out
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

// cluster is scenario 3: three nodes on one NATS, each key offered 2×, 10×
// and 100× its limit, spread evenly over the nodes; what is admitted per
// window, fixed and sliding. The six (algorithm, multiple) loads run at
// once, each on its own key.
func (r *runner) cluster(ctx context.Context) error {
	c := &Cluster{Nodes: clusterNodes, Limit: clusterLimit, WindowMS: 1000, SyncInterval: clusterSync.String()}
	r.res.Cluster = c
	cfg := filepath.Join(r.tmp, "cluster.yaml")
	if err := writeClusterConfig(cfg, clusterLimit); err != nil {
		return err
	}
	h, err := r.startCluster(ctx, "s3", clusterNodes, cfg, clusterSync)
	if err != nil {
		if errors.Is(err, errNoNATS) {
			c.Skipped = err.Error()
		}
		return err
	}
	defer h.stop()
	nodes := h.targets()

	// A warm-up second first: six load processes starting at once on two
	// cores fall behind schedule and catch up in a burst, which is not
	// the steady offered load the rows are about.
	const warmup = 1500 * time.Millisecond
	dur := time.Duration(c.WindowMS*int64(r.opt.clusterWin+2))*time.Millisecond + 500*time.Millisecond
	var loads []load
	for _, alg := range []string{"fixed", "sliding"} {
		for _, m := range clusterMultiples {
			rate := m * clusterLimit
			conc := max(4, rate/250) // ~1 ms per check: room for slow answers
			loads = append(loads, load{fmt.Sprintf("s3-%s-x%d", alg, m), []string{"check", "--target", strings.Join(nodes, ","),
				"--connections", strconv.Itoa(clusterNodes), "--routes", clusterRoutes[alg], "--keys", "uniform", "--tenants", "1",
				"--key-prefix", fmt.Sprintf("%s-x%d-", alg, m), "--rate", strconv.Itoa(rate), "--concurrency", strconv.Itoa(conc),
				"--duration", dur.String(), "--warmup", warmup.String(), "--timeout", "1s", "--window", "1s"}})
		}
	}
	runs, err := r.loadsAtOnce(ctx, dur+warmup, loads)()
	if err != nil {
		return err
	}
	for i, alg := range []string{"fixed", "sliding"} {
		for j, m := range clusterMultiples {
			c.Rows = append(c.Rows, clusterRow(alg, m, runs[i*len(clusterMultiples)+j], r.opt.clusterWin))
		}
	}
	return nil
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

// clusterRow summarises one load: the whole windows (the first and last,
// partial, dropped), at most want of them.
func clusterRow(alg string, mult int, res *loadRun, want int) ClusterRow {
	row := ClusterRow{Algorithm: alg, Multiple: mult, OfferedRPS: float64(mult * clusterLimit), AchievedRPS: round1(res.RPS),
		Errors: res.Errors, MaxInSpan: res.MaxInSpan}
	ws := res.Windows
	if len(ws) > 2 {
		ws = ws[1 : len(ws)-1]
	}
	if len(ws) > want {
		ws = ws[:want]
	}
	var admitted []float64
	for _, w := range ws {
		row.Admitted = append(row.Admitted, w.Allowed)
		row.StartMS = append(row.StartMS, w.StartMS)
		admitted = append(admitted, float64(w.Allowed))
	}
	row.Windows = len(ws)
	if len(ws) > 0 {
		row.Min, row.Max = slices.Min(row.Admitted), slices.Max(row.Admitted)
		row.Median = median(admitted)
	}
	return row
}

// Cluster is scenario 3.
type Cluster struct {
	Skipped      string       `json:"skipped,omitempty"`
	Nodes        int          `json:"nodes"`
	Limit        int          `json:"limit"`
	WindowMS     int64        `json:"window_ms"`
	SyncInterval string       `json:"sync_interval"`
	Rows         []ClusterRow `json:"rows"`
}

// ClusterRow is one algorithm at one offered load.
type ClusterRow struct {
	Algorithm   string  `json:"algorithm"`
	Multiple    int     `json:"multiple"` // offered load / limit
	OfferedRPS  float64 `json:"offered_rps"`
	AchievedRPS float64 `json:"achieved_rps"`
	Windows     int     `json:"windows"`
	Min         int64   `json:"min"`
	Median      float64 `json:"median"`
	Max         int64   `json:"max"`
	MaxInSpan   int     `json:"max_in_any_span"`
	Errors      int64   `json:"errors"`
	Admitted    []int64 `json:"admitted"` // per window, in order
	StartMS     []int64 `json:"start_ms"`
}
