package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// envoyConcurrency are the client concurrencies of scenario 4.
var envoyConcurrency = []int{1, 16}

// envoyWorkers is Envoy's --concurrency: one worker thread, so that
// Envoy, the server, the upstream and the client share the two cores
// without Envoy taking both.
const envoyWorkers = 1

// envoyLoad is the end-to-end request stream: activity writes and inbound
// webhooks (headers only, as Envoy sends them), limits out of reach.
var envoyLoad = []string{"--routes", "activities,inbound", "--keys", "zipf"}

// envoyRunsTime is the time of the load runs of a scenario of three
// Envoy listeners (envoy, rlqs).
func (r *runner) envoyRunsTime() time.Duration {
	per := r.opt.run + r.opt.warmup + 300*time.Millisecond
	return time.Duration(len(envoyConcurrency)*r.opt.rounds*3) * per
}

func (r *runner) envoyEstimate() time.Duration { return r.envoyRunsTime() + 4*time.Second }

// envoy is scenario 4: the same requests through one Envoy on three
// listeners: the ext_authz filter disabled on the route (off), on with the
// no-op server behind it (noop), and on with ratelimit-authz (on). What
// the filter adds is on − off, of which noop − off is the ext_authz round
// trip itself. The listeners alternate within each round, in a rotating
// order.
func (r *runner) envoy(ctx context.Context) error {
	e := &EnvoyE2E{Plan: r.opt.plan(0, 0), Workers: envoyWorkers}
	r.res.Envoy = e
	be, addrs, err := r.startEnvoyBackends(ctx, "s4", 5)
	if err != nil {
		return err
	}
	defer be.stop()
	noop, err := r.startNoop(ctx, "s4-noop")
	if err != nil {
		return err
	}
	defer noop.stop()
	cfg, err := envoyConfig(r.root, envoyAddrs{Admin: addrs[1], On: addrs[2], Noop: addrs[3], Off: addrs[4], Authz: be.srv.grpc, Check: be.srv.addr, NoopAuthz: noop.grpc, App: addrs[0]})
	if err != nil {
		return err
	}
	stop, err := r.startEnvoys(ctx, be, envoySpec{"s4-envoy", addrs[1], cfg})
	if err != nil {
		return err
	}
	defer stop()
	listeners := []listener{{"off", addrs[4]}, {"noop", addrs[3]}, {"on", addrs[2]}}
	err = r.throughEnvoy(ctx, "s4", listeners, envoyLoad, be.srv.proc, func(c int, got map[string][]*loadRun, lat map[string]Lat, rps map[string]float64, errs int64) {
		row := EnvoyRow{Concurrency: c, Errors: errs}
		row.On, row.Noop, row.Off = lat["on"], lat["noop"], lat["off"]
		row.OnRPS, row.NoopRPS, row.OffRPS = rps["on"], rps["noop"], rps["off"]
		row.AddedP50, row.AddedP99 = round1(row.On.P50-row.Off.P50), round1(row.On.P99-row.Off.P99)
		row.NoopAddedP50, row.NoopAddedP99 = round1(row.Noop.P50-row.Off.P50), round1(row.Noop.P99-row.Off.P99)
		e.Rows = append(e.Rows, row)
		for _, l := range listeners {
			e.CDFs = append(e.CDFs, CDFSeries{Group: fmt.Sprintf("c=%d", c), Label: envoyLabels[l.name], Points: medianRun(got[l.name]).CDF})
		}
	})
	if err != nil {
		return err
	}
	stats, err := scrape.EnvoyStats(httpClient, "http://"+addrs[1], "ext_authz")
	if err != nil {
		return err
	}
	e.Stats = make(map[string]float64, len(stats))
	for name, v := range stats {
		e.Stats[name] = float64(v)
	}
	if e.Stats["http.authz_on.ext_authz.ok"] == 0 || e.Stats["http.authz_noop.ext_authz.ok"] == 0 || e.Stats["http.authz_off.ext_authz.ok"] != 0 {
		return fmt.Errorf("the filter was not on where expected: %v", e.Stats)
	}
	return nil
}

