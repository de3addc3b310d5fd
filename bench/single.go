package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// singleConcurrency are the client concurrencies of scenario 1.
var singleConcurrency = []int{1, 16, 64}

// workload is a stream of requests and the server that answers it.
type workload struct {
	name string
	args []string // ratelimit-bench check flags besides target and load shape
}

var (
	// Production-like: the example API's route mix, zipf-skewed keys over
	// large populations, limits out of reach (the allowed configuration).
	allowedLoad = workload{"allowed", []string{"--routes", "api", "--keys", "zipf", "--zipf-s", "1.1"}}
	// The same mix over four keys of each kind against the shipped limits:
	// most checks are over a limit.
	deniedLoad = workload{"denied", []string{"--routes", "api", "--keys", "uniform",
		"--tenants", "4", "--channels", "4", "--ips", "4", "--accounts", "4"}}
)

// fixedRateShares are the fixed rates of the latency runs, as shares of
// what the no-op floor managed at concurrency 64: rates the machine serves
// with room to spare, even with other work on it. The first is profiled.
var fixedRateShares = []float64{0.4, 0.1}

// grpcConns is the load tool's connection count, as Envoy with two
// workers (one per core) would hold to the cluster.
const grpcConns = 2

// server is a started server: ratelimit-authz serve, a no-op or the
// baseline's, with its addresses and the workload it is measured with.
type server struct {
	*proc
	name, grpc, http, pprofURL string
	addr                       string // where its load goes: grpc, or the lean listener's
	w                          workload
	mode                       string  // the floor's load: "" (Check), "rls" or "gubernator" (floorrls.go)
	also                       []*proc // processes whose CPU counts with proc's (an anchor's Redis)
}

// stop ends the server and the processes that go with it.
func (s *server) stop() {
	s.proc.stop()
	for _, p := range s.also {
		p.stop()
	}
}

// cpuTime is the CPU time the server's processes used so far.
func (s *server) cpuTime() (time.Duration, error) {
	sum, err := s.proc.cpuTime()
	for _, p := range s.also {
		c, perr := p.cpuTime()
		sum, err = sum+c, cmp.Or(err, perr)
	}
	return sum, err
}

