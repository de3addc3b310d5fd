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

// The scale scenario runs internal/replicate's BenchmarkReplicationScale (N
// nodes in one process on a real nats-server, a hot and a flood load) in
// this tree and in the tree of --shares-baseline-ref (that commit with
// this tree's benchmark file), so before and after are measured in one
// run. docs/replication-scale.md models these figures.

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
	s.build()
	return nil
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
	// Rows join, per node count and load, both trees.
	Rows []ScaleRow `json:"rows"`
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

// ScaleRow is one node count and load: both trees' figures.
type ScaleRow struct {
	Nodes  int           `json:"nodes"`
	Load   string        `json:"load"`
	Before *ScaleMetrics `json:"before,omitempty"`
	After  *ScaleMetrics `json:"after,omitempty"`
	// InBRatio is the after tree's in-bytes per 1k hits over the before
	// tree's; 0 when either is missing.
	InBRatio float64 `json:"in_b_ratio,omitempty"`
}

// build joins the trees' rows.
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
		for _, n := range []int{3, 10, 30} {
			row := ScaleRow{Nodes: n, Load: load, Before: find(s.Before, n, load), After: find(s.After, n, load)}
			if row.Before == nil && row.After == nil {
				continue
			}
			if b, a := row.Before.value(mInB), row.After.value(mInB); b > 0 && row.After != nil {
				row.InBRatio = round(a/b, 4)
			}
			s.Rows = append(s.Rows, row)
		}
	}
}

// targetScaleFlood is the budget-shares target: a flood of keys hit once
// costs each node at most this share of the replication bytes it cost
// before.
const targetScaleFlood = 0.01

// scaleTarget judges the flood's in-bytes per node, after over before, at
// every node count.
func scaleTarget(res *Results) Target {
	t := Target{Name: "scale-flood", Goal: "a flood of keys hit once costs each node ≤ 1% of the replication bytes it cost before budget shares (in-bytes per node per 1k hits, after/before, 3, 10 and 30 nodes)"}
	s := res.Scale
	switch {
	case s == nil:
		return t
	case s.Before == nil || s.Before.Error != "":
		if s.Before != nil {
			t.Measured = "no baseline: " + s.Before.Error
		}
		return t
	}
	var parts []string
	worst, n := 0.0, 0
	for _, row := range s.Rows {
		if row.Load != "flood" || row.Before == nil || row.After == nil || row.Before.value(mInB) <= 0 {
			continue
		}
		n++
		worst = max(worst, row.InBRatio)
		parts = append(parts, fmt.Sprintf("%d nodes %.4f× (%.0f → %.0f B)", row.Nodes, row.InBRatio, row.Before.value(mInB), row.After.value(mInB)))
	}
	if n == 0 {
		return t
	}
	t.Value = worst
	t.Measured = strings.Join(parts, ", ") + "; before " + shortCommit(s.Before.Commit)
	t.judge(worst <= targetScaleFlood, "%.3f× against 0.01×", worst)
	return t
}

