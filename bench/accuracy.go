package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

// The accuracy scenario runs bench/accuracy, three replicated nodes in one
// process on the public API of internal/counter and internal/replicate, against a
// nats-server of this run: built from this tree, and built from the tree
// of --shares-baseline-ref with this tree's bench/accuracy copied into it,
// so that the counter and replication of both are measured by the same
// program in the same run, one multiple at a time, alternating. The program must therefore
// use only API that the baseline has too; if it cannot be built there,
// the baseline is reported missing and this tree is still measured.

// accuracyMultiples are the offered loads, as multiples of the limit.
var accuracyMultiples = []float64{1.1, 2, 10, 100, 1000}

// accuracyDir is the program's package, relative to the repository root.
const accuracyDir = "bench/accuracy"

// accuracyDeps are the packages of this tree, beside the counter and
// replication it measures, that the program imports: copied into the
// baseline's tree with it.
var accuracyDeps = []string{"internal/cli", "internal/loadresult"}

// accuracyBurstScenarios is how many burst scenarios the program runs
// with --bursts all; each run of one takes up to two windows (a scenario
// in a key's second window, two).
const accuracyBurstScenarios = 6

// accuracyRunTime bounds one run of the program at one multiple: the
// windows counted, up to two not counted, the wait for a boundary, and
// the nodes' start and stop.
func (r *runner) accuracyRunTime() time.Duration {
	return time.Duration(r.opt.accWindows+3)*time.Second + 5*time.Second
}

// accuracyBurstTime bounds one run of the program's burst scenarios, each
// run opt.accWindows times.
func (r *runner) accuracyBurstTime() time.Duration {
	return time.Duration(accuracyBurstScenarios*(2*r.opt.accWindows+2))*time.Second + 5*time.Second
}

func (r *runner) accuracyEstimate() time.Duration {
	runs := 1
	if r.opt.sharesBaselineRef != "" {
		runs = 2
	}
	return time.Duration(runs)*(time.Duration(len(accuracyMultiples))*r.accuracyRunTime()+r.accuracyBurstTime()) + 30*time.Second // the builds
}

func (r *runner) accuracy(ctx context.Context) error {
	a := &Accuracy{}
	r.res.Accuracy = a
	h, err := r.startCluster(ctx, "acc", 0, "", 0) // nats-server only: the nodes are the program's
	if err != nil {
		if errors.Is(err, errNoNATS) {
			a.Skipped = err.Error()
		}
		return err
	}
	defer h.stop()

	bin := filepath.Join(r.tmp, "accuracy")
	if err := r.goBuild(ctx, r.root, bin, "./"+accuracyDir); err != nil {
		return err
	}
	var before string
	if ref := r.opt.sharesBaselineRef; ref != "" {
		a.Baseline = &FloorBaseline{Ref: ref}
		if before, err = r.buildAccuracyBaseline(ctx, a.Baseline); err != nil {
			a.Baseline.Error = firstLine(err.Error())
			r.note("accuracy: no baseline from %s: %v", ref, a.Baseline.Error)
		}
	}
	// One multiple at a time, then the bursts, this tree and the baseline
	// alternating (in turn first), so that both meet the same load on the
	// machine.
	phases := make([]float64, 0, len(accuracyMultiples)+1)
	phases = append(phases, accuracyMultiples...)
	phases = append(phases, 0) // 0: the burst scenarios
	for i, m := range phases {
		after := func() error {
			run, err := r.accuracyRun(ctx, "after", bin, h.natsURL, m)
			a.After = mergeAccuracy(a.After, run)
			return err
		}
		if before == "" {
			if err := after(); err != nil {
				return err
			}
			continue
		}
		// A baseline that fails ends the baseline's runs, not this tree's.
		baseline := func() error {
			run, err := r.accuracyRun(ctx, "before", before, h.natsURL, m)
			if err != nil {
				a.Baseline.Error = firstLine(err.Error())
				r.note("accuracy: the baseline failed at %s, measured no further: %v", accuracyStep(m), a.Baseline.Error)
				a.Before, before = nil, ""
				return nil
			}
			a.Before = mergeAccuracy(a.Before, run)
			return nil
		}
		steps := []func() error{after, baseline}
		if i%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
	}
	return nil
}

