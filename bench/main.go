// Command bench is the `make bench` runner: it runs the ratelimit-authz
// benchmark scenarios (micro, floor, memory, accuracy, envoy, scale) and
// writes bench/results/REPORT.md, results.json and PNG plots. The load
// is cmd/ratelimit-bench, a process of its own for every run. Targets are judged, never asserted: a missed target is a
// finding, a failed scenario is recorded and the others still run. Every
// process it starts is stopped by PID; every address is on loopback.
//
// What each scenario measures: docs/performance.md. `go run ./bench
// --help` lists the flags; `make bench` runs it through bench/run.sh.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
)

func main() { cli.Main("bench", run) }

var allScenarios = []string{"micro", "floor", "memory", "accuracy", "envoy", "scale"}

type options struct {
	out        string
	only       map[string]bool
	quick      bool
	rounds     int
	run        time.Duration
	warmup     time.Duration
	memKeys    int64
	memBuckets int
	memWindow  time.Duration
	count      int
	benchtime  string
	budget     time.Duration
	plot       bool
	accWindows int
	reportOnly bool
	// baselineRef is the commit whose server the floor scenario measures
	// as "today's"; empty: none.
	baselineRef string
	// serverArgs are extra flags for every `ratelimit-authz serve` of this
	// tree the run starts (not the baseline's).
	serverArgs []string
}

// defaultBaselineRef is main when the floor work began: the server the
// floor scenario's "today's" figures come from.
const defaultBaselineRef = "a1fd651036d287fe9874394aeca3527646cb4434"

func parseOptions(args []string, stdout, stderr io.Writer) (options, bool, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./bench [flags]   (make bench)\n\nRun the ratelimit-authz benchmark scenarios and write REPORT.md, results.json\nand PNG plots into --out.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	only := fs.String("only", strings.Join(allScenarios, ","), "scenarios to run, comma-separated: "+strings.Join(allScenarios, ", "))
	fs.StringVar(&o.out, "out", "bench/results", "results `folder` (relative to the repository root)")
	fs.BoolVar(&o.quick, "quick", false, "short runs that check the pipeline, not figures to quote")
	fs.IntVar(&o.rounds, "rounds", 2, "alternating rounds per comparison (server vs no-op, filter on vs off)")
	fs.DurationVar(&o.run, "run", 2*time.Second, "measured time of each load run")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "warm-up before each load run, not measured")
	fs.BoolVar(&o.plot, "plot", true, "draw the PNG plots (needs scripts/install-plot.sh)")
	fs.StringVar(&o.baselineRef, "baseline-ref", defaultBaselineRef, "`commit` whose server the floor scenario builds and measures as today's, beside this tree's (empty: none)")
	serverArgs := fs.String("server-args", "", "extra `flags` for every ratelimit-authz serve of this tree the run starts, space-separated (e.g. a server setting to compare); the baseline gets none")
	fs.BoolVar(&o.reportOnly, "report-only", false, "run nothing: redraw the plots and rewrite REPORT.md from --out's results.json")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return o, true, err
	}
	o.serverArgs = strings.Fields(*serverArgs)
	o.only = map[string]bool{}
	for s := range strings.SplitSeq(*only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allScenarios, s) {
			return o, true, cli.UsageError{Msg: fmt.Sprintf("--only: unknown scenario %q (have %s)", s, strings.Join(allScenarios, ", "))}
		}
		o.only[s] = true
	}
	// The scenarios' sizes: a million keys in a minute-long window, two
	// new keys per check; 8 windows per accuracy row; the microbenchmarks
	// at -count 6 take about a minute. The whole run is stopped by budget.
	o.memKeys, o.memWindow, o.memBuckets, o.accWindows, o.count, o.benchtime, o.budget = 1_000_000, time.Minute, 2, 8, 6, "150ms", 20*time.Minute
	if o.quick {
		o.rounds, o.run, o.warmup = 1, time.Second, 300*time.Millisecond
		o.memKeys, o.memWindow = 100_000, 10*time.Second
		o.count, o.benchtime = 1, "20ms"
		o.accWindows = 3
	}
	for _, c := range []struct {
		bad bool
		msg string
	}{
		{o.rounds < 1 || o.rounds > 20, "--rounds: from 1 to 20"},
		{o.run < 100*time.Millisecond || o.run > time.Minute, "--run: from 100ms to 1m"},
		{o.warmup < 0 || o.warmup > 10*time.Second, "--warmup: from 0 to 10s"},
	} {
		if c.bad {
			return o, true, cli.UsageError{Msg: c.msg}
		}
	}
	return o, false, nil
}

