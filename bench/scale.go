package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
)

// The scale scenario runs internal/replicate's BenchmarkReplicationScale (N
// nodes in one process on a real nats-server, a hot and a flood load) in
// this tree and in the tree of --shares-baseline-ref (that commit with
// this tree's benchmark file), so before and after are measured in one
// run; it sets the figures beside the scale model of
// docs/replication-scale.md (scalemodel.go), and measures what one
// nats-server process fans out on this machine, from which the model
// gives the node count at which NATS saturates.

// scaleBenchFile is the benchmark, copied into the baseline's tree.
const scaleBenchFile = "internal/replicate/scale_bench_test.go"

// scaleBenchtime is the hits of each sub-benchmark: the hot load runs at
// a fixed 20,000 hits/s, so 100,000 hits is 5 s of it (five 1 s windows)
// per node count; the floods take well under a second each.
const (
	scaleBenchtime      = 100_000
	scaleBenchtimeQuick = 20_000
)

func (r *runner) scaleEstimate() time.Duration { return 3 * time.Minute }

func (r *runner) scale(ctx context.Context) error {
	s := &Scale{Benchtime: scaleBenchtime}
	if r.opt.quick {
		s.Benchtime = scaleBenchtimeQuick
	}
	r.res.Scale = s
	natsBin, err := r.natsServerBin(ctx)
	if err != nil {
		return err
	}
	s.Command = fmt.Sprintf("go test -run '^$' -bench ReplicationScale -benchtime %dx ./internal/replicate/", s.Benchtime)
	env := []string{"NATS_SERVER_BIN=" + natsBin, "CI=true"}

	if ref := r.opt.sharesBaselineRef; ref != "" {
		before := ScaleTree{Tree: "before", Ref: ref}
		if err := r.scaleBaseline(ctx, &before, env, s.Benchtime); err != nil {
			before.Error = firstLine(err.Error())
			r.note("scale: no baseline from %s: %v", ref, before.Error)
		}
		s.Before = &before
	}
	after := ScaleTree{Tree: "after", Ref: "this tree"}
	if err := r.scaleRun(ctx, &after, r.root, env, s.Benchtime); err != nil {
		return err
	}
	s.After = &after

	capacity, err := r.natsCapacity(ctx, natsBin)
	if err != nil {
		r.note("scale: nats-server capacity not measured: %v", err)
	}
	s.NATS = capacity
	s.build()
	return nil
}

// natsServerBin installs nats-server (when this run has not yet) with
// scripts/install-nats.sh, as the cluster scenarios do.
func (r *runner) natsServerBin(ctx context.Context) (string, error) {
	if r.bins.nats != "" {
		return r.bins.nats, nil
	}
	out, err := r.runTool(ctx, "install-nats", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-nats.sh"))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoNATS, err)
	}
	r.bins.nats = lastLine(out)
	if v, err := commandOutput(ctx, r.root, r.bins.nats, "--version"); err == nil {
		r.res.Env.NATSVersion = v
	}
	return r.bins.nats, nil
}

// scaleBaseline extracts ref's tree (git archive: no worktree is added to
// the repository), puts this tree's benchmark file over its own and runs
// it there; the tree is removed afterwards.
func (r *runner) scaleBaseline(ctx context.Context, t *ScaleTree, env []string, benchtime int) error {
	src, commit, err := r.checkout(ctx, t.Ref, "scale-baseline")
	t.Commit = commit
	if src != "" {
		defer os.RemoveAll(src)
	}
	if err != nil {
		return err
	}
	bench, err := os.ReadFile(filepath.Join(r.root, scaleBenchFile))
	if err != nil {
		return err
	}
	dst := filepath.Join(src, inTree(src, filepath.Dir(scaleBenchFile)), filepath.Base(scaleBenchFile))
	if err := os.WriteFile(dst, bench, 0o644); err != nil {
		return err
	}
	if err := retarget(src, dst); err != nil {
		return err
	}
	return r.scaleRun(ctx, t, src, env, benchtime)
}

