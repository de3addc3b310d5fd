// Command accuracy measures how closely a cluster holds a limit: three
// nodes in this process, each with its own counter.Store, Replicator and
// NATS connection, on one nats-server (--nats-url). Each row offers one key
// a multiple of its limit at a fixed rate, spread over the nodes evenly or
// skewed (one node 90%, the others 5% each), with a fixed or a sliding
// window, and counts what the nodes admitted in each whole window, by the
// window each Take was made in. It prints the rows as JSON on stdout.
//
// It uses only the public API of internal/counter and internal/replicate, so that
// the same program measures another commit's code when copied into that
// commit's tree (the bench runner's accuracy scenario does so).
//
//	go run ./bench/accuracy --nats-url nats://127.0.0.1:4222 > accuracy.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
)

func main() { cli.Main("accuracy", run) }

// nodes is the cluster's size.
const nodes = 3

// bucketOf is the bucket a row of algorithm a counts in: each algorithm
// has its own (replication drops a count made in another algorithm than
// its bucket's), whose id is the algorithm.
func bucketOf(a counter.Algorithm) counter.Bucket { return counter.Bucket(a) }

// replicated are the buckets the nodes replicate, one per algorithm.
func replicated() []replicate.Bucket {
	return []replicate.Bucket{
		{Name: "acc_fixed", ID: bucketOf(counter.Fixed), Algorithm: counter.Fixed},
		{Name: "acc_sliding", ID: bucketOf(counter.Sliding), Algorithm: counter.Sliding},
	}
}

// distributions are the shares of the offered load each node receives.
var distributions = map[string][nodes]float64{
	"even":   {1.0 / 3, 1.0 / 3, 1.0 / 3},
	"skewed": {0.90, 0.05, 0.05},
}

var algorithms = map[string]counter.Algorithm{"fixed": counter.Fixed, "sliding": counter.Sliding}

// tick is how often each node's driver takes the Takes that have come due.
const tick = time.Millisecond

type config struct {
	natsURL   string
	limit     int64
	window    time.Duration
	windows   int
	multiples []float64
	sync      time.Duration
	prefix    string
	bursts    []string
	burstRuns int
}