// mergeAccuracy appends run's rows to into (nil: run itself); run nil
// leaves into as it is.
func mergeAccuracy(into, run *loadresult.Accuracy) *loadresult.Accuracy {
	switch {
	case run == nil:
		return into
	case into == nil:
		return run
	}
	into.Rows = append(into.Rows, run.Rows...)
	into.Bursts = append(into.Bursts, run.Bursts...)
	into.ElapsedS += run.ElapsedS
	into.PeersSeen = into.PeersSeen && run.PeersSeen
	return into
}

// buildAccuracyBaseline builds bench/accuracy of this tree against the
// packages of b.Ref: that commit's tree (git archive, so no worktree is
// added to the repository) with this tree's bench/accuracy and
// accuracyDeps copied in. The tree is removed once the program is built.
func (r *runner) buildAccuracyBaseline(ctx context.Context, b *FloorBaseline) (string, error) {
	start := time.Now()
	src, commit, err := r.checkout(ctx, b.Ref, "accuracy-baseline")
	b.Commit = commit
	if src != "" {
		defer os.RemoveAll(src)
	}
	if err != nil {
		return "", err
	}
	for _, d := range append([]string{accuracyDir}, accuracyDeps...) {
		if err := copyDir(filepath.Join(r.root, d), filepath.Join(src, d)); err != nil {
			return "", fmt.Errorf("copy %s into the baseline tree: %w", d, err)
		}
	}
	progs, err := filepath.Glob(filepath.Join(src, accuracyDir, "*.go"))
	if err == nil {
		err = retarget(src, progs...)
	}
	if err != nil {
		return "", fmt.Errorf("retarget the program's imports to the baseline tree: %w", err)
	}
	bin := filepath.Join(r.tmp, "accuracy-baseline")
	if err := r.goBuild(ctx, src, bin, "./"+accuracyDir); err != nil {
		return "", err
	}
	b.BuildS = round1(time.Since(start).Seconds())
	return bin, nil
}

// copyDir replaces dst with the regular files of src (not its
// subfolders).
func copyDir(src, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// accuracyStep names a step of the scenario: a multiple, or 0 for the
// burst scenarios.
func accuracyStep(m float64) string {
	if m == 0 {
		return "the bursts"
	}
	return strconv.FormatFloat(m, 'g', -1, 64) + "×"
}

// accuracyRun runs one build of the program at multiple m (0: its burst
// scenarios instead) on natsURL (its own subject prefix, so that a late
// message of another run is not read) and keeps its output in
// runs/accuracy-<name>-x<m>.json (-bursts.json).
func (r *runner) accuracyRun(ctx context.Context, name, bin, natsURL string, m float64) (*loadresult.Accuracy, error) {
	mult := strconv.FormatFloat(m, 'g', -1, 64)
	label, timeout := "accuracy-"+name+"-x"+mult, r.accuracyRunTime()
	args := []string{"--nats-url", natsURL, "--subject-prefix", "accuracy." + name, "--windows", strconv.Itoa(r.opt.accWindows),
		"--sync-interval", clusterSync.String()}
	if m == 0 {
		label, timeout = "accuracy-"+name+"-bursts", r.accuracyBurstTime()
		args = append(args, "--multiples", "", "--bursts", "all", "--burst-runs", strconv.Itoa(r.opt.accWindows))
	} else {
		args = append(args, "--multiples", mult)
	}
	out, err := r.runTool(ctx, label, timeout+time.Minute, nil, r.root, bin, args...)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(r.runsDir, label+".json"), out, 0o644); err != nil {
		return nil, err
	}
	return parseAccuracy(out)
}

// parseAccuracy reads the program's output and checks that it holds rows
// or bursts.
func parseAccuracy(b []byte) (*loadresult.Accuracy, error) {
	var run loadresult.Accuracy
	if err := json.Unmarshal(b, &run); err != nil {
		return nil, fmt.Errorf("accuracy output: %w", err)
	}
	if (len(run.Rows) == 0 && len(run.Bursts) == 0) || run.Limit <= 0 {
		return nil, errors.New("accuracy output: no rows")
	}
	return &run, nil
}

// burstCell is min / median / max admitted per run as × of the limit.
func burstCell(x loadresult.AccuracyBurst, limit int64) string {
	l := float64(limit)
	return fmt.Sprintf("%.2f / %.2f / %.2f", float64(x.Min)/l, x.Median/l, float64(x.Max)/l)
}