// scaleRun runs the benchmark in dir and parses its figures.
func (r *runner) scaleRun(ctx context.Context, t *ScaleTree, dir string, env []string, benchtime int) error {
	start := time.Now()
	out, err := r.runTool(ctx, "scale-"+t.Tree, 6*time.Minute, env, dir, "go", "test", "-run", "^$",
		"-bench", "ReplicationScale", "-benchtime", strconv.Itoa(benchtime)+"x", "-timeout", "5m", "./"+inTree(dir, filepath.Dir(scaleBenchFile))+"/")
	os.WriteFile(filepath.Join(r.runsDir, "scale-"+t.Tree+".txt"), out, 0o644)
	if err != nil {
		return err
	}
	t.Seconds = round1(time.Since(start).Seconds())
	if t.Rows, err = parseScaleBench(string(out)); err != nil {
		return fmt.Errorf("scale %s: %w", t.Tree, err)
	}
	r.printf("scale %s (%s): %d sub-benchmarks in %.0fs\n", t.Tree, t.Ref, len(t.Rows), t.Seconds)
	return nil
}

// The benchmark's metric units.
const (
	mOutB   = "out-B/node/1k-hits"
	mInB    = "in-B/node/1k-hits"
	mInMsgs = "in-msgs/node/1k-hits"
	mMerged = "merged/node/1k-hits"
	mSent   = "sent-entries/node/1k-hits"
	mAE     = "ae-entries/node/1k-hits"
	mSyncB  = "sync-B/node/1k-hits"
	mOutBs  = "out-B/node/s"
	mInBs   = "in-B/node/s"
	mCPU    = "cpu-µs/hit"
	mHits   = "hits/s"
	mSlow   = "slow-consumer-events"
)

// parseScaleBench reads the BenchmarkReplicationScale lines of `go test
// -bench` output: "BenchmarkReplicationScale/nodes=3/hot-2  N  v unit
// v unit ...". Other lines are ignored; a line of the benchmark that
// does not parse is an error, and so is output without any.
func parseScaleBench(out string) ([]ScaleMetrics, error) {
	var rows []ScaleMetrics
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || !strings.HasPrefix(f[0], "BenchmarkReplicationScale/") {
			continue
		}
		name := strings.TrimPrefix(f[0], "BenchmarkReplicationScale/")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		nodesPart, load, ok := strings.Cut(name, "/")
		nodes, err := strconv.Atoi(strings.TrimPrefix(nodesPart, "nodes="))
		if !ok || !strings.HasPrefix(nodesPart, "nodes=") || err != nil || nodes < 2 || load == "" {
			return nil, fmt.Errorf("benchmark name %q: want nodes=<n>/<load>", f[0])
		}
		if len(f) < 4 || len(f)%2 != 0 {
			return nil, fmt.Errorf("%s: want the iterations and value-unit pairs, got %d fields", f[0], len(f))
		}
		hits, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("%s: iterations %q: %w", f[0], f[1], err)
		}
		m := ScaleMetrics{Nodes: nodes, Load: load, Hits: hits, Values: map[string]float64{}}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: value %q of %s: %w", f[0], f[i], f[i+1], err)
			}
			m.Values[f[i+1]] = v
		}
		for _, u := range []string{mOutB, mInB, mInMsgs, mMerged, mCPU, mHits} {
			if _, ok := m.Values[u]; !ok {
				return nil, fmt.Errorf("%s: no %s", f[0], u)
			}
		}
		rows = append(rows, m)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no BenchmarkReplicationScale results in the output")
	}
	return rows, nil
}

