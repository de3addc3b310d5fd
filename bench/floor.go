package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The floor scenario measures CPU per check the way the floor issue does:
// every server bound to one CPU and the load tool to the other, 50 checks
// in flight over two connections, the CPU a server used over a run
// (user + system, /proc/PID/stat) divided by the checks it answered. The
// references, all measured in the same rounds, alternating:
//
//   - default-noop: `ratelimit-bench noop-grpc`, generated code on a plain
//     grpc.NewServer(): what any grpc-go ext_authz server starts from;
//   - noop: `ratelimit-bench noop`, the no-op on this tree's gRPC stack
//     (internal/server), so what the stack saves and what the check costs are
//     told apart;
//   - baseline-allowed, baseline-denied: the server built from
//     --baseline-ref in this run ("today's" server), on that commit's own
//     configuration files.
//
// Beside the server on its gRPC port (allowed, denied), the same server
// is measured on its lean Check listener (--check-addr; lean-allowed,
// lean-denied), against the same references and the gRPC port, and there
// again with the top-keys sketch on (an admin listener, --admin-addr;
// lean-allowed-top, lean-denied-top) against itself with the sketch off,
// at saturation.
//
// Cost budgets charged after the response, at saturation: the lean
// Check listener with every bucket such a budget (lean-cost-allowed: the
// Check peeks) against the same listener counting (lean-allowed), and
// the charges themselves (charges: `ratelimit-bench accesslog`, Envoy's
// access-log entries each charging a tenant's bucket), CPU per charge
// checked against the entries the server counted.
//
// Then the same at fixed rates, shares of the default no-op's saturated
// throughput.

// floorConcurrency is the checks in flight of every floor run.
const floorConcurrency = 50

// floorShares are the fixed rates, as shares of the default no-op's
// saturated throughput.
var floorShares = []float64{0.1, 0.4}

// Names of the floor's targets.
const (
	floorDefaultNoop = "default-noop"
	floorNoop        = "noop"
	floorBaseline    = "baseline-"
	floorLean        = "lean-"
	floorTop         = "-top" // the top-keys sketch on
	floorCost        = floorLean + "cost-allowed"
	floorCharges     = "charges"
)

// chargesLoad is the access-log load: requests of a tenant route, zipf
// keys as the allowed load's, each entry charging the tenant's
// activity_create bucket of the cost configuration.
var chargesLoad = workload{"charges", []string{"--routes", "activities", "--keys", "zipf", "--zipf-s", "1.1",
	"--bucket", "activity_create", "--cost-header", costHeader, "--cost", "100"}}

