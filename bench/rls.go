package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

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
		row := RLSRow{CompareRow: compare(rlsConcurrency, w.name, servers, noops), Descriptors: w.descriptors, Denied: w.denied}
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

// RLS is the ShouldRateLimit scenario: the server against the no-op rate
// limit service, then the memory of descriptor keys.
type RLS struct {
	Plan
	Rows   []RLSRow `json:"rows"`
	Memory *Memory  `json:"memory,omitempty"` // one window-less run: no expiry, no series
}

// RLSRow is one workload against the no-op: medians over the rounds.
type RLSRow struct {
	CompareRow
	Descriptors int     `json:"descriptors"`
	Denied      bool    `json:"denied"`
	CPURatio    float64 `json:"cpu_ratio"`
}
