package main

import (
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
