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

// envoyConcurrency are the client concurrencies of the end-to-end scenario.
var envoyConcurrency = []int{1, 16}

// envoyWorkers is Envoy's --concurrency: one worker thread, so that
// Envoy, the server, the upstream and the client share the two cores
// without Envoy taking both.
const envoyWorkers = 1

// envoyLoad is the request stream: activity writes over 200 tenants
// (zipf), so that an Envoy's bucket ids stay within the server's
// quota.max_bucket_ids (a tenant is one bucket id) and only the rate limit
// filter differs between the listeners (the quota bootstrap's inbound
// routes would add a Lua snippet too).
var envoyLoad = []string{"--routes", "activities", "--keys", "zipf", "--tenants", "200"}

// envoyListeners are the scenario's listeners, in report order: the
// shipped ext_authz bootstrap without the filter (off), with the no-op
// server behind it (noop) and with ratelimit-authz's lean Check listener,
// as shipped (on); and the shipped quota bootstrap (quota).
var envoyListeners = []string{"off", "noop", "on", "quota"}

// envoyLabels name the listeners in the report and the plots.
var envoyLabels = map[string]string{"off": "filter off", "noop": "ext_authz, no-op server", "on": "ext_authz, ratelimit-authz", "quota": "quota filter (RLQS)"}

func (r *runner) envoyEstimate() time.Duration {
	per := r.opt.run + r.opt.warmup + 300*time.Millisecond
	return time.Duration(len(envoyConcurrency)*r.opt.rounds*len(envoyListeners))*per + 2*r.opt.run + 15*time.Second
}