// The accuracy targets: admitted per window as × of the limit.
const (
	targetAccOvershoot     = 1.10 // max, at 10× and 100× offered
	targetAccOvershootHigh = 1.2  // max, at 1000× offered
	targetAccFloor         = 0.95 // median, at 2× offered
	targetAccBurst         = 0.90 // min, a burst of 2× on one node of a new key
	targetAccBurstAll      = 1.5  // max, a burst of 2× on every node of a new key at once
)

// accuracyAlgorithms and accuracyDistributions are the rows' algorithms
// and distributions, in report order.
var (
	accuracyAlgorithms    = []string{"fixed", "sliding"}
	accuracyDistributions = []string{"even", "skewed"}
)

// accExtreme is the largest (or, with lowest, the smallest) of a figure
// over the rows of run at the multiples, and the row it came from; false
// if some algorithm has no row at one of them.
func accExtreme(run *loadresult.Accuracy, mults []float64, lowest bool, fig func(loadresult.AccuracyRow) float64) (float64, loadresult.AccuracyRow, bool) {
	var best float64
	var at loadresult.AccuracyRow
	found := false
	for _, alg := range accuracyAlgorithms {
		for _, m := range mults {
			seen := false
			for _, dist := range accuracyDistributions {
				row, ok := run.Row(alg, m, dist)
				if !ok {
					continue
				}
				seen = true
				x := fig(row) / float64(run.Limit)
				if !found || (lowest && x < best) || (!lowest && x > best) {
					best, at, found = x, row, true
				}
			}
			if !seen {
				return 0, loadresult.AccuracyRow{}, false
			}
		}
	}
	return best, at, found
}

func rowMax(r loadresult.AccuracyRow) float64    { return float64(r.Max) }
func rowMedian(r loadresult.AccuracyRow) float64 { return r.Median }

func accRowName(r loadresult.AccuracyRow) string {
	return fmt.Sprintf("%s %g× %s", r.Algorithm, r.Multiple, r.Distribution)
}

// accuracyTargets judges this tree's accuracy run (the baseline's figures
// are given beside it): the max per window against the overshoot goals,
// the median per window against the floor at 2×, the bursts on a new key.
func accuracyTargets(res *Results) []Target {
	over := Target{Name: "accuracy-overshoot", Goal: "3 nodes: admitted ≤ 1.10× the limit at 10× and 100× offered, ≤ 1.2× at 1000×; fixed and sliding, even and 90%-skewed (max per window, in process)"}
	floor := Target{Name: "accuracy-floor", Goal: "3 nodes: ≥ 0.95× of the limit admitted at 2× offered, even and 90%-skewed, fixed and sliding (median per window, in process)"}
	burst := Target{Name: "accuracy-burst", Goal: "3 nodes, a key no node has seen: 2× the limit back to back on one node admits ≥ 0.90× the limit (min over runs), and 2× on every node at once ≤ 1.5× in its first window (max over runs; in process)"}
	return []Target{
		accTarget(res.Accuracy, over, func(run *loadresult.Accuracy) (float64, []string, string, bool) {
			mid, midAt, ok1 := accExtreme(run, []float64{10, 100}, false, rowMax)
			high, highAt, ok2 := accExtreme(run, []float64{1000}, false, rowMax)
			if !ok1 || !ok2 {
				return 0, nil, "no rows at 10×, 100× and 1000× for both algorithms", false
			}
			var miss []string
			if mid > targetAccOvershoot+1e-9 {
				miss = append(miss, fmt.Sprintf("%.2f× at 10×/100× against 1.10×", mid))
			}
			if high > targetAccOvershootHigh+1e-9 {
				miss = append(miss, fmt.Sprintf("%.2f× at 1000× against 1.2×", high))
			}
			return max(mid, high), miss, fmt.Sprintf("max %.2f× at 10×/100× (%s), %.2f× at 1000× (%s)", mid, accRowName(midAt), high, accRowName(highAt)), true
		}),
		accTarget(res.Accuracy, floor, func(run *loadresult.Accuracy) (float64, []string, string, bool) {
			lo, at, ok := accExtreme(run, []float64{2}, true, rowMedian)
			if !ok {
				return 0, nil, "no rows at 2× for both algorithms", false
			}
			text := fmt.Sprintf("lowest median %.2f× at 2× (%s)", lo, accRowName(at))
			var just []string
			for _, alg := range accuracyAlgorithms {
				for _, dist := range accuracyDistributions {
					if row, ok := run.Row(alg, 1.1, dist); ok {
						just = append(just, fmt.Sprintf("%s %s %.2f×", alg, dist, row.Median/float64(run.Limit)))
					}
				}
			}
			if len(just) > 0 {
				text += "; at 1.1× (not judged) median " + strings.Join(just, ", ")
			}
			var miss []string
			if lo < targetAccFloor-1e-9 {
				miss = append(miss, fmt.Sprintf("%.2f× against 0.95×", lo))
			}
			return lo, miss, text, true
		}),
		accTarget(res.Accuracy, burst, func(run *loadresult.Accuracy) (float64, []string, string, bool) {
			x, ok1 := run.Burst("one")
			y, ok2 := run.Burst("all-instant")
			if !ok1 || !ok2 {
				return 0, nil, "no bursts one and all-instant", false
			}
			l := float64(run.Limit)
			one, all := float64(x.Min)/l, float64(y.Max)/l
			var miss []string
			if one < targetAccBurst-1e-9 {
				miss = append(miss, fmt.Sprintf("%.2f× on one node against 0.90×", one))
			}
			if all > targetAccBurstAll+1e-9 {
				miss = append(miss, fmt.Sprintf("%.2f× on every node against 1.5×", all))
			}
			return one, miss, fmt.Sprintf("one node min %.2f× (median %.2f×), every node at once max %.2f×", one, x.Median/l, all), true
		}),
	}
}

