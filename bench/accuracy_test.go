package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// TestAccuracyCluster runs the in-process cluster briefly on a real
// nats-server: its rows count whole windows in which the offered load held
// its rate and the admitted hits are possible ones, and its bursts admit
// no more than a node or the cluster can.
func TestAccuracyCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testnats.Run(t)
	cl, err := startAccCluster(ctx, srv.ClientURL(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.stop()
	const mult, windows = 10, 2
	rows, err := cl.phase(ctx, mult, windows)
	if err != nil {
		t.Fatal(err)
	}
	a := &Accuracy{Nodes: accNodes, Limit: accLimit, Rows: rows}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want fixed and sliding × even and skewed", len(rows))
	}
	for _, alg := range accuracyAlgorithms {
		for _, dist := range accuracyDistributions {
			row, ok := a.Row(alg, mult, dist)
			if !ok {
				t.Errorf("no row %s %s", alg, dist)
				continue
			}
			checkAccuracyRow(t, row, accNodes, accLimit, mult, windows)
		}
	}
	// Bursts: each run on a key no node has seen. One node never admits
	// more than the limit; every node at once at most their first shares,
	// 1.5× the limit.
	for _, spec := range []burstSpec{burstSpecs[0], burstSpecs[4]} {
		b, err := cl.burst(ctx, spec, 2)
		if err != nil {
			t.Fatal(err)
		}
		most := int64(accLimit)
		if len(spec.nodes) == accNodes {
			most = accLimit * 3 / 2
		}
		if b.Runs != 2 || len(b.Admitted) != 2 || len(b.AdmittedPerNode) != 2 || len(b.Reach90MS) != 2 {
			t.Errorf("%s: %+v", b.Scenario, b)
			continue
		}
		for i, adm := range b.Admitted {
			var sum int64
			for _, n := range b.AdmittedPerNode[i] {
				sum += n
			}
			if adm < 1 || adm > most || sum != adm {
				t.Errorf("%s run %d: admitted %d (per node %v), want 1 to %d", b.Scenario, i, adm, b.AdmittedPerNode[i], most)
			}
		}
	}
	if err := cl.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestSummarise: the first, partial window is never counted, nor for a
// sliding window the first whole one; then the given number of windows.
func TestSummarise(t *testing.T) {
	for _, tc := range []struct {
		skip int
		want []int64
	}{{1, []int64{11, 12}}, {2, []int64{12, 13}}} {
		rr := &rowRun{skip: tc.skip}
		for n := range accNodes {
			// Window s holds 10+s admitted in all, of 100 offered: node 0
			// admitted all but 2 of them, the others 1 each.
			rr.counts[n] = make([][2]int64, 4)
			for s := range rr.counts[n] {
				adm := int64(1)
				if n == 0 {
					adm = int64(10 + s - 2)
				}
				rr.counts[n][s] = [2]int64{int64(100 / accNodes), adm}
			}
		}
		rr.behind[2] = 3 * time.Millisecond
		r := rr.summarise(2)
		if !slices.Equal(r.Admitted, tc.want) || r.Windows != 2 ||
			r.Min != tc.want[0] || r.Max != tc.want[1] || r.Median != float64(tc.want[0]+tc.want[1])/2 || r.MaxBehindMS != 3 {
			t.Errorf("skip %d: %+v, want admitted %v", tc.skip, r, tc.want)
		}
		if r.Offered[0] != 99 || !slices.Equal(r.AdmittedPerNode[0], []int64{tc.want[0] - 2, 1, 1}) {
			t.Errorf("skip %d: offered %v, per node %v", tc.skip, r.Offered, r.AdmittedPerNode)
		}
	}
	// Fewer windows than asked for: only those there are.
	rr := &rowRun{skip: 2}
	for n := range accNodes {
		rr.counts[n] = make([][2]int64, 3)
	}
	if r := rr.summarise(5); r.Windows != 1 {
		t.Errorf("3 slots, skip 2: %d windows, want 1", r.Windows)
	}
}

func checkAccuracyRow(t *testing.T, row AccuracyRow, nodes int, limit int64, mult float64, windows int) {
	t.Helper()
	name := accRowName(row)
	if row.Windows != windows || len(row.Admitted) != windows || len(row.Offered) != windows || len(row.AdmittedPerNode) != windows {
		t.Fatalf("%s: %d windows, %d admitted, %d offered, %d per node, want %d", name, row.Windows, len(row.Admitted), len(row.Offered), len(row.AdmittedPerNode), windows)
	}
	want := int64(mult * float64(limit))
	lo, hi := row.Admitted[0], row.Admitted[0]
	for i, adm := range row.Admitted {
		// The Takes due in a window are made in it (a late batch catches
		// up within milliseconds), so each whole window was offered its
		// share of the rate.
		if off := row.Offered[i]; off < want*8/10 || off > want*12/10 {
			t.Errorf("%s window %d: offered %d, want about %d", name, i, off, want)
		}
		// A node counts its own hits and refuses at the limit, so no
		// node admits more than the limit in a window; the cluster at 10×
		// admits at least half of it.
		var sum int64
		for n, a := range row.AdmittedPerNode[i] {
			if a < 0 || a > limit {
				t.Errorf("%s window %d: node %d admitted %d of limit %d", name, i, n, a, limit)
			}
			sum += a
		}
		if sum != adm || len(row.AdmittedPerNode[i]) != nodes {
			t.Errorf("%s window %d: per node %v, in all %d", name, i, row.AdmittedPerNode[i], adm)
		}
		if adm < limit/2 || adm > row.Offered[i] {
			t.Errorf("%s window %d: admitted %d of %d offered, limit %d", name, i, adm, row.Offered[i], limit)
		}
		lo, hi = min(lo, adm), max(hi, adm)
	}
	if row.Min != lo || row.Max != hi || row.Median < float64(lo) || row.Median > float64(hi) {
		t.Errorf("%s: min %d median %g max %d of %v", name, row.Min, row.Median, row.Max, row.Admitted)
	}
}

// accRows fabricates a full run: every algorithm, multiple and
// distribution, each admitting adm(alg, multiple, distribution) in each
// of two windows.
func accRows(limit int64, adm func(alg string, m float64, dist string) int64) *Accuracy {
	run := &Accuracy{Nodes: 3, Limit: limit, WindowMS: 1000, SyncInterval: "100ms", Windows: 2}
	for _, m := range []float64{1.1, 2, 10, 100, 1000} {
		for _, alg := range accuracyAlgorithms {
			for _, dist := range accuracyDistributions {
				a := adm(alg, m, dist)
				run.Rows = append(run.Rows, AccuracyRow{Algorithm: alg, Multiple: m, Distribution: dist, Windows: 2,
					Min: a, Median: float64(a), Max: a, Admitted: []int64{a, a}, Offered: []int64{int64(m * float64(limit)), int64(m * float64(limit))}})
			}
		}
	}
	return run
}

func TestAccuracyTargets(t *testing.T) {
	exact := func(string, float64, string) int64 { return 100 }
	judge := func(a *Accuracy) map[string]Target {
		got := map[string]Target{}
		for _, tg := range targets(&Results{Accuracy: a}) {
			got[tg.Name] = tg
		}
		return got
	}
	for name, tc := range map[string]struct {
		adm             func(string, float64, string) int64
		overMet, floMet bool
		margin          string
	}{
		"exact":        {exact, true, true, ""},
		"at the goals": {func(_ string, m float64, _ string) int64 { return map[bool]int64{true: 120, false: 110}[m == 1000] }, true, true, ""},
		"over at 100× skewed": {func(_ string, m float64, d string) int64 {
			return map[bool]int64{true: 111, false: 100}[m == 100 && d == "skewed"]
		}, false, true, "1.11× at 10×/100×"},
		"over at 1000× only": {func(_ string, m float64, _ string) int64 { return map[bool]int64{true: 121, false: 100}[m == 1000] }, false, true, "1.21× at 1000×"},
		"1.1× is not judged": {func(_ string, m float64, _ string) int64 { return map[bool]int64{true: 300, false: 100}[m == 1.1] }, true, true, ""},
		"under at 2× sliding": {func(a string, m float64, _ string) int64 {
			return map[bool]int64{true: 94, false: 100}[m == 2 && a == "sliding"]
		}, true, false, "0.94× against 0.95×"},
	} {
		got := judge(accRows(100, tc.adm))
		over, flo := got["accuracy-overshoot"], got["accuracy-floor"]
		if over.Met == nil || *over.Met != tc.overMet || flo.Met == nil || *flo.Met != tc.floMet {
			t.Errorf("%s: overshoot %+v, floor %+v; want met %v, %v", name, over, flo, tc.overMet, tc.floMet)
		}
		if !strings.Contains(over.Margin+flo.Margin, tc.margin) || (tc.margin == "" && over.Margin+flo.Margin != "") {
			t.Errorf("%s: margins %q, %q, want %q", name, over.Margin, flo.Margin, tc.margin)
		}
		if !strings.Contains(flo.Measured, "at 1.1× (not judged)") {
			t.Errorf("%s: measured %q, %q", name, over.Measured, flo.Measured)
		}
	}

	// A run without the rows a target needs is not judged.
	partial := accRows(100, exact)
	partial.Rows = partial.Rows[:len(partial.Rows)-4] // no 1000×
	got := judge(partial)
	if tg := got["accuracy-overshoot"]; tg.Met != nil || !strings.Contains(tg.Measured, "no rows") {
		t.Errorf("no 1000× rows: %+v", tg)
	}
	if tg := got["accuracy-floor"]; tg.Met == nil || !*tg.Met {
		t.Errorf("floor with 2× rows: %+v", tg)
	}
	got = judge(&Accuracy{Skipped: "nats-server not available"})
	if tg := got["accuracy-floor"]; tg.Met != nil || !strings.Contains(tg.Measured, "skipped") {
		t.Errorf("skipped: %+v", tg)
	}
}

func TestAccuracyReport(t *testing.T) {
	out := t.TempDir()
	after := accRows(100, func(a string, m float64, d string) int64 {
		if a == "fixed" && m == 100 && d == "even" {
			return 250
		}
		return 100
	})
	after.Rows[0].Admitted = []int64{97, 99}
	after.Rows[0].Min, after.Rows[0].Median, after.Rows[0].Max = 97, 98, 99
	after.Rows[1].MaxBehindMS = 150 // fixed 1.1× skewed: more than a sync interval
	accBursts(after, []int64{80, 85}, []int64{150, 150})
	after.Bursts[1].Late = []int64{0, 12} // paced: a run stalled past its window
	r := &runner{out: out, res: &Results{
		StartedAt: time.Unix(0, 0), FinishedAt: time.Unix(300, 0), Env: Env{CPU: "test", Cores: 2},
		Accuracy: after,
	}}
	r.res.Targets = targets(r.res)
	if err := r.writeReport(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "REPORT.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Cluster accuracy", "in the runner's process",
		"**fixed**\n\n| offered | spread | admitted | windows | pacing behind ≤ |",
		"| 1.1× | even | **0.97 / 0.98 / 0.99** | 2 | 0 ms |",
		"| 100× | even | **2.50 / 2.50 / 2.50** | 2 |",
		"**sliding**\n\n", "| fixed | 1.1× | even | 97 99 |",
		"**missed**: 2.50× at 10×/100× against 1.10×",
		"| 1.1× | skewed | **1.00 / 1.00 / 1.00 †** | 2 | 150 ms |", "† marks a row",
		"| 2× back to back on one node (5 Takes a ms per 100 of the limit) | **0.80 / 0.82 / 0.85** | 30 ms | 2 |",
		"| 2× on every node, each node's all at once: the first window's worst case | **1.50 / 1.50 / 1.50** | 30 ms | 2 |",
		"**missed**: 0.80× on one node against 0.90×",
		"| 2× on one node, 1 Take a ms per 100 of the limit | **1.00 / 1.00 / 1.00 ‡** |", "‡ some runs' drivers were stalled",
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
}

// accBursts fabricates a run's bursts: one and all-instant admitting
// what is given per run, the others the limit.
func accBursts(run *Accuracy, one, all []int64) *Accuracy {
	for _, name := range []string{"one", "paced", "round-robin", "all", "all-instant", "next"} {
		adm := []int64{run.Limit, run.Limit}
		switch name {
		case "one":
			adm = one
		case "all-instant":
			adm = all
		}
		x := AccuracyBurst{Scenario: name, Runs: len(adm), Admitted: adm, Min: slices.Min(adm), Max: slices.Max(adm),
			Median: float64(slices.Min(adm)+slices.Max(adm)) / 2, Reach90MS: []float64{30, -1, 40}}
		run.Bursts = append(run.Bursts, x)
	}
	return run
}

// TestAccuracyBurstTarget: the least admitted of a burst on one node of a
// new key against 0.90× the limit, the most of a burst on every node
// against 1.5×; a run without bursts is not judged.
func TestAccuracyBurstTarget(t *testing.T) {
	exact := func(string, float64, string) int64 { return 100 }
	for name, tc := range map[string]struct {
		one, all []int64
		met      bool
		margin   string
	}{
		"at the goals":   {[]int64{90, 95}, []int64{150, 100}, true, ""},
		"under, one":     {[]int64{89, 95}, []int64{100, 100}, false, "0.89× on one node against 0.90×"},
		"over, all":      {[]int64{95, 95}, []int64{151, 100}, false, "1.51× on every node against 1.5×"},
		"under and over": {[]int64{50, 55}, []int64{200, 100}, false, "0.50× on one node against 0.90×, 2.00× on every node"},
	} {
		tg := burstTarget(&Results{Accuracy: accBursts(accRows(100, exact), tc.one, tc.all)})
		if tg.Met == nil || *tg.Met != tc.met || !strings.Contains(tg.Margin, tc.margin) || (tc.margin == "" && tg.Margin != "") {
			t.Errorf("%s: %+v, want met %v, margin %q", name, tg, tc.met, tc.margin)
		}
		if !strings.Contains(tg.Measured, "one node min ") {
			t.Errorf("%s: measured %q", name, tg.Measured)
		}
	}
	if tg := burstTarget(&Results{Accuracy: accRows(100, exact)}); tg.Met != nil || !strings.Contains(tg.Measured, "no bursts") {
		t.Errorf("no bursts: %+v", tg)
	}
	if tg := burstTarget(&Results{Accuracy: &Accuracy{Skipped: "nats-server not available"}}); tg.Met != nil || !strings.Contains(tg.Measured, "skipped") {
		t.Errorf("skipped: %+v", tg)
	}
}

func TestAccuracyOptions(t *testing.T) {
	o, _, err := parseOptions(nil, io.Discard, io.Discard)
	if err != nil || !o.only["accuracy"] || o.accWindows != 8 {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	if o, _, err := parseOptions([]string{"--only", "accuracy", "--quick"}, io.Discard, io.Discard); err != nil || o.accWindows != 3 || o.only["cluster"] {
		t.Errorf("no baseline, quick: %+v, %v", o, err)
	}
}

// burstTarget is the accuracy target of the bursts.
func burstTarget(res *Results) Target { return accuracyTargets(res)[2] }
