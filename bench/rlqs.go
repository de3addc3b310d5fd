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
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

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
	Runs  []RLQSRun `json:"runs"`
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

// RLQSRun is one measured run, for the record.
type RLQSRun struct {
	Concurrency    int     `json:"concurrency"`
	Round          int     `json:"round"`
	Listener       string  `json:"listener"`
	RPS            float64 `json:"rps"`
	P50            float64 `json:"p50"`
	P99            float64 `json:"p99"`
	ServerCPUMS1K  float64 `json:"server_cpu_ms_per_1000,omitempty"`
	DeniedShare    float64 `json:"denied_share"`
	Errors         int64   `json:"errors"`
	RequestsToSend int64   `json:"sent"`
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
			for i, run := range got[l.name] {
				per1000 := round(run.ServerCPUUS, 3) // µs per request = ms per 1,000
				cpu[l.name] = append(cpu[l.name], per1000)
				res.Runs = append(res.Runs, RLQSRun{Concurrency: c, Round: i + 1, Listener: l.name, RPS: round1(run.RPS),
					P50: run.Latency.P50, P99: run.Latency.P99, ServerCPUMS1K: per1000, DeniedShare: round(run.DeniedShare(), 4),
					Errors: run.Errors, RequestsToSend: run.Sent})
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
	var got struct {
		ElapsedS    float64            `json:"elapsed_s"`
		Usages      int64              `json:"usages"`
		Answers     int64              `json:"answers"`
		FirstAssign map[string]float64 `json:"first_assignment_us"`
		Errors      int64              `json:"errors"`
		ErrorKinds  map[string]int64   `json:"error_kinds"`
	}
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
