package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
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

// clusterAvailable reports whether the server has the replication flags.
func (r *runner) clusterAvailable(ctx context.Context) bool {
	out, _ := commandOutput(ctx, r.root, r.bins.server, "serve", "--help")
	return strings.Contains(out, "nats-url") && strings.Contains(out, "backend") && strings.Contains(out, "sync-interval")
}

// cluster is scenario 3: three nodes on one NATS, each key offered 2×, 10×
// and 100× its limit, spread evenly over the nodes; what is admitted per
// window, fixed and sliding. The six (algorithm, multiple) loads run at
// once, each on its own key.
func (r *runner) cluster(ctx context.Context) error {
	c := &Cluster{Nodes: clusterNodes, Limit: clusterLimit, WindowMS: 1000, SyncInterval: clusterSync.String()}
	r.res.Cluster = c
	if !r.clusterAvailable(ctx) {
		c.Skipped = "replication not available: ratelimit-authz serve has no --nats-url/--backend/--sync-interval"
		r.printf("skipped: %s\n", c.Skipped)
		return nil
	}
	out, err := r.runTool(ctx, "install-nats", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-nats.sh"))
	if err != nil {
		c.Skipped = "nats-server not available: " + err.Error()
		return err
	}
	r.bins.nats = lastLine(out)
	if v, err := commandOutput(ctx, r.root, r.bins.nats, "--version"); err == nil {
		r.res.Env.NATSVersion = v
	}
	addrs, err := freeport.Addrs(2)
	if err != nil {
		return err
	}
	_, natsPort, _ := net.SplitHostPort(addrs[0])
	_, monPort, _ := net.SplitHostPort(addrs[1])
	nats, err := r.start("s3-nats", r.lifetime(), nil, r.bins.nats, "-a", "127.0.0.1", "-p", natsPort, "-m", monPort)
	if err != nil {
		return err
	}
	defer nats.stop()
	if err := waitHTTP200(ctx, nats, "http://"+addrs[1]+"/healthz", 20*time.Second); err != nil {
		return err
	}
	cfg := filepath.Join(r.tmp, "cluster.yaml")
	if err := writeClusterConfig(cfg, clusterLimit); err != nil {
		return err
	}
	var nodes []string
	for i := range clusterNodes {
		p, grpcAddr, _, err := r.startCheckServer(ctx, fmt.Sprintf("s3-node%d", i+1), cfg, nil,
			"--backend", "cluster", "--nats-url", "nats://"+addrs[0], "--sync-interval", clusterSync.String(),
			"--node-id", fmt.Sprintf("bench-%d", i+1))
		if err != nil {
			return err
		}
		defer p.stop()
		nodes = append(nodes, grpcAddr)
	}

	// A warm-up second first: six load processes starting at once on two
	// cores fall behind schedule and catch up in a burst, which is not
	// the steady offered load the rows are about.
	const warmup = 1500 * time.Millisecond
	dur := time.Duration(c.WindowMS*int64(r.opt.clusterWin+2))*time.Millisecond + 500*time.Millisecond
	type job struct {
		alg  string
		mult int
		res  *loadRun
		err  error
	}
	var jobs []*job
	for _, alg := range []string{"fixed", "sliding"} {
		for _, m := range clusterMultiples {
			jobs = append(jobs, &job{alg: alg, mult: m})
		}
	}
	// Start on a window boundary (+50 ms), so the first window is whole.
	sleepCtx(ctx, time.Until(nextBoundary(time.Now(), time.Second).Add(50*time.Millisecond)))
	var wg sync.WaitGroup
	for _, j := range jobs {
		rate := j.mult * clusterLimit
		conc := max(4, rate/250) // ~1 ms per check: room for slow answers
		wg.Go(func() {
			j.res, j.err = r.load(ctx, fmt.Sprintf("s3-%s-x%d", j.alg, j.mult), dur+warmup,
				"check", "--target", strings.Join(nodes, ","), "--connections", strconv.Itoa(clusterNodes),
				"--routes", clusterRoutes[j.alg], "--keys", "uniform", "--tenants", "1",
				"--key-prefix", fmt.Sprintf("%s-x%d-", j.alg, j.mult),
				"--rate", strconv.Itoa(rate), "--concurrency", strconv.Itoa(conc),
				"--duration", dur.String(), "--warmup", warmup.String(), "--timeout", "1s", "--window", "1s")
		})
	}
	wg.Wait()
	r.printf("%-8s %5s %9s %9s %8s %7s %7s %7s %9s %6s\n", "window", "load", "offered", "achieved", "windows", "min", "median", "max", "max/limit", "busiest")
	for _, j := range jobs {
		if j.err != nil {
			return j.err
		}
		row := clusterRow(j.alg, j.mult, j.res, r.opt.clusterWin)
		c.Rows = append(c.Rows, row)
		r.printf("%-8s %4d× %9.0f %9.0f %8d %7d %7.1f %7d %9.2f %6d\n", row.Algorithm, row.Multiple, row.OfferedRPS, row.AchievedRPS,
			row.Windows, row.Min, row.Median, row.Max, float64(row.Max)/clusterLimit, row.MaxInSpan)
	}
	return nil
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