// accTarget judges this tree's run of a by judge, which returns the
// target's value, how it missed its goal (nothing: met) and the figures,
// and gives the baseline's figures beside them.
func accTarget(a *Accuracy, t Target, judge func(*loadresult.Accuracy) (float64, []string, string, bool)) Target {
	switch {
	case a == nil:
		return t
	case a.After == nil:
		if a.Skipped != "" {
			t.Measured = "skipped: " + a.Skipped
		}
		return t
	}
	v, miss, text, ok := judge(a.After)
	t.Measured = "this tree: " + text
	if ok {
		t.Value, t.Met, t.Margin = round(v, 3), ptr(len(miss) == 0), strings.Join(miss, ", ")
	}
	switch {
	case a.Before != nil:
		_, _, btext, _ := judge(a.Before)
		t.Measured += "; before (" + shortCommit(a.Baseline) + "): " + btext
	case a.Baseline != nil && a.Baseline.Error != "":
		t.Measured += "; no baseline: " + a.Baseline.Error
	}
	return t
}

// writeAccuracyReport writes the accuracy scenario's section: a table
// per algorithm, offered load × distribution, before and this tree side
// by side.
func writeAccuracyReport(b *md, res *Results, a *Accuracy) {
	b.f("## Cluster accuracy from 1.1× to 1000× the limit (in process)\n\n")
	if a.Skipped != "" || a.After == nil {
		b.f("Not measured: %s.\n\n", cmp.Or(a.Skipped, "the run failed (see Notes)"))
		return
	}
	run := a.After
	b.f("`bench/accuracy`: %d nodes in one process, each with its own `counter.Store`, `replicate.Replicator` and NATS connection, on one nats-server of this run; limit %d per %d ms window, sync interval %s. Each row offers one key a multiple of its limit at a fixed rate, each node taking every 1 ms the Takes that have come due, spread **even** (a third per node) or **skewed** (90%%, 5%%, 5%%); the rows of one multiple ran at once, the multiples one after the other. Admitted = Takes admitted in each whole window, by the window each Take was made in; the first, partial window is not counted, nor, for sliding windows, the first whole one (its previous window is empty); %d windows per row. Each cell is min / median / max admitted per window as × of the limit.",
		run.Nodes, run.Limit, run.WindowMS, run.SyncInterval, run.Windows)
	switch {
	case a.Before != nil:
		b.f(" **before**: the same program built against the packages of `%s` (`--shares-baseline-ref`), on the same nats-server, one multiple at a time, the two builds alternating (in turn first).", a.Baseline.Commit)
	case a.Baseline != nil && a.Baseline.Error != "":
		b.f(" No baseline (%s): %s.", a.Baseline.Ref, a.Baseline.Error)
	}
	b.f(" The targets judge this tree: the max per window for the overshoot, the median per window for the floor at 2×.\n\n")
	if !run.PeersSeen {
		b.f("(This tree's nodes did not report their peers before the load; they were given two heartbeats instead.)\n\n")
	}
	// A row whose pacing fell behind by more than a sync interval was
	// offered its load in bursts (the machine did not run the process in
	// time): its figures are marked.
	syncMS := 100.0
	if d, err := time.ParseDuration(run.SyncInterval); err == nil {
		syncMS = float64(d.Milliseconds())
	}
	marked := false
	cell := func(x loadresult.AccuracyRow, lim int64) string {
		l := float64(lim)
		c := fmt.Sprintf("%.2f / %.2f / %.2f", float64(x.Min)/l, x.Median/l, float64(x.Max)/l)
		if x.MaxBehindMS > syncMS {
			c += " †"
			marked = true
		}
		return c
	}
	behind := func(x loadresult.AccuracyRow) string { return fmt.Sprintf("%.0f ms", x.MaxBehindMS) }
	for _, alg := range accuracyAlgorithms {
		b.f("**%s**\n\n", alg)
		b.table(a.beside([]string{"offered:", "spread"}, "before:"), "this tree:", "windows:", "pacing behind ≤:")
		for _, row := range run.Rows {
			if row.Algorithm != alg {
				continue
			}
			b.f("| %g× | %s |", row.Multiple, row.Distribution)
			pacing := behind(row)
			if a.Before != nil {
				if x, ok := a.Before.Row(row.Algorithm, row.Multiple, row.Distribution); ok {
					b.f(" %s |", cell(x, a.Before.Limit))
					pacing = behind(x) + " / " + pacing
				} else {
					b.f(" — |")
					pacing = "— / " + pacing
				}
			}
			b.f(" **%s** | %d | %s |\n", cell(row, run.Limit), row.Windows, pacing)
		}
		b.f("\n")
	}
	writeAccuracyBursts(b, a)
	b.f("*Pacing behind* is how late, at most, a node took the oldest Take due (before / this tree): the offered rate held to within it.")
	if marked {
		b.f(" † marks a row whose pacing fell behind by more than a sync interval (%g ms): the process was not run in time, its load came in bursts, and the nodes could not hear each other meanwhile, so its figures say more about the machine than about the cluster.", syncMS)
	}
	b.f("\n\n")
	b.f("<details><summary>admitted per window</summary>\n\n")
	b.table(a.beside([]string{"window", "offered:", "spread"}, "before"), "this tree")
	for _, row := range run.Rows {
		b.f("| %s | %g× | %s |", row.Algorithm, row.Multiple, row.Distribution)
		if a.Before != nil {
			x, _ := a.Before.Row(row.Algorithm, row.Multiple, row.Distribution)
			b.f(" %s |", strings.Trim(fmt.Sprint(x.Admitted), "[]"))
		}
		b.f(" %s |\n", strings.Trim(fmt.Sprint(row.Admitted), "[]"))
	}
	b.f("\n</details>\n\n")
}

