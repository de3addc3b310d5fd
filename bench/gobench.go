package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// microPackages are the hot-path packages whose Go benchmarks make bench
// runs.
var microPackages = []string{"./internal/counter/", "./internal/match/", "./internal/authz/"}

// benchstatTool is run with `go run tool@version`, which neither reads nor
// changes the project's go.mod.
const benchstatTool = "golang.org/x/perf/cmd/benchstat@latest"

// micro runs the Go microbenchmarks and summarises them with benchstat,
// against the previous run's file when there is one.
func (r *runner) micro(ctx context.Context) error {
	raw := filepath.Join(r.out, "micro.txt")
	prev := filepath.Join(r.out, "micro.prev.txt")
	// A benchfmt configuration line: benchstat shows it, and a previous
	// file is compared with only when its settings were the same.
	settings := fmt.Sprintf("microsettings: count=%d benchtime=%s\n", r.opt.count, r.opt.benchtime)
	compare := false
	if old, err := os.ReadFile(raw); err == nil {
		if err := os.Rename(raw, prev); err != nil {
			return err
		}
		compare = strings.HasPrefix(string(old), settings)
	}
	args := []string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-count=" + strconv.Itoa(r.opt.count), "-benchtime=" + r.opt.benchtime}
	args = append(args, microPackages...)
	m := &Micro{Command: "go " + strings.Join(args, " ")}
	r.res.Micro = m
	r.printf("%s\n", m.Command)
	out, err := r.runTool(ctx, "micro", 8*time.Minute, nil, r.root, "go", args...)
	if werr := os.WriteFile(raw, append([]byte(settings), out...), 0o644); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		m.Error = err.Error()
		return err
	}
	inputs := []string{"current=" + raw}
	if compare {
		inputs = []string{"previous=" + prev, "current=" + raw}
	}
	// From the temporary folder: outside the module, whatever the mode.
	stat, err := r.runTool(ctx, "benchstat", 3*time.Minute, nil, r.tmp, "go", append([]string{"run", benchstatTool}, inputs...)...)
	if err != nil {
		err = fmt.Errorf("benchstat: %w", err)
		m.Error = err.Error()
		return err
	}
	m.Benchstat = strings.TrimSpace(string(stat))
	m.Compared = compare
	if err := os.WriteFile(filepath.Join(r.out, "micro-benchstat.txt"), stat, 0o644); err != nil {
		return err
	}
	r.printf("%s\n", m.Benchstat)
	if compare {
		r.printf("(compared with the previous run's %s; both on this machine)\n", filepath.Base(prev))
	}
	return nil
}

// plotPNGs draws the plots with scripts/plot.py (matplotlib in .tools/venv,
// installed by scripts/install-plot.sh).
func (r *runner) plotPNGs(ctx context.Context) error {
	out, err := r.runTool(ctx, "install-plot", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-plot.sh"))
	if err != nil {
		r.res.PlotError = "matplotlib not installed: " + err.Error()
		return err
	}
	py := lastLine(out)
	out, err = r.runTool(ctx, "plot", 2*time.Minute, nil, r.root, py, filepath.Join(r.root, "scripts", "plot.py"),
		filepath.Join(r.out, "results.json"), r.out)
	if err != nil {
		r.res.PlotError = err.Error()
		return err
	}
	r.res.Plots = nil
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		if name := strings.TrimSpace(line); strings.HasSuffix(name, ".png") {
			r.res.Plots = append(r.res.Plots, filepath.Base(name))
		}
	}
	r.printf("plots: %s\n", strings.Join(r.res.Plots, ", "))
	if len(r.res.Plots) == 0 {
		return fmt.Errorf("plot.py wrote no plot")
	}
	return nil
}

// The scale scenario runs internal/replicate's BenchmarkReplicationScale
// (N nodes in one process on a real nats-server, a hot and a flood load).
// docs/replication-scale.md models these figures.

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
	args := []string{"test", "-run", "^$", "-bench", "ReplicationScale", "-benchtime", strconv.Itoa(s.Benchtime) + "x", "-timeout", "5m", "./internal/replicate/"}
	s.Command = "go " + strings.Join(args, " ")
	start := time.Now()
	out, err := r.runTool(ctx, "scale", 6*time.Minute, []string{"NATS_SERVER_BIN=" + natsBin, "CI=true"}, r.root, "go", args...)
	os.WriteFile(filepath.Join(r.runsDir, "scale.txt"), out, 0o644)
	if err != nil {
		return err
	}
	s.Seconds = round1(time.Since(start).Seconds())
	if s.Rows, err = parseScaleBench(string(out)); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	r.printf("scale: %d sub-benchmarks in %.0fs\n", len(s.Rows), s.Seconds)
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
	Benchtime int            `json:"benchtime"`
	Command   string         `json:"command"`
	Seconds   float64        `json:"seconds"`
	Rows      []ScaleMetrics `json:"rows"`
}