// writeScale writes the scale scenario's section.
func writeScale(b *md, res *Results, s *Scale) {
	b.f("## Replication at scale: 3, 10 and 30 nodes on one NATS\n\n")
	b.f("`%s`: N nodes in one process, each with its own NATS connection, on one nats-server process; %d hits per node count and load, spread evenly over the nodes. **hot**: 100 keys, each node going round all of them, at a steady 20,000 hits/s of the whole cluster (200/s per key) against 250 per 1 s window, so every hit is admitted and each key spends the end of every window past half its limit. **flood**: each hit on a key never seen before, as fast as the nodes go, against 100 per 60 s (a per-client-IP limit). Figures are per node, after every batch was received; *per 1k hits* is per thousand hits of the whole cluster. A batch reaches every other node, so in-bytes are out-bytes × (N−1). CPU per hit is the whole process's (the nodes and the load; nats-server runs apart). [docs/replication-scale.md](../../docs/replication-scale.md) models these figures from the wire format and the publishing rules, and says when one NATS server saturates.\n\n",
		s.Command, s.Benchtime)
	for _, t := range []*ScaleTree{s.Before, s.After} {
		switch {
		case t == nil:
		case t.Error != "":
			b.f("- **%s** (%s): not measured: %s\n", t.Tree, t.Ref, t.Error)
		case t.Tree == "before":
			b.f("- **before**: `%s` (`--shares-baseline-ref %s`) with this tree's `%s`, %.0fs.\n", t.Commit, t.Ref, scaleBenchFile, t.Seconds)
		default:
			b.f("- **after**: this tree, %.0fs.\n", t.Seconds)
		}
	}
	b.f("\n")
	b.table([]string{"load", "nodes:", "tree", "out-B/1k hits:", "in-B/1k hits:", "in-msgs/1k hits:", "merged/1k hits:", "in-B/node/s:", "CPU µs/hit:", "hits/s:", "anti-entropy entries/1k hits:", "sync-B/1k hits:", "slow-consumer events:"})
	for _, row := range s.Rows {
		for _, x := range []struct {
			tree string
			m    *ScaleMetrics
		}{{"before", row.Before}, {"after", row.After}} {
			if m := x.m; m != nil {
				b.f("| %s | %d | %s | %.0f | %.0f | %.2f | %.1f | %.0f | %.2f | %.0f | %.2f | %.0f | %.0f |\n", row.Load, row.Nodes, x.tree,
					m.value(mOutB), m.value(mInB), m.value(mInMsgs), m.value(mMerged), m.value(mInBs), m.value(mCPU), m.value(mHits), m.value(mAE), m.value(mSyncB), m.value(mSlow))
			}
		}
	}
	b.f("\nThe flood's per-second figures are over a burst of well under a second: its per-hit figures are the ones to read. *sync-B* is sync replies (warm starts and the resyncs that follow a slow-consumer event or a reconnection), each to one requester, and not in the other columns; a flood row that merged fewer than (N−1)/N × 1000 entries per 1k hits received entries that raised nothing (a sync reply had brought them first, or the minute ended before they arrived). A node's first anti-entropy round starts one period (10 s) after it started, so only a measurement that reached it shows anti-entropy entries (counted in out-B, in-B and merged too). The hot rows depend on when each node's goroutines get a CPU: on a loaded machine early batches go out later and fewer, and two runs of the same code differ most at 30 nodes.\n\n")
	if s.Before == nil || s.Before.Error != "" {
		return
	}
	b.f("After over before, same run:\n\n")
	b.table([]string{"load", "nodes:", "in-B:", "in-msgs:", "merged:", "CPU per hit:"})
	for _, row := range s.Rows {
		if row.Before != nil && row.After != nil {
			b.f("| %s | %d | **%s** | %s | %s | %s |\n", row.Load, row.Nodes, ratio(row.After.value(mInB), row.Before.value(mInB)),
				ratio(row.After.value(mInMsgs), row.Before.value(mInMsgs)), ratio(row.After.value(mMerged), row.Before.value(mMerged)),
				ratio(row.After.value(mCPU), row.Before.value(mCPU)))
		}
	}
	b.f("\nTarget: the flood rows' in-B ratio ≤ %.2f at every node count.\n\n", targetScaleFlood)
}

// ratio is a/b, or — when b is 0.
func ratio(a, b float64) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.4f", a/b)
}

// writeScaleMissed explains a missed flood target from the figures.
func writeScaleMissed(b *md, res *Results, t Target) {
	b.f("- **A flood's replication** (%s). ", t.Margin)
	for _, row := range res.Scale.Rows {
		if m := row.After; row.Load == "flood" && m != nil && m.value(mMerged) > 0 {
			b.f("At %d nodes each node still received %.0f entries (%.0f B) per 1k hits: every flood key is sent once, by the node that took it, to all the others. ",
				row.Nodes, m.value(mMerged), m.value(mInB))
			break
		}
	}
	b.f("Only a rule that sends keys near their share, not every changed key, removes that cost.\n")
}