// envoyBackends are what the Envoys of a scenario route to: the
// upstream app, and ratelimit-authz of the allowed configuration with its
// gRPC port and its lean Check listener.
type envoyBackends struct {
	up      *proc
	srv     *server // addr: its lean Check listener
	appAddr string
}

// startEnvoyBackends starts the backends, named prefix-upstream and
// prefix-server, and returns them and n free addresses, the app on the
// first, for the scenario's Envoys; on error none is left running.
func (r *runner) startEnvoyBackends(ctx context.Context, prefix string, n int) (*envoyBackends, []string, error) {
	if r.bins.envoy == "" {
		return nil, nil, fmt.Errorf("no envoy binary (scripts/install-envoy.sh)")
	}
	addrs, err := freeport.Addrs(n)
	if err != nil {
		return nil, nil, err
	}
	be := &envoyBackends{appAddr: addrs[0]}
	be.up, err = r.start(prefix+"-upstream", r.lifetime(), nil, r.bins.bench, "upstream", "--addr", be.appAddr, "--lifetime", r.lifetime().String())
	if err != nil {
		return nil, nil, err
	}
	if be.srv, err = r.startServer(ctx, -1, prefix+"-server", nil, true, r.bins.server, r.serve(r.allowedCfg)...); err != nil {
		be.up.stop()
		return nil, nil, err
	}
	return be, addrs, nil
}

// waitApp waits until the upstream app answers.
func (be *envoyBackends) waitApp(ctx context.Context) error {
	return waitHTTP200(ctx, be.up, "http://"+be.appAddr+"/", 10*time.Second)
}

func (be *envoyBackends) stop() {
	be.srv.stop()
	be.up.stop()
}

// envoySpec is an Envoy to start: its name, admin address and bootstrap.
type envoySpec struct {
	name, admin string
	cfg         []byte
}