// Scale is the scale scenario.
type Scale struct {
	Benchtime int        `json:"benchtime"`
	Command   string     `json:"command"`
	Before    *ScaleTree `json:"before,omitempty"`
	After     *ScaleTree `json:"after"`
	// Rows join, per node count and load, the model and both trees.
	Rows []ScaleRow `json:"rows"`
	// CPU is the per-hit CPU model fitted to the before tree's rows.
	CPU  *ScaleCPUFit  `json:"cpu_fit,omitempty"`
	NATS *NATSCapacity `json:"nats,omitempty"`
	// Saturation is the node counts at which NATS saturates under the hot
	// load, from the model and the measured nats-server cost.
	Saturation []ScaleSaturation `json:"saturation,omitempty"`
}

// ScaleTree is the benchmark run in one tree.
type ScaleTree struct {
	Tree    string         `json:"tree"` // before, after
	Ref     string         `json:"ref"`
	Commit  string         `json:"commit,omitempty"`
	Seconds float64        `json:"seconds"`
	Rows    []ScaleMetrics `json:"rows,omitempty"`
	Error   string         `json:"error,omitempty"`
}

// ScaleMetrics is one sub-benchmark: its figures by unit.
type ScaleMetrics struct {
	Nodes  int                `json:"nodes"`
	Load   string             `json:"load"`
	Hits   int                `json:"hits"`
	Values map[string]float64 `json:"values"`
}

func (m *ScaleMetrics) value(unit string) float64 {
	if m == nil {
		return 0
	}
	return m.Values[unit]
}

// ScaleRow is one node count and load: both trees' figures and the
// model's, for the current design and for budget shares.
type ScaleRow struct {
	Nodes       int             `json:"nodes"`
	Load        string          `json:"load"`
	Before      *ScaleMetrics   `json:"before,omitempty"`
	After       *ScaleMetrics   `json:"after,omitempty"`
	Model       ScalePrediction `json:"model"`
	ModelShares ScalePrediction `json:"model_shares"`
	// InBRatio is the after tree's in-bytes per 1k hits over the before
	// tree's; 0 when either is missing.
	InBRatio float64 `json:"in_b_ratio,omitempty"`
}

// build joins the trees' rows with the model's predictions and fits the
// CPU model; the saturation figures follow when NATS was measured.
func (s *Scale) build() {
	find := func(t *ScaleTree, nodes int, load string) *ScaleMetrics {
		if t == nil {
			return nil
		}
		for i := range t.Rows {
			if t.Rows[i].Nodes == nodes && t.Rows[i].Load == load {
				return &t.Rows[i]
			}
		}
		return nil
	}
	s.Rows = nil
	for _, load := range []string{"hot", "flood"} {
		for _, n := range scaleNodeCounts {
			row := ScaleRow{Nodes: n, Load: load, Before: find(s.Before, n, load), After: find(s.After, n, load)}
			if row.Before == nil && row.After == nil {
				continue
			}
			// The model of each tree's design at that tree's rate: the hot
			// load's is fixed; the flood's, as fast as it went, sets only
			// how many ticks it spans.
			at := func(m, other *ScaleMetrics) (rate float64, hits int) {
				if m == nil {
					m = other
				}
				if load == "flood" {
					return m.value(mHits), m.Hits
				}
				return hotRate, m.Hits
			}
			rate, hits := at(row.Before, row.After)
			row.Model = predictScale(benchShape, designNow, n, load, rate, hits)
			rate, hits = at(row.After, row.Before)
			row.ModelShares = predictScale(benchShape, designShares, n, load, rate, hits)
			if b, a := row.Before.value(mInB), row.After.value(mInB); b > 0 && row.After != nil {
				row.InBRatio = round(a/b, 4)
			}
			s.Rows = append(s.Rows, row)
		}
	}
	s.CPU = fitScaleCPU(s.Rows)
	if s.NATS != nil && s.NATS.PerDeliveryUS > 0 {
		s.Saturation = saturation(benchShape, *s.NATS)
	}
}

// scaleNodeCounts are the benchmark's node counts.
var scaleNodeCounts = []int{3, 10, 30}