// envoy is the end-to-end scenario: the same requests through the four
// listeners of two Envoys, in a rotating order within each round. What a
// filter adds is its listener − off, of which noop − off is what any
// ext_authz server costs. One ratelimit-authz (the allowed configuration)
// serves ext_authz on its lean Check listener and the quota service on its
// gRPC port; its CPU is read from /proc around each run. Then the server
// alone under simulated Envoys' quota streams.
func (r *runner) envoy(ctx context.Context) error {
	e := &EnvoyE2E{Plan: r.opt.plan(0, 0), Workers: envoyWorkers}
	r.res.Envoy = e
	if r.bins.envoy == "" {
		return fmt.Errorf("no envoy binary (scripts/install-envoy.sh)")
	}
	addrs, err := freeport.Addrs(7)
	if err != nil {
		return err
	}
	app := addrs[0]
	up, err := r.start("e2e-upstream", r.lifetime(), nil, r.bins.bench, "upstream", "--addr", app, "--lifetime", r.lifetime().String())
	if err != nil {
		return err
	}
	defer up.stop()
	srv, err := r.startServer(ctx, -1, "e2e-server", nil, true, r.bins.server, r.serve(r.allowedCfg)...)
	if err != nil {
		return err
	}
	defer srv.stop()
	noop, err := r.startNoop(ctx, "e2e-noop")
	if err != nil {
		return err
	}
	defer noop.stop()
	cfgA, err := envoyConfig(r.root, envoyAddrs{Admin: addrs[1], On: addrs[2], Noop: addrs[3], Off: addrs[4], Authz: srv.grpc, Check: srv.addr, NoopAuthz: noop.grpc, App: app})
	if err != nil {
		return err
	}
	src, err := os.ReadFile(filepath.Join(r.root, envoyconf.QuotaPath))
	if err != nil {
		return err
	}
	cfgB, err := envoyconf.Render(src, envoyconf.Addrs{Admin: addrs[5], Listener: addrs[6], Authz: []string{srv.grpc}, App: app})
	if err != nil {
		return err
	}
	for _, x := range []struct {
		name, admin string
		cfg         []byte
	}{{"e2e-envoy-authz", addrs[1], cfgA}, {"e2e-envoy-quota", addrs[5], cfgB}} {
		p, err := r.startEnvoy(ctx, x.name, x.admin, x.cfg)
		if err != nil {
			return err
		}
		defer p.stop()
	}
	if err := waitHTTP200(ctx, up, "http://"+app+"/", 10*time.Second); err != nil {
		return err
	}
	at := map[string]string{"on": addrs[2], "noop": addrs[3], "off": addrs[4], "quota": addrs[6]}
	for _, c := range envoyConcurrency {
		got := map[string][]*loadRun{}
		err := r.rotate(len(envoyListeners), func(round, i int) error {
			l := envoyListeners[i]
			run, err := r.loadCPU(ctx, -1, fmt.Sprintf("e2e-c%d-r%d-%s", c, round+1, l), srv,
				append([]string{"http", "--target", at[l], "--concurrency", strconv.Itoa(c),
					"--duration", r.opt.run.String(), "--warmup", r.opt.warmup.String(), "--timeout", "2s"}, envoyLoad...)...)
			got[l] = append(got[l], run)
			return err
		})
		if err != nil {
			return err
		}
		off := pool(got["off"]).lat
		for _, l := range envoyListeners {
			p := pool(got[l])
			if p.rps == 0 {
				return fmt.Errorf("c=%d: no request went through the %s listener", c, l)
			}
			var cpu, denied []float64
			for _, run := range got[l] {
				cpu = append(cpu, run.ServerCPUUS) // µs per request = ms per 1,000
				denied = append(denied, run.DeniedShare())
			}
			e.Rows = append(e.Rows, EnvoyRow{Concurrency: c, Listener: l, RPS: round1(p.rps), Latency: p.lat,
				AddedP50: round1(p.lat.P50 - off.P50), AddedP99: round1(p.lat.P99 - off.P99),
				ServerCPUMSPer1000: round(median(cpu), 3), Denied: round(median(denied), 4), Errors: p.errors})
			e.CDFs = append(e.CDFs, CDFSeries{Group: fmt.Sprintf("c=%d", c), Label: envoyLabels[l], Points: medianRun(got[l]).CDF})
		}
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
	return r.rlqsStreams(ctx, e, srv)
}

// envoyRow is the row of listener l at concurrency c.
func (e *EnvoyE2E) row(c int, l string) (EnvoyRow, bool) {
	return first(e.Rows, func(x EnvoyRow) bool { return x.Concurrency == c && x.Listener == l })
}

// startEnvoy starts an Envoy of envoyWorkers workers on bootstrap cfg and
// waits until its admin at admin says it is ready; on error it is stopped.
func (r *runner) startEnvoy(ctx context.Context, name, admin string, cfg []byte) (*proc, error) {
	path := filepath.Join(r.tmp, name+".yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return nil, err
	}
	p, err := r.start(name, r.lifetime(), nil, r.bins.envoy, "-c", path, "--concurrency", strconv.Itoa(envoyWorkers),
		"--disable-hot-restart", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := waitHTTP200(ctx, p, "http://"+admin+"/ready", 30*time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
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

// rlqsStreams runs `ratelimit-bench rlqs` against the server: 16 streams
// (Envoys) of 200 bucket ids each, reporting every second (five times
// Envoy 1.40.0's rate), and reads the server's CPU around it.
func (r *runner) rlqsStreams(ctx context.Context, e *EnvoyE2E, srv *server) error {
	st := &RLQSStreams{Streams: 16, BucketIDs: 200, IntervalS: 1}
	e.Streams = st
	d := 2 * r.opt.run
	c0, err0 := cpuTime(srv.pids()...)
	out, err := r.runTool(ctx, "e2e-quota-streams", d+30*time.Second, nil, "", r.bins.bench, "rlqs", "--target", srv.grpc,
		"--streams", strconv.Itoa(st.Streams), "--buckets", strconv.Itoa(st.BucketIDs), "--interval", "1s",
		"--duration", d.String(), "--key-prefix", "streams-", "--json", "-")
	if err != nil {
		return err
	}
	c1, err1 := cpuTime(srv.pids()...)
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

// writeEnvoy writes the end-to-end scenario's section.
func writeEnvoy(b *md, res *Results, e *EnvoyE2E) {
	b.f("## End to end through Envoy: ext_authz and the quota filter\n\n")
	b.f("The same requests through four listeners of two Envoys (%s, %d worker each), alternating in a rotating order, %d round(s) of %gs: the shipped ext_authz bootstrap (`envoy/ratelimit-authz.yaml`: its routes, filter settings, failure access log, retries and health checks) with three copies of its listener that differ only in the filter — left out (**%s**), on with the no-op server behind it (**%s**), on with ratelimit-authz's lean Check listener, as shipped (**%s**) — and the shipped quota bootstrap (`envoy/ratelimit-quota.yaml`, **%s**: Envoy enforces the server's assignments locally and streams usage every 5 s). One `ratelimit-authz serve` (the allowed configuration) serves both protocols; upstream: `ratelimit-bench upstream`. Activity writes over 200 tenants (zipf) over keep-alive HTTP/1.1. *Added* is the listener's latency − the filter-off listener's; the no-op's addition is what any ext_authz server costs. Server CPU is user + system time over each run divided by its requests; the filter-off row's is the server's background work (the quota Envoy's reports among it).\n\n",
		res.Env.EnvoyVersion, e.Workers, e.Rounds, e.RunS, envoyLabels["off"], envoyLabels["noop"], envoyLabels["on"], envoyLabels["quota"])
	b.table([]string{"concurrency:", "listener", "p50:", "p99:", "added p50:", "added p99:", "req/s:", "server CPU per 1,000 requests:", "denied:", "errors:"})
	for _, row := range e.Rows {
		b.f("| %d | %s | %s | %s | %s | %s | %.0f | %.3f ms | %.1f%% | %d |\n", row.Concurrency, envoyLabels[row.Listener],
			loadresult.Micros(row.Latency.P50), loadresult.Micros(row.Latency.P99), loadresult.Micros(row.AddedP50), loadresult.Micros(row.AddedP99),
			row.RPS, row.ServerCPUMSPer1000, 100*row.Denied, row.Errors)
	}
	b.f("\nQuota against ext_authz (targets: added p50 ≤ 10%%, server CPU per 1,000 requests ≤ 5%%):")
	for _, c := range envoyConcurrency {
		q, ok1 := e.row(c, "quota")
		a, ok2 := e.row(c, "on")
		if ok1 && ok2 && a.AddedP50 > 0 && a.ServerCPUMSPer1000 > 0 {
			b.f(" at concurrency %d, added p50 **%.3f×**, CPU **%.4f×**;", c, q.AddedP50/a.AddedP50, q.ServerCPUMSPer1000/a.ServerCPUMSPer1000)
		}
	}
	b.f(" an added latency within the run-to-run noise of *off* reads as ~0 (it can come out negative).\n\n")
	if st := e.Streams; st != nil {
		b.f("The server alone under `ratelimit-bench rlqs`: %d streams (simulated Envoys) of %d bucket ids each, a report of every bucket id each second (five times Envoy 1.40.0's cadence) for %.1fs: %d bucket usages, %d answers, server CPU %.1f ms, **%.2f µs per bucket usage**; a new bucket id's first assignment p50 %s, p99 %s; %d errors.\n\n",
			st.Streams, st.BucketIDs, st.ElapsedS, st.Usages, st.Answers, st.ServerCPUMS, st.CPUUSPerUse,
			loadresult.Micros(st.FirstP50US), loadresult.Micros(st.FirstP99US), st.Errors)
	}
	b.plot(res, "latency-cdf-envoy.png", "Latency CDF through Envoy: filter off, ext_authz with the no-op server and with ratelimit-authz, the quota filter")
}

// EnvoyE2E is the end-to-end scenario.
type EnvoyE2E struct {
	Plan
	Workers int                `json:"envoy_workers"`
	Rows    []EnvoyRow         `json:"rows"`
	CDFs    []CDFSeries        `json:"cdfs"`
	Stats   map[string]float64 `json:"ext_authz_stats"`
	// Streams is the server alone under simulated Envoys' quota streams.
	Streams *RLQSStreams `json:"streams,omitempty"`
}

// EnvoyRow is one listener at one client concurrency, medians over the
// rounds.
type EnvoyRow struct {
	Concurrency int     `json:"concurrency"`
	Listener    string  `json:"listener"`
	RPS         float64 `json:"rps"`
	Latency     Lat     `json:"latency_us"`
	AddedP50    float64 `json:"added_p50_us"` // over the filter-off listener
	AddedP99    float64 `json:"added_p99_us"`
	// ServerCPUMSPer1000 is the server's CPU (user + system, /proc) per
	// 1,000 requests through the listener.
	ServerCPUMSPer1000 float64 `json:"server_cpu_ms_per_1000"`
	Denied             float64 `json:"denied_share"`
	Errors             int64   `json:"errors"`
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