func parse(args []string, stdout, stderr io.Writer) (config, bool, error) {
	var c config
	fs := flag.NewFlagSet("accuracy", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: accuracy --nats-url URL [flags] > rows.json\n\n"+
			"Run %d replicated nodes in this process on one nats-server and measure, per whole\n"+
			"window, how much of a limit they admit together at multiples of it, offered at\n"+
			"a fixed rate, evenly over the nodes and skewed (one node 90%%). The rows of one\n"+
			"multiple run at once, each on its own key; JSON on stdout, progress on stderr.\n\nFlags:\n", nodes)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.natsURL, "nats-url", "", "NATS server `URL` (required)")
	fs.Int64Var(&c.limit, "limit", 100, "hits admitted per window")
	fs.DurationVar(&c.window, "window", time.Second, "window length (whole milliseconds)")
	fs.IntVar(&c.windows, "windows", 8, "whole windows counted per row")
	mults := fs.String("multiples", "1.1,2,10,100,1000", "offered loads as multiples of the limit, comma-separated")
	fs.DurationVar(&c.sync, "sync-interval", replicate.DefaultSyncInterval, "replication sync interval")
	fs.StringVar(&c.prefix, "subject-prefix", "accuracy", "NATS subject prefix of the nodes (another run on the same server should use another)")
	bl := fs.String("bursts", "", "burst scenarios run after the multiples, comma-separated: "+strings.Join(burstNames, ", ")+", or all (each on a key no node has seen; see loadresult.AccuracyBurst)")
	fs.IntVar(&c.burstRuns, "burst-runs", 6, "runs of each burst scenario, each on a new key in a window of its own")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return c, true, err
	}
	for s := range strings.SplitSeq(*mults, ",") {
		if strings.TrimSpace(s) == "" && *mults == "" {
			break // none: bursts only
		}
		m, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || m <= 0 || m > 10_000 {
			return c, true, cli.UsageError{Msg: fmt.Sprintf("--multiples: %q is not a number in (0, 10000]", s)}
		}
		c.multiples = append(c.multiples, m)
	}
	var err error
	switch *bl {
	case "":
	case "all":
		c.bursts = burstNames
	default:
		if c.bursts, err = names("--bursts", *bl, burstSpecs); err != nil {
			return c, true, err
		}
	}
	switch {
	case c.natsURL == "":
		return c, true, cli.UsageError{Msg: "--nats-url is required"}
	case c.limit < 1 || c.limit > 1_000_000:
		return c, true, cli.UsageError{Msg: "--limit: from 1 to 1000000"}
	case c.window < 100*time.Millisecond || c.window > 10*time.Second || c.window%time.Millisecond != 0:
		return c, true, cli.UsageError{Msg: "--window: whole milliseconds from 100ms to 10s"}
	case c.windows < 1 || c.windows > 100:
		return c, true, cli.UsageError{Msg: "--windows: from 1 to 100"}
	case c.sync < 10*time.Millisecond || c.sync > 10*time.Second:
		return c, true, cli.UsageError{Msg: "--sync-interval: from 10ms to 10s"}
	case c.burstRuns < 1 || c.burstRuns > 100:
		return c, true, cli.UsageError{Msg: "--burst-runs: from 1 to 100"}
	case len(c.multiples) == 0 && len(c.bursts) == 0:
		return c, true, cli.UsageError{Msg: "--multiples and --bursts are both empty: nothing to measure"}
	}
	for _, m := range c.multiples {
		// Each row's Takes are made by this process: bound the rate.
		if rate := m * float64(c.limit) / c.window.Seconds(); rate > 500_000 {
			return c, true, cli.UsageError{Msg: fmt.Sprintf("--multiples: %g× %d per %v is %.0f Takes/s per row, more than 500000", m, c.limit, c.window, rate)}
		}
	}
	return c, false, nil
}