// NATSCapacity is what one nats-server process did on this machine under
// a plain fan-out load, and its cost per message fitted from the runs.
type NATSCapacity struct {
	Runs []NATSRun `json:"runs"`
	// Server CPU per message published to it and per message delivered,
	// fitted to the small-message runs of fan-out 1 and 10.
	PerPublishUS  float64 `json:"per_publish_us"`
	PerDeliveryUS float64 `json:"per_delivery_us"`
}

// NATSRun is one fan-out run: a publisher on its own connection, Fanout
// subscribers each on their own, messages of Size bytes.
type NATSRun struct {
	Fanout      int     `json:"fanout"`
	Size        int     `json:"size"`
	Seconds     float64 `json:"seconds"`
	PublishedPS float64 `json:"published_per_s"`
	DeliveredPS float64 `json:"delivered_per_s"`
	DeliveredBS float64 `json:"delivered_bytes_per_s"`
	// ServerCPU is the server's CPU over the run as a share of one core.
	ServerCPU float64 `json:"server_cpu"`
	// PerDeliveryUS is the server's CPU per delivered message.
	PerDeliveryUS float64 `json:"per_delivery_us"`
	Dropped       int64   `json:"dropped"`
}

// natsFanoutRuns are the fan-out runs: fan-out 1 and 10 at a small size
// (about a hot batch of a large cluster) separate the cost of a publish
// from that of a delivery; the 1 KiB run shows what size adds.
var natsFanoutRuns = []struct{ fanout, size int }{{1, 128}, {10, 128}, {10, 1024}}

// natsCapacity starts a nats-server of its own and measures it under
// each fan-out run.
func (r *runner) natsCapacity(ctx context.Context, bin string) (*NATSCapacity, error) {
	addr, err := freeport.Addrs(1)
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr[0])
	p, err := r.start("scale-nats", r.lifetime(), nil, bin, "-a", host, "-p", port)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	d := 2 * time.Second
	if r.opt.quick {
		d = time.Second
	}
	c := &NATSCapacity{}
	for _, x := range natsFanoutRuns {
		run, err := natsFanout(ctx, "nats://"+addr[0], p.pid(), x.fanout, x.size, d)
		if err != nil {
			return c, fmt.Errorf("fan-out %d × %d B: %w", x.fanout, x.size, err)
		}
		c.Runs = append(c.Runs, run)
		r.printf("nats-server fan-out %2d × %4d B: %8.0f published/s, %9.0f delivered/s (%5.1f MB/s), server CPU %.2f cores, %.2f µs per delivery, %d dropped\n",
			run.Fanout, run.Size, run.PublishedPS, run.DeliveredPS, run.DeliveredBS/1e6, run.ServerCPU, run.PerDeliveryUS, run.Dropped)
	}
	c.fit()
	return c, nil
}

// fit solves cpu/s = a × published/s + b × delivered/s from the two
// small-message runs; when that gives a negative cost (noise), all of it
// is put on deliveries.
func (c *NATSCapacity) fit() {
	var one, ten *NATSRun
	for i := range c.Runs {
		x := &c.Runs[i]
		if x.Size == natsFanoutRuns[0].size && x.Fanout == 1 {
			one = x
		}
		if x.Size == natsFanoutRuns[0].size && x.Fanout == 10 {
			ten = x
		}
	}
	if one == nil || ten == nil || ten.DeliveredPS <= 0 {
		return
	}
	// ServerCPU is in cores, so a and b come out in seconds; µs below.
	a, b, ok := solve2(one.PublishedPS, one.DeliveredPS, one.ServerCPU, ten.PublishedPS, ten.DeliveredPS, ten.ServerCPU)
	if !ok || a < 0 || b <= 0 {
		a, b = 0, ten.ServerCPU/ten.DeliveredPS
	}
	c.PerPublishUS, c.PerDeliveryUS = round(a*1e6, 3), round(b*1e6, 3)
}