// runner holds one benchmark run's state.
type runner struct {
	opt      options
	root     string
	out      string
	tmp      string // binaries and generated configs
	logDir   string
	runsDir  string
	stdout   io.Writer
	deadline time.Time
	bins     struct{ server, bench, envoy, nats string }
	res      *Results
	// allowedCfg is the shipped configuration with limits nothing reaches.
	allowedCfg string

	depth int // steps running inside another (memory runs others while it waits)

	mu    sync.Mutex
	procs []*proc
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opt, done, err := parseOptions(args, stdout, stderr)
	if done {
		return err
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	r := &runner{opt: opt, root: root, stdout: stdout, deadline: time.Now().Add(opt.budget)}
	ctx, cancel := context.WithDeadline(ctx, r.deadline)
	defer cancel()
	defer r.stopAll()

	r.out = opt.out
	if !filepath.IsAbs(r.out) {
		r.out = filepath.Join(root, r.out)
	}
	r.logDir = filepath.Join(r.out, "logs")
	r.runsDir = filepath.Join(r.out, "runs")
	if opt.reportOnly {
		return r.rewriteReport(ctx)
	}
	for _, d := range []string{r.out, r.logDir, r.runsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The previous run's raw outputs and plots go, so the folder holds only
	// what REPORT.md describes; the previous microbenchmark file stays,
	// for benchstat to compare with.
	for _, pattern := range []string{filepath.Join(r.logDir, "*"), filepath.Join(r.runsDir, "*"), filepath.Join(r.out, "*.png")} {
		old, _ := filepath.Glob(pattern)
		for _, f := range old {
			os.RemoveAll(f)
		}
	}
	if r.tmp, err = os.MkdirTemp("", "ratelimit-bench-"); err != nil {
		return err
	}
	defer os.RemoveAll(r.tmp)

	r.res = &Results{Schema: resultsSchema, StartedAt: time.Now().UTC()}
	r.res.Env = environment(ctx, root)
	r.res.Env.Quick = opt.quick
	r.res.Env.ServerArgs = opt.serverArgs
	r.printf("ratelimit-authz benchmarks: %d cores, %s, load average %.2f %.2f %.2f%s\n",
		r.res.Env.Cores, r.res.Env.CPU, r.res.Env.LoadBefore[0], r.res.Env.LoadBefore[1], r.res.Env.LoadBefore[2],
		map[bool]string{true: " (quick: pipeline check only)"}[opt.quick])

	if err := r.step(ctx, "build", r.build); err != nil {
		return err // nothing else can run
	}
	if opt.only["micro"] {
		r.step(ctx, "micro", r.micro)
	}
	if opt.only["floor"] {
		r.step(ctx, "floor", r.floor)
	}
	// The memory scenario must start early in a window; while it waits for
	// one, and while its keys expire, the envoy, accuracy and scale
	// scenarios run.
	var pending []task
	for _, t := range []task{{"envoy", r.envoyEstimate(), r.envoy},
		{"accuracy", r.accuracyEstimate(), r.accuracy},
		{"scale", r.scaleEstimate(), r.scale}} {
		if opt.only[t.name] {
			pending = append(pending, t)
		}
	}
	if opt.only["memory"] {
		r.step(ctx, "memory", func(ctx context.Context) error { return r.memory(ctx, &pending) })
	}
	for _, t := range pending {
		r.step(ctx, t.name, t.run)
	}

	r.res.Env.LoadAfter = loadavg()
	r.res.FinishedAt = time.Now().UTC()
	r.res.Targets = targets(r.res)
	if err := r.writeJSON(); err != nil {
		return err
	}
	if opt.plot {
		r.step(ctx, "plot", r.plotPNGs)
		r.writeJSON() // with the plot names
	}
	if err := r.writeReport(); err != nil {
		return err
	}
	r.printf("\nwrote %s (and results.json, plots, logs/)\n", filepath.Join(r.out, "REPORT.md"))
	if len(r.res.Errors) > 0 {
		return fmt.Errorf("%d step(s) failed: see REPORT.md", len(r.res.Errors))
	}
	return nil
}

// rewriteReport redraws the plots and rewrites REPORT.md from the
// results.json of an earlier run.
func (r *runner) rewriteReport(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(r.out, "results.json"))
	if err != nil {
		return err
	}
	r.res = &Results{}
	if err := json.Unmarshal(b, r.res); err != nil {
		return fmt.Errorf("results.json: %w", err)
	}
	if r.res.Schema != resultsSchema {
		return fmt.Errorf("results.json: schema %d, this runner writes and reads %d: run make bench again", r.res.Schema, resultsSchema)
	}
	r.res.Targets = targets(r.res)
	if r.opt.plot {
		if err := os.MkdirAll(r.logDir, 0o755); err != nil {
			return err
		}
		r.res.PlotError = ""
		r.res.Timings = slices.DeleteFunc(r.res.Timings, func(t StepTime) bool { return t.Step == "plot" })
		r.step(ctx, "plot", r.plotPNGs)
	}
	if err := r.writeJSON(); err != nil {
		return err
	}
	if err := r.writeReport(); err != nil {
		return err
	}
	r.printf("rewrote %s\n", filepath.Join(r.out, "REPORT.md"))
	return nil
}

// task is a scenario that may run while the memory scenario waits.
type task struct {
	name     string
	estimate time.Duration
	run      func(context.Context) error
}

// step runs one step, timing it and recording a failure without ending
// the run (except build, whose error the caller returns).
func (r *runner) step(ctx context.Context, name string, fn func(context.Context) error) error {
	if ctx.Err() != nil {
		r.res.Errors = append(r.res.Errors, StepError{name, "not run: " + ctx.Err().Error()})
		return ctx.Err()
	}
	r.printf("\n== %s\n", name)
	label := name
	if r.depth > 0 {
		label = "↳ " + name + " (while memory waits)"
	}
	r.depth++
	start := time.Now()
	err := fn(ctx)
	r.depth--
	r.res.Timings = append(r.res.Timings, StepTime{Step: label, Seconds: round(time.Since(start).Seconds(), 1), Load1: loadavg()[0]})
	if err != nil {
		r.printf("!! %s failed: %v\n", name, err)
		r.res.Errors = append(r.res.Errors, StepError{name, err.Error()})
	}
	return err
}

func (r *runner) printf(format string, args ...any) { fmt.Fprintf(r.stdout, format, args...) }

func (r *runner) note(format string, args ...any) {
	r.res.Notes = append(r.res.Notes, fmt.Sprintf(format, args...))
}

func (r *runner) writeJSON() error {
	b, err := json.MarshalIndent(r.res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.out, "results.json"), append(b, '\n'), 0o644)
}

