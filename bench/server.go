package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

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
	mode                       string  // the floor's load: "" (Check), "rls", "gubernator" (floorrls.go) or "accesslog"
	also                       []*proc // processes whose CPU counts with proc's (an anchor's Redis)
}

// chargesCounted is the access-log entries the server counted so far,
// for a target loaded with access-log entries; 0 for any other.
func (s *server) chargesCounted() (float64, error) {
	if s.mode != "accesslog" {
		return 0, nil
	}
	m, err := scrape.Get(httpClient, "http://"+s.http+"/metrics")
	if err != nil {
		return 0, err
	}
	v, _ := m.Match("ratelimit_authz_failures_accesslog_entries_total", "result", "counted")
	return v, nil
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

func shippedConfigPath(root string) string { return root + "/" + shippedConfig }

// compare summarises one workload against the floor: medians over the
// rounds, and the ratio of each round's pair.
func compare(c int, w string, server, noop []*loadRun) CompareRow {
	var ratios []float64
	for i, s := range server {
		if i < len(noop) && noop[i].RPS > 0 {
			ratios = append(ratios, s.RPS/noop[i].RPS)
		}
	}
	s, n := pool(server), pool(noop)
	lo, hi := minMax(ratios)
	return CompareRow{Concurrency: c, Workload: w, ServerRPS: round1(s.rps), NoopRPS: round1(n.rps),
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

// CompareRow is one workload of a server against a no-op at one
// concurrency: medians over the rounds.
type CompareRow struct {
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