// beside is the columns cols, then the baseline's columns when a has a
// baseline run.
func (a *Accuracy) beside(cols []string, baseline ...string) []string {
	if a.Before != nil {
		return append(cols, baseline...)
	}
	return cols
}

// accuracyBurstText says what each burst scenario offers.
var accuracyBurstText = map[string]string{
	"one":         "2× back to back on one node (5 Takes a ms per 100 of the limit)",
	"paced":       "2× on one node, 1 Take a ms per 100 of the limit",
	"round-robin": "2× in turn over the 3 nodes, 5 a ms per 100 in all",
	"all":         "2× on every node, 5 a ms per 100 each",
	"all-instant": "2× on every node, each node's all at once: the first window's worst case",
	"next":        "2× back to back on one node, in the key's second window",
}

// writeAccuracyBursts writes the burst scenarios' table: admitted per run
// as × of the limit, and when 90% of it was admitted.
func writeAccuracyBursts(b *md, a *Accuracy) {
	run := a.After
	if len(run.Bursts) == 0 {
		return
	}
	b.f("**Bursts on a key no node has seen** (fixed windows; each run on a new key, %d ms into a window of its own; admitted in the key's window as × of the limit, min / median / max over the runs; *90%% after* is the median time from the burst's start until the cluster had admitted 90%% of the limit, — when it never did in most runs)\n\n", 50)
	b.table(a.beside([]string{"burst"}, "before:", "90% after:"), "this tree:", "90% after:", "runs:")
	reach := func(x loadresult.AccuracyBurst) string {
		s := slices.Clone(x.Reach90MS)
		slices.Sort(s)
		if len(s) == 0 || s[len(s)/2] < 0 {
			return "—"
		}
		return fmt.Sprintf("%.0f ms", s[len(s)/2])
	}
	marked := false
	cell := func(x loadresult.AccuracyBurst, limit int64) string {
		c := burstCell(x, limit)
		if slices.ContainsFunc(x.Late, func(n int64) bool { return n > 0 }) {
			c += " ‡"
			marked = true
		}
		return c
	}
	for _, x := range run.Bursts {
		b.f("| %s |", cmp.Or(accuracyBurstText[x.Scenario], x.Scenario))
		if a.Before != nil {
			if y, ok := a.Before.Burst(x.Scenario); ok {
				b.f(" %s | %s |", cell(y, a.Before.Limit), reach(y))
			} else {
				b.f(" — | — |")
			}
		}
		b.f(" **%s** | %s | %d |\n", cell(x, run.Limit), reach(x), x.Runs)
	}
	if marked {
		b.f("\n‡ some runs' drivers were stalled past the key's window: the Takes they made after it are not counted.\n")
	}
	b.f("\n")
}