// startServer starts bin with head (a subcommand and its flags) and
// addresses of its own (gRPC, HTTP, profiles; with lean also the lean
// Check listener, where its load then goes), bound to cpu (< 0: unbound),
// and waits until it is ready and, bound, the kernel holds it to cpu. env
// entries are added to the runner's environment.
func (r *runner) startServer(ctx context.Context, cpu int, name string, env []string, lean bool, bin string, head ...string) (*server, error) {
	addrs, err := freeport.Addrs(4)
	if err != nil {
		return nil, err
	}
	s := &server{name: name, grpc: addrs[0], http: addrs[1], pprofURL: "http://" + addrs[2] + "/debug/pprof/profile", addr: addrs[0]}
	args := append(slices.Clone(head), "--grpc-addr", addrs[0], "--http-addr", addrs[1], "--pprof-addr", addrs[2])
	if lean {
		args, s.addr = append(args, "--check-addr", addrs[3]), addrs[3]
	}
	bin, args = onCPU(cpu, bin, args...)
	if s.proc, err = r.start(name, r.lifetime(), env, bin, args...); err != nil {
		return nil, err
	}
	if err := waitHTTP200(ctx, s.proc, "http://"+s.http+"/readyz", 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	if got, err := cpusAllowed(s.pid()); cpu >= 0 && (err != nil || got != strconv.Itoa(cpu)) {
		s.stop()
		return nil, fmt.Errorf("%s runs on CPUs %q (%v), want %d", name, got, err, cpu)
	}
	return s, nil
}

// serve is the head of `ratelimit-authz serve` of this tree on config,
// with extra flags.
func (r *runner) serve(config string, extra ...string) []string {
	return slices.Concat([]string{"serve", "--config", config, "--log-level", "warn", "--drain-delay", "0s"}, r.opt.serverArgs, extra)
}

// startCheckServer starts ratelimit-authz serve of this tree on config.
func (r *runner) startCheckServer(ctx context.Context, name, config string, env []string, extra ...string) (*server, error) {
	return r.startServer(ctx, -1, name, env, false, r.bins.server, r.serve(config, extra...)...)
}

// startTargets starts the no-op server and two of this tree, named
// prefix-noop, prefix-server-allowed (the allowed configuration, with
// allowedEnv) and prefix-server-denied (deniedCfg, deniedEnv), each to be
// measured with its workload; on error none is left running.
func (r *runner) startTargets(ctx context.Context, prefix string, allowedEnv []string, deniedCfg string, deniedEnv []string) ([]*server, error) {
	noop, err := r.startNoop(ctx, prefix+"-noop")
	if err != nil {
		return nil, err
	}
	noop.name, noop.w = "noop", allowedLoad
	targets := []*server{noop}
	for _, t := range []struct {
		name, cfg string
		env       []string
		w         workload
	}{{"allowed", r.allowedCfg, allowedEnv, allowedLoad}, {"denied", deniedCfg, deniedEnv, deniedLoad}} {
		s, err := r.startCheckServer(ctx, prefix+"-server-"+t.name, t.cfg, t.env)
		if err != nil {
			stopAll(targets)
			return nil, err
		}
		s.name, s.w = t.name, t.w
		targets = append(targets, s)
	}
	return targets, nil
}

// stopAll stops the servers.
func stopAll(servers []*server) {
	for _, s := range servers {
		s.stop()
	}
}

// startNoop starts the no-op ext_authz and rate limit server (the floor).
func (r *runner) startNoop(ctx context.Context, name string) (*server, error) {
	return r.startServer(ctx, -1, name, nil, false, r.bins.bench, "noop", "--lifetime", r.lifetime().String())
}

// checkArgs are the flags of one gRPC load run.
func (r *runner) checkArgs(target string, c int, rate float64, w workload) []string {
	args := []string{"check", "--target", target, "--concurrency", strconv.Itoa(c), "--connections", strconv.Itoa(grpcConns),
		"--duration", r.opt.run.String(), "--warmup", r.opt.warmup.String(), "--timeout", "2s"}
	if rate > 0 {
		args = append(args, "--rate", strconv.FormatFloat(rate, 'f', 0, 64))
	}
	return append(args, w.args...)
}

// single is scenario 1: the server against the no-op floor at each
// concurrency, allowed and mostly denied, the three targets alternating
// within each round (in a rotating order) so that a change in the
// machine's load hits all of them alike.
func (r *runner) single(ctx context.Context) error {
	targets, err := r.startTargets(ctx, "s1", nil, shippedConfigPath(r.root), nil)
	if err != nil {
		return err
	}
	defer stopAll(targets)
	s := &Single{Plan: r.opt.plan(grpcConns, 0), Workloads: []string{fmt.Sprint(allowedLoad.args), fmt.Sprint(deniedLoad.args)}}
	r.res.Single = s
	results := map[string][]*loadRun{} // "c/target" → per round
	for _, c := range singleConcurrency {
		err := r.rotate(len(targets), func(round, i int) error {
			t := targets[i]
			res, err := r.loadCPU(ctx, -1, fmt.Sprintf("s1-c%d-r%d-%s", c, round+1, t.name), t.proc, r.checkArgs(t.addr, c, 0, t.w)...)
			if err != nil {
				return err
			}
			key := fmt.Sprintf("%d/%s", c, t.name)
			results[key] = append(results[key], res)
			s.Runs = append(s.Runs, runOf(round+1, c, t.name, 0, res))
			return nil
		})
		if err != nil {
			return err
		}
		for _, w := range []string{"allowed", "denied"} {
			row := compare(c, w, results[fmt.Sprintf("%d/%s", c, w)], results[fmt.Sprintf("%d/noop", c)])
			s.Rows = append(s.Rows, row)
		}
		for _, t := range targets {
			rs := results[fmt.Sprintf("%d/%s", c, t.name)]
			s.CDFs = append(s.CDFs, CDFSeries{Group: fmt.Sprintf("c=%d", c), Label: t.name, Points: medianRun(rs).CDF})
		}
	}
	for _, row := range s.Rows {
		if row.Concurrency == 64 && row.Workload == "allowed" {
			r.allowedRPS64 = row.ServerRPS
		}
	}

	// Latency at fixed rates, shares of what the floor managed at c=64,
	// with up to 64 in flight. Closed-loop latency at c=64 is mostly
	// queueing (Little's law: mean = 64 / throughput); at a rate the
	// machine can serve, latency is what one check costs.
	var noop64 []float64
	for _, res := range results["64/noop"] {
		noop64 = append(noop64, res.RPS)
	}
	for n, share := range fixedRateShares {
		rate := float64(int(median(noop64)*share/100) * 100)
		if rate < 100 {
			continue
		}
		fixed := map[string][]*loadRun{}
		for _, t := range targets {
			res, err := r.loadCPU(ctx, -1, fmt.Sprintf("s1-rate%.0f-%s", rate, t.name), t.proc, r.checkArgs(t.addr, 64, rate, t.w)...)
			if err != nil {
				return err
			}
			fixed[t.name] = append(fixed[t.name], res)
			s.Runs = append(s.Runs, runOf(1, 64, t.name, rate, res))
		}
		for _, w := range []string{"allowed", "denied"} {
			row := compare(64, w, fixed[w], fixed["noop"])
			row.Rate = rate
			s.FixedRate = append(s.FixedRate, row)
		}
		if n == 0 { // the first rate is profiled and plotted
			r.fixedRate = rate
			for _, t := range targets {
				s.CDFs = append(s.CDFs, CDFSeries{Group: fmt.Sprintf("rate %.0f/s", rate), Label: t.name, Points: medianRun(fixed[t.name]).CDF})
			}
		}
	}
	return nil
}

func shippedConfigPath(root string) string { return root + "/" + shippedConfig }

func runOf(round, c int, target string, rate float64, res *loadRun) SingleRun {
	return SingleRun{Round: round, Concurrency: c, Target: target, Rate: rate, RPS: round1(res.RPS),
		Allowed: res.Allowed, Denied: res.Denied, Errors: res.Errors, Latency: latOf(res),
		ServerCPUUS: res.ServerCPUUS, ClientCPUUS: round1(res.ClientCPUUS())}
}

// compare summarises one workload against the floor: medians over the
// rounds, and the ratio of each round's pair.
func compare(c int, w string, server, noop []*loadRun) SingleRow {
	var ratios []float64
	for i, s := range server {
		if i < len(noop) && noop[i].RPS > 0 {
			ratios = append(ratios, s.RPS/noop[i].RPS)
		}
	}
	s, n := pool(server), pool(noop)
	lo, hi := minMax(ratios)
	return SingleRow{Concurrency: c, Workload: w, ServerRPS: round1(s.rps), NoopRPS: round1(n.rps),
		Ratio: round(median(ratios), 3), RatioMin: round(lo, 3), RatioMax: round(hi, 3),
		DeniedShare: round(s.denied, 4), Errors: s.errors, Server: s.lat, Noop: n.lat,
		ServerCPUUS: round1(s.cpu), NoopCPUUS: round1(n.cpu), ClientCPUUS: round1(s.client), NoopClientCPUUS: round1(n.client)}
}

// medianRun returns the run with the median throughput (for plots).
func medianRun(rs []*loadRun) *loadRun {
	if len(rs) == 0 {
		return &loadRun{}
	}
	best := rs[0]
	var xs []float64
	for _, r := range rs {
		xs = append(xs, r.RPS)
	}
	m := median(xs)
	for _, r := range rs {
		if abs(r.RPS-m) < abs(best.RPS-m) {
			best = r
		}
	}
	return best
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func round1(x float64) float64 { return round(x, 1) }

// rlsConcurrency is the client concurrency of the RLS throughput runs.
const rlsConcurrency = 16

// rlsWorkloads are the RLS runs' loads: descriptors per call and key
// populations, against a configuration whose limits nothing reaches
// (allowed) or one a second (denied: four keys of each kind, so nearly
// every call is over).
var rlsWorkloads = []struct {
	name        string
	descriptors int
	denied      bool
}{
	{"1 descriptor, allowed", 1, false},
	{"3 descriptors, allowed", 3, false},
	{"1 descriptor, denied", 1, true},
	{"3 descriptors, denied", 3, true},
}

// rlsRuntime writes a runtime directory (RUNTIME_ROOT/ratelimit/config)
// with the load tool's descriptor file at perUnit per unit, and returns
// the environment that points a server at it.
func (r *runner) rlsRuntime(ctx context.Context, name string, perUnit uint32, unit string) ([]string, error) {
	root := filepath.Join(r.tmp, name)
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The load tool writes the file its descriptors match.
	cfg, err := r.runTool(ctx, "rls-config-"+name, time.Minute, nil, "", r.bins.bench, "rls-config",
		"--limit", strconv.FormatUint(uint64(perUnit), 10), "--unit", unit)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), cfg, 0o644); err != nil {
		return nil, err
	}
	return []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit"}, nil
}