// startEnvoys starts an Envoy of envoyWorkers workers for each spec and
// waits until each admin says it is ready and be's app answers; stop
// stops them. On error none is left running.
func (r *runner) startEnvoys(ctx context.Context, be *envoyBackends, specs ...envoySpec) (stop func(), err error) {
	var ps []*proc
	stop = func() {
		for _, p := range ps {
			p.stop()
		}
	}
	for _, e := range specs {
		path := filepath.Join(r.tmp, e.name+".yaml")
		if err := os.WriteFile(path, e.cfg, 0o644); err != nil {
			stop()
			return nil, err
		}
		p, err := r.start(e.name, r.lifetime(), nil, r.bins.envoy, "-c", path, "--concurrency", strconv.Itoa(envoyWorkers),
			"--disable-hot-restart", "--log-level", "warn")
		if err != nil {
			stop()
			return nil, err
		}
		ps = append(ps, p)
		if err := waitHTTP200(ctx, p, "http://"+e.admin+"/ready", 30*time.Second); err != nil {
			stop()
			return nil, err
		}
	}
	if err := be.waitApp(ctx); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// listener is an Envoy listener a scenario sends its load through.
type listener struct{ name, addr string }

// throughEnvoy runs load through each listener at each of
// envoyConcurrency, the listeners in turn within each round, noting srv's
// CPU per request; each gets, for a concurrency, each listener's runs,
// their median latency and rate, and the errors of all.
func (r *runner) throughEnvoy(ctx context.Context, prefix string, listeners []listener, load []string, srv *proc,
	each func(c int, got map[string][]*loadRun, lat map[string]Lat, rps map[string]float64, errs int64)) error {
	for _, c := range envoyConcurrency {
		got := map[string][]*loadRun{}
		err := r.rotate(len(listeners), func(round, i int) error {
			l := listeners[i]
			run, err := r.loadCPU(ctx, -1, fmt.Sprintf("%s-c%d-r%d-%s", prefix, c, round+1, l.name), srv,
				append([]string{"http", "--target", l.addr, "--concurrency", strconv.Itoa(c),
					"--duration", r.opt.run.String(), "--warmup", r.opt.warmup.String(), "--timeout", "2s"}, load...)...)
			got[l.name] = append(got[l.name], run)
			return err
		})
		if err != nil {
			return err
		}
		lat, rps, errs := listenerMedians(got)
		each(c, got, lat, rps, errs)
	}
	return nil
}

// listenerMedians are, for each listener, the median latency and rate of
// its runs, and the errors of all the runs.
func listenerMedians(got map[string][]*loadRun) (map[string]Lat, map[string]float64, int64) {
	lat := map[string]Lat{}
	rps := map[string]float64{}
	var errs int64
	for name, runs := range got {
		p := pool(runs)
		lat[name], rps[name], errs = p.lat, round1(p.rps), errs+p.errors
	}
	return lat, rps, errs
}

// envoyAddrs are the addresses of the end-to-end scenario.
type envoyAddrs struct {
	Admin, On, Noop, Off  string // Envoy's admin and its three listeners
	Authz, NoopAuthz, App string // ratelimit-authz's gRPC port, the no-op server, the upstream
	Check                 string // ratelimit-authz's lean Check listener
}

// envoyConfig is the shipped bootstrap (envoy/ratelimit-authz.yaml, as
// users copy it: routes, failure access log, retries, health checks)
// with three listeners instead of its one, alike but for the ext_authz
// filter: on with ratelimit-authz as shipped, its lean Check listener
// (authz_on), on with the no-op server
// (authz_noop, a second check cluster; none without a.Noop) and left
// out (authz_off). on − off is what the filter costs; noop − off is the
// part of it any ext_authz server costs.
func envoyConfig(root string, a envoyAddrs) ([]byte, error) {
	src, err := os.ReadFile(filepath.Join(root, envoyconf.Path))
	if err != nil {
		return nil, err
	}
	cfg, err := envoyconf.Render(src, envoyconf.Addrs{Admin: a.Admin, Listener: a.On, Authz: []string{a.Authz}, Check: []string{a.Check}, App: a.App})
	if err != nil {
		return nil, err
	}
	listeners := []envoyconf.Listener{{Name: "authz_on", Addr: a.On, Authz: envoyconf.ShippedCheckCluster}}
	if a.Noop != "" {
		if cfg, err = envoyconf.WithAuthzCluster(cfg, "noop_authz", a.NoopAuthz); err != nil {
			return nil, err
		}
		listeners = append(listeners, envoyconf.Listener{Name: "authz_noop", Addr: a.Noop, Authz: "noop_authz"})
	}
	return envoyconf.WithListeners(cfg, append(listeners, envoyconf.Listener{Name: "authz_off", Addr: a.Off})...)
}

// envoyLabels name the listeners in plots.
var envoyLabels = map[string]string{"off": "filter off", "noop": "filter on, no-op server", "on": "filter on, ratelimit-authz"}

// rlqsLoad is the request stream of the rlqs scenario: activity writes
// over 200 tenants (zipf), so that one Envoy's bucket ids stay within the
// server's quota.max_bucket_ids (a tenant is one bucket id). Only the
// quota filter differs between the listeners on that route: the inbound
// routes would add the quota bootstrap's Lua snippet as well.
var rlqsLoad = []string{"--routes", "activities", "--keys", "zipf", "--tenants", "200"}

// RLQSBench is the rlqs scenario: what Envoy's quota filter adds to a
// request and costs the server, against ext_authz, through real Envoys.
type RLQSBench struct {
	Plan
	Rows  []RLQSRow `json:"rows"`
	Notes []string  `json:"notes,omitempty"`
	// Streams is the server alone under simulated Envoys' streams.
	Streams *RLQSStreams `json:"streams,omitempty"`
}

// RLQSStreams is `ratelimit-bench rlqs` against the server: streams
// reporting their bucket ids every interval, and the server's CPU.
type RLQSStreams struct {
	Streams     int              `json:"streams"`
	BucketIDs   int              `json:"bucket_ids_per_stream"`
	IntervalS   float64          `json:"interval_s"`
	ElapsedS    float64          `json:"elapsed_s"`
	Usages      int64            `json:"usages"`
	Answers     int64            `json:"answers"`
	ServerCPUMS float64          `json:"server_cpu_ms"`
	CPUUSPerUse float64          `json:"server_cpu_us_per_usage"`
	FirstP50US  float64          `json:"first_assignment_p50_us"`
	FirstP99US  float64          `json:"first_assignment_p99_us"`
	Errors      int64            `json:"errors"`
	ErrorKinds  map[string]int64 `json:"error_kinds,omitempty"`
}

// RLQSRow is one client concurrency: the three listeners' latency, what
// each filter adds (listener − off) and the server's CPU per 1,000
// requests through each.
type RLQSRow struct {
	Concurrency   int     `json:"concurrency"`
	Off           Lat     `json:"off"`
	Authz         Lat     `json:"authz"`
	Quota         Lat     `json:"quota"`
	OffRPS        float64 `json:"off_rps"`
	AuthzRPS      float64 `json:"authz_rps"`
	QuotaRPS      float64 `json:"quota_rps"`
	AuthzAddedP50 float64 `json:"authz_added_p50"`
	AuthzAddedP99 float64 `json:"authz_added_p99"`
	QuotaAddedP50 float64 `json:"quota_added_p50"`
	QuotaAddedP99 float64 `json:"quota_added_p99"`
	// AddedRatio is quota's added p50 over ext_authz's.
	AddedRatio float64 `json:"added_ratio"`
	// Server CPU (user + system, /proc) per 1,000 requests through Envoy.
	AuthzCPUMSPer1000 float64 `json:"authz_cpu_ms_per_1000"`
	QuotaCPUMSPer1000 float64 `json:"quota_cpu_ms_per_1000"`
	CPURatio          float64 `json:"cpu_ratio"`
	QuotaDenied       float64 `json:"quota_denied_share"`
	Errors            int64   `json:"errors"`
}

func (r *runner) rlqsEstimate() time.Duration { return r.envoyRunsTime() + 8*time.Second }

// rlqs is the quota scenario: the same requests through three listeners
// of two Envoys (one worker each), alternating in a rotating order within
// each round: the ext_authz bootstrap's listener without the filter
// (off) and with it (authz), and the quota bootstrap's
// (envoy/ratelimit-quota.yaml, quota). One ratelimit-authz serves both
// protocols on its gRPC port. Added latency is listener − off; the
// server's CPU is read from /proc around each run.
func (r *runner) rlqs(ctx context.Context) error {
	res := &RLQSBench{Plan: r.opt.plan(0, 0)}
	r.res.RLQS = res
	be, addrs, err := r.startEnvoyBackends(ctx, "q", 6)
	if err != nil {
		return err
	}
	defer be.stop()

	// Envoy A: ext_authz as shipped (the lean Check listener), with and
	// without the filter.
	cfgA, err := envoyConfig(r.root, envoyAddrs{Admin: addrs[1], On: addrs[2], Off: addrs[3], Authz: be.srv.grpc, Check: be.srv.addr, App: addrs[0]})
	if err != nil {
		return err
	}
	// Envoy B: the shipped quota bootstrap.
	src, err := os.ReadFile(filepath.Join(r.root, envoyconf.QuotaPath))
	if err != nil {
		return err
	}
	cfgB, err := envoyconf.Render(src, envoyconf.Addrs{Admin: addrs[4], Listener: addrs[5], Authz: []string{be.srv.grpc}, App: addrs[0]})
	if err != nil {
		return err
	}
	stop, err := r.startEnvoys(ctx, be, envoySpec{"q-envoy-authz", addrs[1], cfgA}, envoySpec{"q-envoy-quota", addrs[4], cfgB})
	if err != nil {
		return err
	}
	defer stop()
	listeners := []listener{{"off", addrs[3]}, {"authz", addrs[2]}, {"quota", addrs[5]}}
	err = r.throughEnvoy(ctx, "q", listeners, rlqsLoad, be.srv.proc, func(c int, got map[string][]*loadRun, lat map[string]Lat, rps map[string]float64, errs int64) {
		cpu := map[string][]float64{}
		for _, l := range listeners {
			for _, run := range got[l.name] {
				cpu[l.name] = append(cpu[l.name], round(run.ServerCPUUS, 3)) // µs per request = ms per 1,000
			}
		}
		row := RLQSRow{Concurrency: c, Errors: errs}
		row.Off, row.Authz, row.Quota = lat["off"], lat["authz"], lat["quota"]
		row.OffRPS, row.AuthzRPS, row.QuotaRPS = rps["off"], rps["authz"], rps["quota"]
		row.AuthzAddedP50, row.AuthzAddedP99 = round1(row.Authz.P50-row.Off.P50), round1(row.Authz.P99-row.Off.P99)
		row.QuotaAddedP50, row.QuotaAddedP99 = round1(row.Quota.P50-row.Off.P50), round1(row.Quota.P99-row.Off.P99)
		if row.AuthzAddedP50 > 0 {
			row.AddedRatio = round(row.QuotaAddedP50/row.AuthzAddedP50, 3)
		}
		row.AuthzCPUMSPer1000, row.QuotaCPUMSPer1000 = round(median(cpu["authz"]), 3), round(median(cpu["quota"]), 3)
		if row.AuthzCPUMSPer1000 > 0 {
			row.CPURatio = round(row.QuotaCPUMSPer1000/row.AuthzCPUMSPer1000, 4)
		}
		var denied []float64
		for _, run := range got["quota"] {
			denied = append(denied, run.DeniedShare())
		}
		row.QuotaDenied = round(median(denied), 4)
		res.Rows = append(res.Rows, row)
	})
	if err != nil {
		return err
	}
	for _, row := range res.Rows {
		if row.QuotaRPS == 0 {
			return fmt.Errorf("c=%d: no request went through the quota listener", row.Concurrency)
		}
	}
	return r.rlqsStreams(ctx, res, be.srv)
}

// rlqsStreams runs `ratelimit-bench rlqs` against the server: 16 streams
// (Envoys) of 200 bucket ids each, reporting every second (five times
// Envoy 1.40.0's rate), and reads the server's CPU around it.
func (r *runner) rlqsStreams(ctx context.Context, res *RLQSBench, srv *server) error {
	st := &RLQSStreams{Streams: 16, BucketIDs: 200, IntervalS: 1}
	res.Streams = st
	d := 2 * r.opt.run
	c0, err0 := cpuTimeOf(srv.pid())
	out, err := r.runTool(ctx, "q-streams", d+30*time.Second, nil, "", r.bins.bench, "rlqs", "--target", srv.grpc,
		"--streams", strconv.Itoa(st.Streams), "--buckets", strconv.Itoa(st.BucketIDs), "--interval", "1s",
		"--duration", d.String(), "--key-prefix", "streams-", "--json", "-")
	if err != nil {
		return err
	}
	c1, err1 := cpuTimeOf(srv.pid())
	var got loadresult.RLQS
	if err := json.Unmarshal(out, &got); err != nil {
		return fmt.Errorf("rlqs streams: %w", err)
	}
	st.ElapsedS, st.Usages, st.Answers, st.Errors, st.ErrorKinds = round(got.ElapsedS, 2), got.Usages, got.Answers, got.Errors, got.ErrorKinds
	st.FirstP50US, st.FirstP99US = got.FirstAssign["p50"], got.FirstAssign["p99"]
	if err0 == nil && err1 == nil && got.Usages > 0 {
		st.ServerCPUMS = round(float64((c1-c0).Microseconds())/1000, 1)
		st.CPUUSPerUse = round(float64((c1-c0).Microseconds())/float64(got.Usages), 2)
	}
	r.printf("%d streams × %d bucket ids, a report a second each for %.1fs: %d usages, %d answers, server CPU %.1f ms (%.2f µs a usage); first assignment p50 %.0fµs p99 %.0fµs; %d errors\n",
		st.Streams, st.BucketIDs, st.ElapsedS, st.Usages, st.Answers, st.ServerCPUMS, st.CPUUSPerUse, st.FirstP50US, st.FirstP99US, st.Errors)
	return nil
}

// writeRLQSReport is the rlqs scenario's section of REPORT.md.
func writeRLQSReport(b *md, res *Results, q *RLQSBench) {
	b.f("## Envoy's quota filter (RLQS) against ext_authz\n\n")
	b.f("The same requests through three listeners of two Envoys (%s, one worker each), alternating in a rotating order, %d round(s) of %gs: the ext_authz bootstrap (`envoy/ratelimit-authz.yaml`) without the filter (**off**) and with it (**ext_authz**), and the quota bootstrap (`envoy/ratelimit-quota.yaml`, **quota**: Envoy enforces the server's assignments locally and streams usage every 5 s). One `ratelimit-authz serve` (the allowed configuration) serves both: ext_authz on its lean Check listener, as shipped, the quota service on its gRPC port. Activity writes over 200 tenants (zipf), so that only the rate limit filter differs (the inbound routes of the quota bootstrap also run a Lua snippet). *Added* is listener − off; server CPU is user + system time over each run divided by its requests.\n\n",
		res.Env.EnvoyVersion, q.Rounds, q.RunS)
	b.f("| concurrency | off p50 / p99 | ext_authz added p50 / p99 | quota added p50 / p99 | quota/ext_authz added p50 | server CPU per 1,000 requests ext_authz / quota | CPU ratio | req/s off / ext_authz / quota | quota denied | errors |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range q.Rows {
		b.f("| %d | %s / %s | %s / %s | %s / %s | %.3f | %.2f ms / %.3f ms | %.4f | %.0f / %.0f / %.0f | %.1f%% | %d |\n", row.Concurrency,
			loadresult.Micros(row.Off.P50), loadresult.Micros(row.Off.P99),
			loadresult.Micros(row.AuthzAddedP50), loadresult.Micros(row.AuthzAddedP99),
			loadresult.Micros(row.QuotaAddedP50), loadresult.Micros(row.QuotaAddedP99),
			row.AddedRatio, row.AuthzCPUMSPer1000, row.QuotaCPUMSPer1000, row.CPURatio,
			row.OffRPS, row.AuthzRPS, row.QuotaRPS, 100*row.QuotaDenied, row.Errors)
	}
	if st := q.Streams; st != nil {
		b.f("\nThe server alone under `ratelimit-bench rlqs`: %d streams (simulated Envoys) of %d bucket ids each, a report of every bucket id each second (five times Envoy 1.40.0's cadence) for %.1fs: %d bucket usages, %d answers, server CPU %.1f ms, **%.2f µs per bucket usage**; a new bucket id's first assignment p50 %s, p99 %s; %d errors.\n",
			st.Streams, st.BucketIDs, st.ElapsedS, st.Usages, st.Answers, st.ServerCPUMS, st.CPUUSPerUse,
			loadresult.Micros(st.FirstP50US), loadresult.Micros(st.FirstP99US), st.Errors)
	}
	b.f("\nTargets: quota's added p50 ≤ 10%% of ext_authz's, and its server CPU per 1,000 requests ≤ 5%% of ext_authz's. An added latency within the run-to-run noise of *off* reads as ~0 (it can come out negative).\n\n")
}

// EnvoyE2E is scenario 4.
type EnvoyE2E struct {
	Plan
	Workers int                `json:"envoy_workers"`
	Rows    []EnvoyRow         `json:"rows"`
	CDFs    []CDFSeries        `json:"cdfs"`
	Stats   map[string]float64 `json:"ext_authz_stats"`
}

// EnvoyRow is one client concurrency: filter on (ratelimit-authz, no-op
// server) vs off, medians over the rounds.
type EnvoyRow struct {
	Concurrency  int     `json:"concurrency"`
	OnRPS        float64 `json:"on_rps"`
	NoopRPS      float64 `json:"noop_rps"`
	OffRPS       float64 `json:"off_rps"`
	On           Lat     `json:"on_latency_us"`
	Noop         Lat     `json:"noop_latency_us"`
	Off          Lat     `json:"off_latency_us"`
	AddedP50     float64 `json:"added_p50_us"`
	AddedP99     float64 `json:"added_p99_us"`
	NoopAddedP50 float64 `json:"noop_added_p50_us"`
	NoopAddedP99 float64 `json:"noop_added_p99_us"`
	Errors       int64   `json:"errors"`
}
