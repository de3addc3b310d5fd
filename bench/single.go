package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
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
	noop, err := r.startNoop(ctx, "s1-noop")
	if err != nil {
		return err
	}
	defer noop.stop()
	allowed, err := r.startCheckServer(ctx, "s1-server-allowed", r.allowedCfg, nil)
	if err != nil {
		return err
	}
	defer allowed.stop()
	denied, err := r.startCheckServer(ctx, "s1-server-denied", shippedConfigPath(r.root), nil)
	if err != nil {
		return err
	}
	defer denied.stop()
	noop.name, allowed.name, denied.name = "noop", "allowed", "denied"
	noop.w, allowed.w, denied.w = allowedLoad, allowedLoad, deniedLoad
	targets := []*server{noop, allowed, denied}
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
	row := SingleRow{Concurrency: c, Workload: w}
	var srps, nrps, ratios, scpu, ncpu, sclient, nclient []float64
	var slat, nlat []Lat
	var requests, denied int64
	for i, s := range server {
		srps = append(srps, s.RPS)
		slat = append(slat, latOf(s))
		scpu, sclient = append(scpu, s.ServerCPUUS), append(sclient, s.ClientCPUUS())
		requests += s.Requests
		denied += s.Denied
		row.Errors += s.Errors
		if i < len(noop) && noop[i].RPS > 0 {
			ratios = append(ratios, s.RPS/noop[i].RPS)
		}
	}
	for _, n := range noop {
		nrps = append(nrps, n.RPS)
		nlat = append(nlat, latOf(n))
		ncpu, nclient = append(ncpu, n.ServerCPUUS), append(nclient, n.ClientCPUUS())
	}
	row.ServerRPS, row.NoopRPS = round1(median(srps)), round1(median(nrps))
	row.Ratio = round(median(ratios), 3)
	lo, hi := minMax(ratios)
	row.RatioMin, row.RatioMax = round(lo, 3), round(hi, 3)
	row.Server, row.Noop = medianLat(slat), medianLat(nlat)
	row.ServerCPUUS, row.NoopCPUUS = round1(median(scpu)), round1(median(ncpu))
	row.ClientCPUUS, row.NoopClientCPUUS = round1(median(sclient)), round1(median(nclient))
	if requests > 0 {
		row.DeniedShare = round(float64(denied)/float64(requests), 4)
	}
	return row
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