func names[V any](flagName, list string, known map[string]V) ([]string, error) {
	var out []string
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		if _, ok := known[s]; !ok {
			return nil, cli.UsageError{Msg: fmt.Sprintf("%s: unknown %q", flagName, s)}
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, done, err := parse(args, stdout, stderr)
	if done {
		return err
	}
	// Bound the whole run: the phases, the start and the stop, with room.
	perPhase := time.Duration(c.windows+3) * c.window
	perBursts := time.Duration(len(c.bursts)*(2*c.burstRuns+2)) * c.window
	ctx, cancel := context.WithTimeout(ctx, time.Duration(len(c.multiples))*perPhase+perBursts+time.Minute)
	defer cancel()

	out := loadresult.Accuracy{Nodes: nodes, Limit: c.limit, WindowMS: c.window.Milliseconds(), SyncInterval: c.sync.String(),
		Windows: c.windows, GoVersion: runtime.Version(), StartedAt: time.Now().UTC()}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cl, err := startCluster(ctx, c, log)
	if err != nil {
		return err
	}
	defer cl.stop()
	if out.PeersSeen, err = cl.waitPeers(ctx, 10*time.Second); err != nil {
		return err
	}
	for _, m := range c.multiples {
		rows, err := cl.phase(ctx, c, m)
		if err != nil {
			return err
		}
		for _, r := range rows {
			fmt.Fprintf(stderr, "%-7s %6g× %-6s admitted per window min %d median %.1f max %d (limit %d), %d windows, behind ≤ %.1f ms\n",
				r.Algorithm, r.Multiple, r.Distribution, r.Min, r.Median, r.Max, c.limit, r.Windows, r.MaxBehindMS)
		}
		out.Rows = append(out.Rows, rows...)
	}
	for _, name := range c.bursts {
		b, err := cl.burst(ctx, c, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "burst %-12s admitted min %d median %.1f max %d (limit %d) %v, 90%% of the limit after %v ms, behind ≤ %.1f ms\n",
			b.Scenario, b.Min, b.Median, b.Max, c.limit, b.Admitted, b.Reach90MS, b.MaxBehindMS)
		out.Bursts = append(out.Bursts, b)
	}
	if err := cl.stop(); err != nil {
		return err
	}
	out.ElapsedS = time.Since(out.StartedAt).Seconds()
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// node is one member of the cluster.
type node struct {
	id    string
	store *counter.Store
	repl  *replicate.Replicator
	reg   *prometheus.Registry
	done  chan error // Run's result
}

// cluster is the nodes, running until stop.
type cluster struct {
	nodes    []*node
	cancel   context.CancelFunc
	stopOnce sync.Once
	stopErr  error
}

// startCluster starts the nodes and waits until each is ready and
// connected to NATS.
func startCluster(ctx context.Context, c config, log *slog.Logger) (*cluster, error) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cl := &cluster{cancel: cancel}
	for i := range nodes {
		n := &node{id: "n" + strconv.Itoa(i), reg: prometheus.NewRegistry(), done: make(chan error, 1)}
		var err error
		if n.store, err = counter.New(counter.Config{Track: true}); err != nil {
			cl.stop()
			return nil, fmt.Errorf("node %s: counter: %w", n.id, err)
		}
		n.repl, err = replicate.New(replicate.Config{
			URL: c.natsURL, NodeID: n.id, Buckets: replicated(),
			SubjectPrefix: c.prefix, SyncInterval: c.sync,
		}, n.store, n.reg, log.With("node", n.id))
		if err != nil {
			cl.stop()
			return nil, fmt.Errorf("node %s: replicator: %w", n.id, err)
		}
		go func() { n.done <- n.repl.Run(rctx) }()
		cl.nodes = append(cl.nodes, n)
	}
	for _, n := range cl.nodes {
		select {
		case <-n.repl.Ready():
		case err := <-n.done:
			n.done <- err // for stop
			cl.stop()
			return nil, fmt.Errorf("node %s: replicator stopped before it was ready: %v", n.id, err)
		case <-ctx.Done():
			cl.stop()
			return nil, fmt.Errorf("waiting for node %s to be ready: %w", n.id, ctx.Err())
		}
	}
	// Ready also comes when NATS cannot be reached (the node then counts
	// alone): that would measure nothing.
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range cl.nodes {
		for {
			v, ok := gauge(n.reg, "ratelimit_authz_replicate_connected")
			if !ok || v == 1 {
				break
			}
			if time.Now().After(deadline) || !cli.Sleep(ctx, 20*time.Millisecond) {
				cl.stop()
				return nil, fmt.Errorf("node %s is not connected to NATS at %s", n.id, c.natsURL)
			}
		}
	}
	return cl, nil
}

// waitPeers waits until every node counts the others as peers, so that
// none admits as if it were alone. It reports false when the peers metric
// is not there to read; then it waits two default heartbeats instead.
func (cl *cluster) waitPeers(ctx context.Context, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for _, n := range cl.nodes {
		for {
			v, ok := gauge(n.reg, "ratelimit_authz_replicate_peers")
			if !ok {
				return false, sleepErr(ctx, 2*replicate.DefaultHeartbeat)
			}
			if v >= nodes-1 {
				break
			}
			if time.Now().After(deadline) {
				return false, fmt.Errorf("node %s knows %.0f peers after %v, want %d", n.id, v, timeout, nodes-1)
			}
			if err := sleepErr(ctx, 20*time.Millisecond); err != nil {
				return false, err
			}
		}
	}
	return true, nil
}

// stop stops every node and waits for it (idempotent): an error if a
// node's Run failed or did not return in time.
func (cl *cluster) stop() error {
	cl.stopOnce.Do(func() {
		cl.cancel()
		timeout := time.After(replicate.DefaultFlushTimeout + 5*time.Second)
		var errs []error
		for _, n := range cl.nodes {
			select {
			case err := <-n.done:
				if err != nil && !errors.Is(err, context.Canceled) {
					errs = append(errs, fmt.Errorf("node %s: %w", n.id, err))
				}
			case <-timeout:
				errs = append(errs, fmt.Errorf("node %s: Run did not return after its context was cancelled", n.id))
			}
		}
		cl.stopErr = errors.Join(errs...)
	})
	return cl.stopErr
}

// rowRun is a row while its phase runs. Each node's driver writes only
// its own slices.
type rowRun struct {
	loadresult.AccuracyRow
	lim  counter.Limit
	rate [nodes]float64 // Takes per second, per node
	skip int            // leading windows not counted
	// counts[node][window of the phase] = {offered, admitted}
	counts [nodes][][2]int64
	behind [nodes]time.Duration
}

// phase offers every row of multiple m at once and summarises them. The
// phase starts lead before a window boundary: that first, partial window
// is not counted, nor for a sliding window the first whole one (its
// previous window is empty); then c.windows whole windows are counted.
func (cl *cluster) phase(ctx context.Context, c config, m float64) ([]loadresult.AccuracyRow, error) {
	const lead = 200 * time.Millisecond
	wms := c.window.Milliseconds()
	now := time.Now()
	boundary := time.UnixMilli((now.Add(lead+50*time.Millisecond).UnixMilli()/wms + 1) * wms)
	t0, end := boundary.Add(-lead), boundary.Add(time.Duration(c.windows+1)*c.window)
	w0 := t0.UnixMilli() / wms
	slots := int(end.UnixMilli()/wms - w0)

	var rows []*rowRun
	for _, alg := range []string{"fixed", "sliding"} {
		for _, dist := range []string{"even", "skewed"} {
			rr := &rowRun{AccuracyRow: loadresult.AccuracyRow{Algorithm: alg, Multiple: m, Distribution: dist, Key: fmt.Sprintf("%s-%s-x%g", alg, dist, m),
				OfferedPerS: m * float64(c.limit) / c.window.Seconds()}, lim: counter.Limit{Limit: c.limit, ScaleMS: wms, Algorithm: algorithms[alg]}}
			rr.skip = 1
			if rr.lim.Algorithm == counter.Sliding {
				rr.skip = 2
			}
			for i, s := range distributions[dist] {
				rr.Shares = append(rr.Shares, s)
				rr.rate[i] = s * rr.OfferedPerS
				rr.counts[i] = make([][2]int64, slots)
			}
			rows = append(rows, rr)
		}
	}
	var wg sync.WaitGroup
	for i, n := range cl.nodes {
		wg.Go(func() { drive(ctx, n, i, rows, t0, end, wms, w0) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%g× the limit: %w", m, err)
	}
	out := make([]loadresult.AccuracyRow, 0, len(rows))
	for _, rr := range rows {
		out = append(out, rr.summarise(w0, wms, c.windows))
	}
	return out, nil
}

// drive makes node i's Takes of every row from t0 until end, at each row's
// rate for the node: every tick it takes at once all those that have come
// due, at that instant.
func drive(ctx context.Context, n *node, i int, rows []*rowRun, t0, end time.Time, wms, w0 int64) {
	if !cli.Sleep(ctx, time.Until(t0)) {
		return
	}
	done := make([]int64, len(rows))
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		now := time.Now()
		if !now.Before(end) {
			return
		}
		el := now.Sub(t0)
		slot := int(now.UnixMilli()/wms - w0)
		for j, rr := range rows {
			rate := rr.rate[i]
			due := int64(el.Seconds()*rate) - done[j]
			if due <= 0 {
				continue
			}
			// The oldest due Take was scheduled at (done+1)/rate.
			if late := el - time.Duration(float64(done[j]+1)/rate*float64(time.Second)); late > rr.behind[i] {
				rr.behind[i] = late
			}
			var admitted int64
			for range due {
				if n.store.Take(bucketOf(rr.lim.Algorithm), rr.Key, rr.lim, now).Allowed {
					admitted++
				}
			}
			done[j] += due
			if slot >= 0 && slot < len(rr.counts[i]) {
				rr.counts[i][slot][0] += due
				rr.counts[i][slot][1] += admitted
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// summarise is the row over its counted windows.
func (rr *rowRun) summarise(w0, wms int64, windows int) loadresult.AccuracyRow {
	r := rr.AccuracyRow
	for s := rr.skip; s < rr.skip+windows && s < len(rr.counts[0]); s++ {
		var offered, admitted int64
		per := make([]int64, nodes)
		for i := range nodes {
			offered += rr.counts[i][s][0]
			admitted += rr.counts[i][s][1]
			per[i] = rr.counts[i][s][1]
		}
		r.WindowStartMS = append(r.WindowStartMS, (w0+int64(s))*wms)
		r.Offered = append(r.Offered, offered)
		r.Admitted = append(r.Admitted, admitted)
		r.AdmittedPerNode = append(r.AdmittedPerNode, per)
	}
	r.Windows = len(r.Admitted)
	if r.Windows > 0 {
		r.Min, r.Median, r.Max = spread(r.Admitted)
	}
	r.MaxBehindMS = float64(slices.Max(rr.behind[:]).Microseconds()) / 1000
	return r
}

// spread is the least, median and largest of xs (not empty).
func spread(xs []int64) (lo int64, median float64, hi int64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	if k := len(s); k%2 == 1 {
		median = float64(s[k/2])
	} else {
		median = float64(s[k/2-1]+s[k/2]) / 2
	}
	return s[0], median, s[len(s)-1]
}

// gauge reads a gauge without labels from reg; false if it is not there.
func gauge(reg *prometheus.Registry, name string) (float64, bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func sleepErr(ctx context.Context, d time.Duration) error {
	if !cli.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// burstSpec is a burst scenario: which nodes burst, how many Takes each
// offers as a multiple of the limit, and at what pace.
type burstSpec struct {
	nodes  []int
	mult   float64 // Takes per bursting node, × the limit
	perMS  float64 // per bursting node and ms, × the limit/100; 0: all at once
	second bool
}

// burstSpecs are the scenarios: 2× the limit offered on one node back to
// back (at 5 Takes a ms per 100 of the limit, what one client sends
// through Envoy), paced (1 a ms per 100), in turn over the three nodes at
// the same total pace, on every node at once (paced, and each node's all
// at once: the worst case of a key's first window), and on one node in the
// key's second window.
var burstSpecs = map[string]burstSpec{
	"one":         {nodes: []int{0}, mult: 2, perMS: 5},
	"paced":       {nodes: []int{0}, mult: 2, perMS: 1},
	"round-robin": {nodes: []int{0, 1, 2}, mult: 2.0 / 3, perMS: 5.0 / 3},
	"all":         {nodes: []int{0, 1, 2}, mult: 2, perMS: 5},
	"all-instant": {nodes: []int{0, 1, 2}, mult: 2},
	"next":        {nodes: []int{0}, mult: 2, perMS: 5, second: true},
}

var burstNames = []string{"one", "paced", "round-robin", "all", "all-instant", "next"}

// burstLead is how far into its window each run's burst starts.
const burstLead = 50 * time.Millisecond

// burst runs scenario name c.burstRuns times, each run on a new key,
// starting burstLead into a window of its own (for a second-window
// scenario, a first burst in the window before, not counted).
func (cl *cluster) burst(ctx context.Context, c config, name string) (loadresult.AccuracyBurst, error) {
	spec := burstSpecs[name]
	per := int64(spec.mult * float64(c.limit))
	perMS := spec.perMS * float64(c.limit) / 100
	b := loadresult.AccuracyBurst{Scenario: name, Nodes: spec.nodes, PerNode: per, PerMS: perMS, Second: spec.second, Runs: c.burstRuns}
	lim := counter.Limit{Limit: c.limit, ScaleMS: c.window.Milliseconds()}
	nonce := time.Now().UnixNano()
	var behind time.Duration
	for run := range c.burstRuns {
		key := fmt.Sprintf("burst-%s-%d-%d", name, run, nonce)
		// The next window that starts at least 100 ms from now.
		wms := c.window.Milliseconds()
		w := (time.Now().Add(100*time.Millisecond).UnixMilli())/wms + 1
		if spec.second {
			if _, _, _, err := cl.burstRun(ctx, spec, key, lim, per, perMS, time.UnixMilli(w*wms).Add(burstLead)); err != nil {
				return b, err
			}
			w++
		}
		t0 := time.UnixMilli(w * wms).Add(burstLead)
		res, outside, late, err := cl.burstRun(ctx, spec, key, lim, per, perMS, t0)
		if err != nil {
			return b, err
		}
		behind = max(behind, late)
		b.Late = append(b.Late, outside)
		var all int64
		perNode := make([]int64, nodes)
		var times []time.Duration // of every admitted Take, from t0
		for i, r := range res {
			perNode[i] = int64(len(r))
			all += int64(len(r))
			times = append(times, r...)
		}
		slices.Sort(times)
		reach, last := -1.0, 0.0
		if k := int(c.limit * 9 / 10); k > 0 && len(times) >= k {
			reach = ms(times[k-1])
		}
		if len(times) > 0 {
			last = ms(times[len(times)-1])
		}
		b.Admitted = append(b.Admitted, all)
		b.AdmittedPerNode = append(b.AdmittedPerNode, perNode)
		b.Reach90MS = append(b.Reach90MS, reach)
		b.LastMS = append(b.LastMS, last)
	}
	b.Min, b.Median, b.Max = spread(b.Admitted)
	b.MaxBehindMS = ms(behind)
	return b, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// burstRun makes one run's Takes of key from t0 on: each bursting node
// takes, every 1 ms tick, those that have come due at perMS a ms (all at
// once when perMS is 0), per in all. It returns, per node, when after t0
// each Take admitted in t0's window was made, how many Takes were made
// after that window, and how late at most a Take was made.
func (cl *cluster) burstRun(ctx context.Context, spec burstSpec, key string, lim counter.Limit, per int64, perMS float64, t0 time.Time) ([nodes][]time.Duration, int64, time.Duration, error) {
	var out [nodes][]time.Duration
	var late [nodes]time.Duration
	var outside [nodes]int64
	end := time.UnixMilli((t0.UnixMilli()/lim.ScaleMS + 1) * lim.ScaleMS)
	var wg sync.WaitGroup
	for _, i := range spec.nodes {
		n := cl.nodes[i]
		wg.Go(func() {
			if !cli.Sleep(ctx, time.Until(t0)) {
				return
			}
			t := time.NewTicker(tick)
			defer t.Stop()
			var done int64
			for done < per {
				now := time.Now()
				el := now.Sub(t0)
				due := per - done
				if perMS > 0 {
					due = min(per, int64(float64(el.Microseconds())/1000*perMS)+1) - done
					// The oldest due Take was scheduled at done/perMS ms.
					if d := el - time.Duration(float64(done)/perMS*float64(time.Millisecond)); d > late[i] {
						late[i] = d
					}
				}
				for range due {
					switch {
					case !now.Before(end):
						outside[i]++
					case n.store.Take(bucketOf(lim.Algorithm), key, lim, now).Allowed:
						out[i] = append(out[i], el)
					}
				}
				done += due
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return out, 0, 0, fmt.Errorf("burst %s: %w", key, err)
	}
	var all int64
	for _, n := range outside {
		all += n
	}
	return out, all, slices.Max(late[:]), nil
}
