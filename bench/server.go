package main

import (
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
	name, grpc, http string
	addr             string // where its load goes: grpc, or the lean listener's
	w                workload
	mode             string  // the floor's load: "" (Check), "rls", "gubernator" (rls.go) or "accesslog"
	also             []*proc // processes whose CPU counts with proc's (an anchor's Redis)
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

// pids are the server's processes, whose CPU is the server's.
func (s *server) pids() []int {
	pids := []int{s.PID()}
	for _, p := range s.also {
		pids = append(pids, p.PID())
	}
	return pids
}

// startServer starts bin with head (a subcommand and its flags) and
// addresses of its own (gRPC, HTTP; with lean also the lean
// Check listener, where its load then goes), bound to cpu (< 0: unbound),
// and waits until it is ready and, bound, the kernel holds it to cpu. env
// entries are added to the runner's environment.
func (r *runner) startServer(ctx context.Context, cpu int, name string, env []string, lean bool, bin string, head ...string) (*server, error) {
	addrs, err := freeport.Addrs(3)
	if err != nil {
		return nil, err
	}
	s := &server{name: name, grpc: addrs[0], http: addrs[1], addr: addrs[0]}
	args := append(slices.Clone(head), "--grpc-addr", addrs[0], "--http-addr", addrs[1])
	if lean {
		args, s.addr = append(args, "--check-addr", addrs[2]), addrs[2]
	}
	bin, args = onCPU(cpu, bin, args...)
	if s.proc, err = r.start(name, r.lifetime(), env, bin, args...); err != nil {
		return nil, err
	}
	if err := waitHTTP200(ctx, s.proc, "http://"+s.http+"/readyz", 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	if got, err := cpusAllowed(s.PID()); cpu >= 0 && (err != nil || !slices.Equal(got, []uint64{uint64(cpu)})) {
		s.stop()
		return nil, fmt.Errorf("%s runs on CPUs %v (%v), want %d", name, got, err, cpu)
	}
	return s, nil
}

// serve is the head of `ratelimit-authz serve` of this tree on config,
// with extra flags.
func (r *runner) serve(config string, extra ...string) []string {
	// No lean or admin listener on the default ports unless extra names
	// one (the admin listener turns the top-keys sketch on).
	return slices.Concat([]string{"serve", "--config", config, "--log-level", "warn", "--drain-delay", "0s", "--check-addr", "off", "--admin-addr", "off"}, r.opt.serverArgs, extra)
}

// startCheckServer starts ratelimit-authz serve of this tree on config.
func (r *runner) startCheckServer(ctx context.Context, name, config string, env []string, extra ...string) (*server, error) {
	return r.startServer(ctx, -1, name, env, false, r.bins.server, r.serve(config, extra...)...)
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