// writeAccuracyAnalysis explains a missed accuracy target: the rows that
// missed it.
func writeAccuracyAnalysis(b *md, res *Results, t Target) {
	run := res.Accuracy.After
	if t.Name == "accuracy-burst" {
		b.f("- **Bursts on a new key** (%s). A node admits a key no node knows a count of up to its first share (1.5/N of the limit) before its first report is answered, then, each time a report of its own is a share delay old (the early gap plus twice the delivery delay), its share of what remains in proportion to the hits every node knows of: a burst on one node that ends within a few such rounds stops short of the limit, and nodes that all burst before hearing of each other admit up to a first share each.\n", t.Margin)
		return
	}
	lim := float64(run.Limit)
	var rows []string
	for _, row := range run.Rows {
		switch {
		case t.Name == "accuracy-overshoot" && (row.Multiple == 10 || row.Multiple == 100) && float64(row.Max)/lim > targetAccOvershoot+1e-9,
			t.Name == "accuracy-overshoot" && row.Multiple == 1000 && float64(row.Max)/lim > targetAccOvershootHigh+1e-9:
			rows = append(rows, fmt.Sprintf("%s max %.2f×", accRowName(row), float64(row.Max)/lim))
		case t.Name == "accuracy-floor" && row.Multiple == 2 && row.Median/lim < targetAccFloor-1e-9:
			rows = append(rows, fmt.Sprintf("%s median %.2f×", accRowName(row), row.Median/lim))
		}
	}
	if t.Name == "accuracy-overshoot" {
		b.f("- **Cluster accuracy, overshoot** (%s): %s. Each node admits on its own view of the counts until the others' next batch arrives; at m× the limit the whole limit is offered within 1/m of a window (%g ms at 100×, %g ms at 1000×), less than a batch needs to arrive, so each node can admit what it has not yet seen the others admit.\n",
			t.Margin, strings.Join(rows, ", "), float64(run.WindowMS)/100, float64(run.WindowMS)/1000)
		return
	}
	b.f("- **Cluster accuracy at 2×** (%s): %s. Under the limit means the nodes refused hits while budget was left: a node believed the others had spent more of it than they had, or kept budget for load that did not come to it.\n",
		t.Margin, strings.Join(rows, ", "))
}

// Accuracy is the accuracy scenario: bench/accuracy's output for this
// tree and for the baseline commit, measured in the same run.
type Accuracy struct {
	Skipped string `json:"skipped,omitempty"`
	// After is this tree's run; Before the baseline's (nil: not measured,
	// Baseline.Error says why when it was asked for).
	After    *loadresult.Accuracy `json:"after,omitempty"`
	Before   *loadresult.Accuracy `json:"before,omitempty"`
	Baseline *FloorBaseline       `json:"baseline,omitempty"`
}