// lifetime bounds a process started now: the rest of the run's budget.
func (r *runner) lifetime() time.Duration {
	return max(time.Until(r.deadline), 10*time.Second)
}

// build compiles the server and the load tool, and installs Envoy and NATS
// when their scenarios run.
func (r *runner) build(ctx context.Context) error {
	r.bins.server = filepath.Join(r.tmp, "ratelimit-authz")
	r.bins.bench = filepath.Join(r.tmp, "ratelimit-bench")
	for _, b := range []struct{ out, pkg string }{{r.bins.server, "./cmd/ratelimit-authz"}, {r.bins.bench, "./cmd/ratelimit-bench"}} {
		if err := r.goBuild(ctx, r.root, b.out, b.pkg); err != nil {
			return err
		}
	}
	if r.opt.only["envoy"] {
		out, err := r.runTool(ctx, "install-envoy", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-envoy.sh"))
		if err != nil {
			r.note("Envoy scenarios not run: %v", err)
			delete(r.opt.only, "envoy")
		} else {
			r.bins.envoy = lastLine(out)
			if v, err := r.runTool(ctx, "envoy-version", time.Minute, nil, "", r.bins.envoy, "--version"); err == nil {
				r.res.Env.EnvoyVersion = envoyVersion(string(v))
			}
		}
	}
	allowed := filepath.Join(r.tmp, "allowed.yaml")
	if err := writeAllowedConfig(r.root, allowed); err != nil {
		return err
	}
	r.allowedCfg = allowed
	return nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// envoyVersion picks "1.40.0" out of `envoy --version`.
func envoyVersion(s string) string {
	for f := range strings.FieldsSeq(s) {
		if parts := strings.Split(f, "/"); len(parts) >= 2 && strings.Count(parts[1], ".") == 2 {
			return parts[1]
		}
	}
	return strings.TrimSpace(s)
}

// repoRoot finds the module root above the working directory.
func repoRoot() (string, error) { return binaries.ModuleRoot(".") }

func environment(ctx context.Context, root string) Env {
	e := Env{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := commandOutput(ctx, root, "git", "describe", "--tags", "--always", "--dirty"); err == nil {
		e.Git = out
	}
	if out, err := commandOutput(ctx, root, "go", "env", "GOVERSION"); err == nil {
		e.GoVersion = out
	}
	return e
}