// rlsArgs are the flags of one ShouldRateLimit load run.
func (r *runner) rlsArgs(target string, descriptors int, denied bool, extra ...string) []string {
	args := []string{"rls", "--target", target, "--descriptors", strconv.Itoa(descriptors),
		"--concurrency", strconv.Itoa(rlsConcurrency), "--connections", strconv.Itoa(grpcConns),
		"--duration", r.opt.run.String(), "--warmup", r.opt.warmup.String(), "--timeout", "2s"}
	if denied {
		args = append(args, deniedLoad.args...)
	} else {
		args = append(args, allowedLoad.args...)
	}
	return append(args, extra...)
}

// rls is the ShouldRateLimit scenario: the server's CPU per call and
// throughput against the no-op server (which answers ShouldRateLimit OK
// at once on the same gRPC stack) under the same load tool, with one and
// three descriptors, allowed and denied, the two alternating within each
// round; then the memory of descriptor-style keys.
func (r *runner) rls(ctx context.Context) error {
	allowedEnv, err := r.rlsRuntime(ctx, "rls-allowed", 2_000_000_000, "second")
	if err != nil {
		return err
	}
	deniedEnv, err := r.rlsRuntime(ctx, "rls-denied", 1, "second")
	if err != nil {
		return err
	}
	targets, err := r.startTargets(ctx, "rls", allowedEnv, r.allowedCfg, deniedEnv)
	if err != nil {
		return err
	}
	defer stopAll(targets)
	noop, allowed, denied := targets[0], targets[1], targets[2]

	res := &RLS{Plan: r.opt.plan(grpcConns, rlsConcurrency)}
	r.res.RLS = res
	for _, w := range rlsWorkloads {
		srv := allowed
		if w.denied {
			srv = denied
		}
		var servers, noops []*loadRun
		err := r.rotate(2, func(round, t int) error {
			s := []*server{srv, noop}[t]
			name := fmt.Sprintf("rls-%dd-%v-r%d-%s", w.descriptors, w.denied, round+1, []string{"server", "noop"}[t])
			run, err := r.loadCPU(ctx, -1, name, s.proc, r.rlsArgs(s.grpc, w.descriptors, w.denied)...)
			if t == 0 {
				servers = append(servers, run)
			} else {
				noops = append(noops, run)
			}
			return err
		})
		if err != nil {
			return err
		}
		row := RLSRow{SingleRow: compare(rlsConcurrency, w.name, servers, noops), Descriptors: w.descriptors, Denied: w.denied}
		if row.NoopCPUUS > 0 {
			row.CPURatio = round(row.ServerCPUUS/row.NoopCPUUS, 2)
		}
		res.Rows = append(res.Rows, row)
	}
	stopAll(targets) // before the memory run's server
	return r.rlsMemory(ctx, res)
}