// solve2 solves x1·a + y1·b = z1, x2·a + y2·b = z2.
func solve2(x1, y1, z1, x2, y2, z2 float64) (a, b float64, ok bool) {
	det := x1*y2 - x2*y1
	if det == 0 {
		return 0, 0, false
	}
	return (z1*y2 - z2*y1) / det, (x1*z2 - x2*z1) / det, true
}

// natsFanout publishes size-byte messages on one connection to fanout
// subscribers, each on its own connection, for d, and measures the
// server's CPU (pid) over that time. The publisher flushes every 256
// messages, so what is in flight stays bounded and the server, not the
// client's buffer, sets the pace.
func natsFanout(ctx context.Context, url string, pid, fanout, size int, d time.Duration) (NATSRun, error) {
	run := NATSRun{Fanout: fanout, Size: size}
	subj := fmt.Sprintf("fanout.%d.%d", fanout, size)
	var delivered atomic.Int64
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	var subs []*nats.Subscription
	// The server was just started: the first connection waits for it.
	first, err := connectWithin(ctx, url, 10*time.Second)
	if err != nil {
		return run, err
	}
	first.Close()
	for range fanout {
		nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
		if err != nil {
			return run, fmt.Errorf("connect: %w", err)
		}
		conns = append(conns, nc)
		sub, err := nc.Subscribe(subj, func(*nats.Msg) { delivered.Add(1) })
		if err != nil {
			return run, fmt.Errorf("subscribe: %w", err)
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			return run, err
		}
		if err := nc.Flush(); err != nil {
			return run, err
		}
		subs = append(subs, sub)
	}
	pub, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return run, fmt.Errorf("connect: %w", err)
	}
	conns = append(conns, pub)
	payload := make([]byte, size)
	var published atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			for range 256 {
				if err := pub.Publish(subj, payload); err != nil {
					done <- err
					return
				}
			}
			published.Add(256)
			if err := pub.FlushTimeout(5 * time.Second); err != nil {
				done <- err
				return
			}
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
		}
	}()
	// Half a second to reach the steady state, then d measured.
	warm := time.NewTimer(500 * time.Millisecond)
	select {
	case <-ctx.Done():
	case <-warm.C:
	}
	c0, err0 := cpuTimeOf(pid)
	p0, d0, t0 := published.Load(), delivered.Load(), time.Now()
	measure := time.NewTimer(d)
	select {
	case <-ctx.Done():
	case <-measure.C:
	}
	c1, err1 := cpuTimeOf(pid)
	p1, d1, el := published.Load(), delivered.Load(), time.Since(t0)
	close(stop)
	if err := <-done; err != nil {
		return run, fmt.Errorf("publish: %w", err)
	}
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	if err0 != nil || err1 != nil {
		return run, fmt.Errorf("nats-server CPU time: %v %v", err0, err1)
	}
	for _, s := range subs {
		n, _ := s.Dropped()
		run.Dropped += int64(n)
	}
	run.Seconds = round(el.Seconds(), 2)
	run.PublishedPS = round1(float64(p1-p0) / el.Seconds())
	run.DeliveredPS = round1(float64(d1-d0) / el.Seconds())
	run.DeliveredBS = round1(run.DeliveredPS * float64(size))
	run.ServerCPU = round((c1-c0).Seconds()/el.Seconds(), 3)
	if run.DeliveredPS > 0 {
		run.PerDeliveryUS = round(run.ServerCPU/run.DeliveredPS*1e6, 3)
	}
	return run, nil
}

// connectWithin connects to url, trying again until within has passed.
func connectWithin(ctx context.Context, url string, within time.Duration) (*nats.Conn, error) {
	deadline := time.Now().Add(within)
	for {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err == nil || time.Now().After(deadline) {
			if err != nil {
				err = fmt.Errorf("connect to %s within %v: %w", url, within, err)
			}
			return nc, err
		}
		if !cli.Sleep(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}