// ScaleMetrics is one sub-benchmark: its figures by unit.
type ScaleMetrics struct {
	Nodes  int                `json:"nodes"`
	Load   string             `json:"load"`
	Hits   int                `json:"hits"`
	Values map[string]float64 `json:"values"`
}

// targetScaleFlood is the budget-shares target: a flood of keys hit once
// costs each node at most this share of the replication bytes it costs
// with every change replicated.
const targetScaleFlood = 0.01

// scaleTarget judges the flood's in-bytes per node with budget shares
// over without, at every node count.
func scaleTarget(res *Results) Target {
	t := Target{Name: "scale-flood", Goal: "a flood of keys hit once costs each node ≤ 1% of the replication bytes it costs with every change replicated (in-bytes per node per 1k hits, budget shares over --budget-shares=false, 3, 10 and 30 nodes)"}
	if res.Scale == nil {
		return t
	}
	row := func(nodes int, load string) (float64, bool) {
		m, ok := first(res.Scale.Rows, func(m ScaleMetrics) bool { return m.Nodes == nodes && m.Load == load })
		v, has := m.Values[mInB]
		return v, ok && has
	}
	var parts []string
	worst := 0.0
	for _, n := range []int{3, 10, 30} {
		after, ok1 := row(n, "flood")
		before, ok2 := row(n, "flood-noshares")
		if !ok1 || !ok2 || before <= 0 {
			return t
		}
		worst = max(worst, after/before)
		parts = append(parts, fmt.Sprintf("%d nodes %.0f B of %.0f B (%.4f×)", n, after, before, after/before))
	}
	t.Value, t.Measured = round(worst, 4), strings.Join(parts, ", ")
	t.judge(worst <= targetScaleFlood, "%.3f× against 0.01×", worst)
	return t
}

// writeScale writes the scale scenario's section.
func writeScale(b *md, res *Results, s *Scale) {
	b.f("## Replication at scale: 3, 10 and 30 nodes on one NATS\n\n")
	b.f("`%s` (%.0fs): N nodes in one process, each with its own NATS connection, on one nats-server process; %d hits per node count and load, spread evenly over the nodes. **hot**: 100 keys, each node going round all of them, at a steady 20,000 hits/s of the whole cluster (200/s per key) against 250 per 1 s window, so every hit is admitted and each key spends the end of every window past half its limit. **flood**: each hit on a key never seen before, as fast as the nodes go, against 100 per 60 s (a per-client-IP limit). **…-noshares**: the same without budget shares (`--budget-shares=false`: every change replicated, each node admitting on its own view). Figures are per node, after every batch was received; *per 1k hits* is per thousand hits of the whole cluster. A batch reaches every other node, so in-bytes are out-bytes × (N−1). CPU per hit is the whole process's (the nodes and the load; nats-server runs apart). [docs/replication-scale.md](../../docs/replication-scale.md) models these figures from the wire format and the publishing rules, and says when one NATS server saturates.\n\n",
		s.Command, s.Seconds, s.Benchtime)
	b.table([]string{"load", "nodes:", "out-B/1k hits:", "in-B/1k hits:", "in-msgs/1k hits:", "merged/1k hits:", "in-B/node/s:", "CPU µs/hit:", "hits/s:", "anti-entropy entries/1k hits:", "sync-B/1k hits:", "slow-consumer events:"})
	for _, m := range s.Rows {
		v := m.Values
		b.f("| %s | %d | %.0f | %.0f | %.2f | %.1f | %.0f | %.2f | %.0f | %.2f | %.0f | %.0f |\n", m.Load, m.Nodes,
			v[mOutB], v[mInB], v[mInMsgs], v[mMerged], v[mInBs], v[mCPU], v[mHits], v[mAE], v[mSyncB], v[mSlow])
	}
	b.f("\nThe flood's per-second figures are over a burst of well under a second: its per-hit figures are the ones to read. *sync-B* is sync replies (warm starts and the resyncs that follow a slow-consumer event or a reconnection), each to one requester, and not in the other columns. A node's first anti-entropy round starts one period (10 s) after it started, so only a measurement that reached it shows anti-entropy entries (counted in out-B, in-B and merged too). The hot rows depend on when each node's goroutines get a CPU: on a loaded machine early batches go out later and fewer, and two runs of the same code differ most at 30 nodes.\n\n")
}