// rlsMemory fills one server with --rls-memory-keys distinct
// descriptor-style keys (("remote_address", <a new address>) against a
// daily rule, so that no window ends during the load) and reports
// resident memory and live heap per live key.
func (r *runner) rlsMemory(ctx context.Context, res *RLS) error {
	keys := r.opt.rlsMemKeys
	m := &Memory{Keys: keys, MaxKeysConfig: int(keys + keys/4)}
	res.Memory = m
	cfg := filepath.Join(r.tmp, "rls-memory.yaml")
	// The ext_authz configuration's key bound applies to the counter both
	// protocols share.
	if err := writeMemoryConfig(r.root, cfg, time.Minute, 1, m.MaxKeysConfig); err != nil {
		return err
	}
	env, err := r.rlsRuntime(ctx, "rls-memory", 2_000_000_000, "day")
	if err != nil {
		return err
	}
	srv, err := r.startCheckServer(ctx, "rls-memory-server", cfg, append(env, "GODEBUG=gctrace=1"))
	if err != nil {
		return err
	}
	defer srv.stop()
	point := func(name string) (MemPoint, error) {
		var p MemPoint
		var err error
		p.LiveHeap, p.HeapGoal = r.gcSettle(ctx, "rls-"+name, srv.grpc, srv.logPath)
		if p.RSS, p.HWM, err = procStatus(srv.pid()); err != nil {
			return p, err
		}
		mt, err := scrape.Get(httpClient, "http://"+srv.http+"/metrics")
		if err != nil {
			return p, err
		}
		p.LiveKeys = mt.Sum("ratelimit_authz_counter_live_keys")
		return p, nil
	}
	if m.Baseline, err = point("baseline"); err != nil {
		return err
	}
	start := time.Now().UTC()
	run, err := r.load(ctx, "rls-memory-load", 5*time.Minute, "rls", "--target", srv.grpc, "--descriptors", "1", "--keys", "unique",
		"--requests", strconv.FormatInt(keys, 10), "--concurrency", "16", "--connections", strconv.Itoa(grpcConns),
		"--duration", "5m", "--warmup", "0", "--timeout", "5s")
	if err != nil {
		return err
	}
	m.LoadS, m.LoadRPS, m.Errors = round(run.ElapsedS, 1), round(run.RPS, 0), run.Errors
	if time.Now().UTC().Truncate(24*time.Hour) != start.Truncate(24*time.Hour) {
		m.Note = "the load crossed midnight UTC, the end of the rule's daily window: the keys of the first window expired during it"
	}
	if m.Loaded, err = point("loaded"); err != nil {
		return err
	}
	if added := m.Loaded.LiveKeys - m.Baseline.LiveKeys; added > 0 {
		m.BytesPerKeyRSS = round1(float64(m.Loaded.RSS-m.Baseline.RSS) / added)
		if m.Loaded.LiveHeap > 0 && m.Baseline.LiveHeap > 0 {
			m.BytesPerKeyHeap = round1(float64(m.Loaded.LiveHeap-m.Baseline.LiveHeap) / added)
		}
	}
	r.printf("%d ShouldRateLimit calls, each a new remote_address, in %.1fs (%.0f/s, %d errors): RSS %s → %s, live keys %.0f, %.0f bytes/key resident, %.0f bytes/key live heap %s\n",
		keys, m.LoadS, m.LoadRPS, m.Errors, mib(m.Baseline.RSS), mib(m.Loaded.RSS), m.Loaded.LiveKeys, m.BytesPerKeyRSS, m.BytesPerKeyHeap, m.Note)
	return nil
}