func (r *runner) floor(ctx context.Context) error {
	f := &Floor{Plan: r.opt.plan(grpcConns, floorConcurrency)}
	r.res.Floor = f
	cpus, err := cpusAllowed(os.Getpid())
	if err != nil {
		return fmt.Errorf("the CPUs this process may use: %w", err)
	}
	if len(cpus) < 2 {
		return fmt.Errorf("the floor scenario binds the servers and the load tool to different CPUs, and this process may use only %v", cpus)
	}
	f.ServerCPU, f.LoadCPU = int(cpus[0]), int(cpus[1])
	var targets []*server
	add := func(name string, w workload, cmd ...string) error {
		t, err := r.startServer(ctx, f.ServerCPU, "floor-"+name, nil, strings.HasPrefix(name, floorLean), cmd[0], cmd[1:]...)
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		t.name, t.w = name, w
		if name == floorCharges {
			t.mode = "accesslog"
		}
		targets = append(targets, t)
		return nil
	}
	defer func() { stopAll(targets) }()
	costCfg := filepath.Join(r.tmp, "cost.yaml")
	if err := writeCostConfig(r.root, costCfg); err != nil {
		return err
	}
	serve := func(cfg string, extra ...string) []string {
		return append([]string{r.bins.server}, r.serve(cfg, extra...)...)
	}
	life, shipped := r.lifetime().String(), shippedConfigPath(r.root)
	// The sketch records only with an admin listener: on a loopback port
	// of its own, never read during the run.
	top := "--admin-addr=127.0.0.1:0"
	for _, t := range []struct {
		name string
		w    workload
		cmd  []string
	}{
		{floorDefaultNoop, allowedLoad, []string{r.bins.bench, "noop-grpc", "--lifetime", life}},
		{floorNoop, allowedLoad, []string{r.bins.bench, "noop", "--lifetime", life}},
		{"allowed", allowedLoad, serve(r.allowedCfg)},
		{"denied", deniedLoad, serve(shipped)},
		{floorLean + "allowed", allowedLoad, serve(r.allowedCfg)},
		{floorLean + "denied", deniedLoad, serve(shipped)},
		{floorLean + "allowed" + floorTop, allowedLoad, serve(r.allowedCfg, top)},
		{floorLean + "denied" + floorTop, deniedLoad, serve(shipped, top)},
		{floorCost, allowedLoad, serve(costCfg)},
		{floorCharges, chargesLoad, serve(costCfg)},
	} {
		if err := add(t.name, t.w, t.cmd...); err != nil {
			return err
		}
	}
	if r.opt.baselineRef != "" {
		b, err := r.buildBaseline(ctx, r.opt.baselineRef)
		f.Baseline = &b.FloorBaseline
		if err == nil {
			if err = add(floorBaseline+"allowed", allowedLoad, b.bin, "serve", "--config", b.allowedCfg, "--log-level", "warn", "--drain-delay", "0s"); err == nil {
				err = add(floorBaseline+"denied", deniedLoad, b.bin, "serve", "--config", b.shippedCfg, "--log-level", "warn", "--drain-delay", "0s")
			}
		}
		if err != nil {
			f.Baseline.Error = firstLine(err.Error())
			r.note("floor: no baseline from %s: %v", r.opt.baselineRef, firstLine(err.Error()))
		}
	}
	rlsTargets, err := r.rlsFloorTargets(ctx, f.ServerCPU)
	if err != nil {
		return err
	}
	targets = append(targets, rlsTargets...)
	f.Pinning = fmt.Sprintf("servers on CPU %d, load tool on CPU %d", f.ServerCPU, f.LoadCPU)

	level := func(name string, rate float64) (map[string][]*loadRun, error) {
		runs := map[string][]*loadRun{}
		err := r.rotate(len(targets), func(round, i int) error {
			t := targets[i]
			if rate > 0 && (t.mode != "" || strings.HasSuffix(t.name, floorTop) || t.name == floorCost) {
				return nil // ShouldRateLimit, the anchors, the sketch and costs: at saturation only
			}
			counted0, err := t.chargesCounted()
			if err != nil {
				return err
			}
			res, err := r.loadCPU(ctx, f.LoadCPU, fmt.Sprintf("floor-%s-r%d-%s", name, round+1, t.name), t, t.loadArgs(r.checkArgs(t.addr, floorConcurrency, rate, t.w))...)
			if err != nil {
				return err
			}
			if counted1, err := t.chargesCounted(); t.mode == "accesslog" && (err != nil || counted1-counted0 != float64(res.Sent)) {
				return fmt.Errorf("%s: the server counted %.0f access-log entries of the %d sent (%v)", t.name, counted1-counted0, res.Sent, err)
			}
			runs[t.name] = append(runs[t.name], res)
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, t := range targets {
			if len(runs[t.name]) > 0 {
				f.Rows = append(f.Rows, floorRow(name, rate, t.name, runs[t.name]))
			}
		}
		f.Ratios = append(f.Ratios, floorRatios(name, rate, runs)...)
		return runs, nil
	}

	sat, err := level("saturation", 0)
	if err != nil {
		return err
	}
	var noopRPS []float64
	for _, res := range sat[floorDefaultNoop] {
		noopRPS = append(noopRPS, res.RPS)
	}
	f.SaturationRPS = round1(median(noopRPS))
	for _, share := range floorShares {
		rate := float64(int(f.SaturationRPS*share/100) * 100)
		if rate < 100 {
			return fmt.Errorf("the default no-op managed %.0f checks/s: too few for fixed rates", f.SaturationRPS)
		}
		if _, err := level(shareName(share), rate); err != nil {
			return err
		}
	}
	return nil
}

func shareName(share float64) string { return fmt.Sprintf("%.0f%%", 100*share) }

// FloorBaseline is the commit the baseline server was built from.
type FloorBaseline struct {
	Ref    string  `json:"ref"`
	Commit string  `json:"commit"`
	BuildS float64 `json:"build_s"`
	Error  string  `json:"error,omitempty"`
}

// baseline is the server built from another commit, and that commit's
// configurations.
type baseline struct {
	FloorBaseline
	bin, allowedCfg, shippedCfg string
}

// buildBaseline builds the server of ref from its own tree (git archive,
// so no worktree is added to the repository) and writes that tree's
// allowed configuration.
func (r *runner) buildBaseline(ctx context.Context, ref string) (*baseline, error) {
	b := &baseline{FloorBaseline: FloorBaseline{Ref: ref}}
	start := time.Now()
	src, commit, err := r.checkout(ctx, ref, "baseline")
	b.Commit = commit
	if err != nil {
		return b, err
	}
	b.bin = filepath.Join(r.tmp, "ratelimit-authz-baseline")
	if err := r.goBuild(ctx, src, b.bin, "./cmd/ratelimit-authz"); err != nil {
		return b, err
	}
	b.BuildS = round1(time.Since(start).Seconds())
	b.allowedCfg = filepath.Join(r.tmp, "baseline-allowed.yaml")
	b.shippedCfg = shippedConfigPath(src)
	if err := writeAllowedConfig(src, b.allowedCfg); err != nil {
		return b, err
	}
	return b, nil
}

// floorRow summarises one target at one level: medians over the rounds,
// and the range of its CPU per check.
func floorRow(level string, rate float64, target string, runs []*loadRun) FloorRow {
	p := pool(runs)
	return FloorRow{Level: level, Rate: rate, Target: target, RPS: round1(p.rps), CPUUS: round1(p.cpu),
		CPUMin: round1(p.cpuMin), CPUMax: round1(p.cpuMax), ClientCPUUS: round1(p.client), WaitShare: round(p.wait, 3),
		Latency: p.lat, DeniedShare: round(p.denied, 4), Errors: p.errors}
}

func floorRatios(level string, rate float64, runs map[string][]*loadRun) []FloorRatio {
	var out []FloorRatio
	pairs := rlsFloorRatios()
	for _, w := range []string{"allowed", "denied", floorLean + "allowed", floorLean + "denied"} {
		grpcPort := strings.TrimPrefix(w, floorLean)
		pairs[w] = []string{floorDefaultNoop, floorNoop, floorBaseline + grpcPort}
		if grpcPort != w {
			pairs[w] = append(pairs[w], grpcPort) // the lean listener against the gRPC port
			pairs[w+floorTop] = []string{w}       // the sketch on against off
		}
	}
	pairs[floorCost] = []string{floorLean + "allowed"} // peeking at cost buckets against counting
	for _, w := range slices.Sorted(maps.Keys(pairs)) {
		for _, vs := range pairs[w] {
			srv, ref := runs[w], runs[vs]
			if len(srv) == 0 || len(ref) == 0 {
				continue
			}
			x := FloorRatio{Level: level, Rate: rate, Workload: w, Versus: vs}
			var p99 []float64
			for i := range min(len(srv), len(ref)) {
				if ref[i].ServerCPUUS > 0 && srv[i].ServerCPUUS > 0 {
					x.PerRound = append(x.PerRound, round(srv[i].ServerCPUUS/ref[i].ServerCPUUS, 3))
				}
				if ref[i].Latency.P99 > 0 {
					p99 = append(p99, srv[i].Latency.P99/ref[i].Latency.P99)
				}
			}
			if len(x.PerRound) == 0 {
				continue
			}
			x.Median = round(median(x.PerRound), 3)
			lo, hi := minMax(x.PerRound)
			x.Min, x.Max = round(lo, 3), round(hi, 3)
			if len(p99) > 0 {
				x.P99Ratio = round(median(p99), 3)
			}
			out = append(out, x)
		}
	}
	return out
}

// Floor is the floor scenario: CPU per check, pinned, against a
// default-configured grpc-go no-op, the no-op on this tree's stack and the
// baseline server, at saturation and at fixed rates.
type Floor struct {
	Plan
	ServerCPU int    `json:"server_cpu"`
	LoadCPU   int    `json:"load_cpu"`
	Pinning   string `json:"pinning"`
	// SaturationRPS is the default no-op's median saturated throughput,
	// which the fixed rates are shares of.
	SaturationRPS float64        `json:"default_noop_saturation_rps"`
	Baseline      *FloorBaseline `json:"baseline,omitempty"`
	Rows          []FloorRow     `json:"rows"`
	Ratios        []FloorRatio   `json:"ratios"`
}

// FloorRow is one target at one level (saturation or a fixed rate):
// medians over the rounds.
type FloorRow struct {
	Level       string  `json:"level"` // saturation, 10%, 40%
	Rate        float64 `json:"rate,omitempty"`
	Target      string  `json:"target"`
	RPS         float64 `json:"rps"`
	CPUUS       float64 `json:"cpu_us_per_check"`
	CPUMin      float64 `json:"cpu_us_per_check_min"`
	CPUMax      float64 `json:"cpu_us_per_check_max"`
	ClientCPUUS float64 `json:"client_cpu_us_per_check"`
	// WaitShare is the time the server's threads waited for a CPU, as a
	// share of the run: other work on its CPU.
	WaitShare   float64 `json:"runqueue_wait_share"`
	Latency     Lat     `json:"latency_us"`
	DeniedShare float64 `json:"denied_share"`
	Errors      int64   `json:"errors"`
}

// FloorRatio is the server's CPU per check over a reference's at one
// level, paired per round.
type FloorRatio struct {
	Level    string    `json:"level"`
	Rate     float64   `json:"rate,omitempty"`
	Workload string    `json:"workload"` // allowed, denied
	Versus   string    `json:"versus"`   // default-noop, noop, baseline-allowed, baseline-denied
	PerRound []float64 `json:"per_round"`
	Median   float64   `json:"median"`
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	// P99Ratio is the median of the per-round p99 ratios.
	P99Ratio float64 `json:"p99_ratio"`
}