// rlsEstimate is how long the rls scenario takes.
func (r *runner) rlsEstimate() time.Duration {
	runs := time.Duration(len(rlsWorkloads)*2*r.opt.rounds) * (r.opt.run + r.opt.warmup + time.Second)
	return runs + time.Duration(r.opt.rlsMemKeys/20_000)*time.Second + 20*time.Second
}

// Single is scenario 1: one node against the no-op floor.
type Single struct {
	Plan
	Rows      []SingleRow `json:"rows"`
	FixedRate []SingleRow `json:"fixed_rate,omitempty"`
	CDFs      []CDFSeries `json:"cdfs"`
	Runs      []SingleRun `json:"runs"`
	Workloads []string    `json:"workloads"`
}

// SingleRow is one concurrency and workload: medians over the rounds.
type SingleRow struct {
	Concurrency int     `json:"concurrency"`
	Workload    string  `json:"workload"` // allowed, denied
	Rate        float64 `json:"rate,omitempty"`
	ServerRPS   float64 `json:"server_rps"`
	NoopRPS     float64 `json:"noop_rps"`
	Ratio       float64 `json:"ratio"` // median of the per-round ratios
	RatioMin    float64 `json:"ratio_min"`
	RatioMax    float64 `json:"ratio_max"`
	DeniedShare float64 `json:"denied_share"`
	Errors      int64   `json:"errors"`
	Server      Lat     `json:"server_latency_us"`
	Noop        Lat     `json:"noop_latency_us"`
	// CPU per check (µs): the server's and the no-op's process, and the
	// load tool's when driving each.
	ServerCPUUS     float64 `json:"server_cpu_us_per_check"`
	NoopCPUUS       float64 `json:"noop_cpu_us_per_check"`
	ClientCPUUS     float64 `json:"client_cpu_us_per_check"`
	NoopClientCPUUS float64 `json:"noop_client_cpu_us_per_check"`
}

// RLS is the ShouldRateLimit scenario: the server against the no-op rate
// limit service, then the memory of descriptor keys.
type RLS struct {
	Plan
	Rows   []RLSRow `json:"rows"`
	Memory *Memory  `json:"memory,omitempty"` // one window-less run: no expiry, no series
}

// RLSRow is one workload against the no-op: medians over the rounds.
type RLSRow struct {
	SingleRow
	Descriptors int     `json:"descriptors"`
	Denied      bool    `json:"denied"`
	CPURatio    float64 `json:"cpu_ratio"`
}

// SingleRun is one measured run (for the record).
type SingleRun struct {
	Round       int     `json:"round"`
	Concurrency int     `json:"concurrency"`
	Target      string  `json:"target"` // noop, allowed, denied
	Rate        float64 `json:"rate,omitempty"`
	RPS         float64 `json:"rps"`
	Allowed     int64   `json:"allowed"`
	Denied      int64   `json:"denied"`
	Errors      int64   `json:"errors"`
	Latency     Lat     `json:"latency_us"`
	ServerCPUUS float64 `json:"server_cpu_us_per_check"`
	ClientCPUUS float64 `json:"client_cpu_us_per_check"`
}
