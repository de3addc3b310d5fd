package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

// The targets the report judges a run by (reported against, not asserted).
const (
	targetRatio       = 0.85
	targetP99US       = 1000.0
	targetBytesPerKey = 150.0
	targetOvershoot   = 1.1

	// The floor issue's targets.
	targetFloorCPU     = 0.70 // CPU per check at saturation, × the default grpc-go no-op's
	targetFloorLowRate = 0.6  // CPU per check at 10% of saturation, × the baseline's
	targetFloorP99     = 1.0  // p99 at 40% of saturation, × the default no-op's
)

// first is the first of xs that ok accepts.
func first[T any](xs []T, ok func(T) bool) (T, bool) {
	if i := slices.IndexFunc(xs, ok); i >= 0 {
		return xs[i], true
	}
	var zero T
	return zero, false
}

// floorRatio is the floor scenario's ratio of workload w over vs at level.
func floorRatio(f *Floor, level, w, vs string) (FloorRatio, bool) {
	if f == nil {
		return FloorRatio{}, false
	}
	return first(f.Ratios, func(x FloorRatio) bool { return x.Level == level && x.Workload == w && x.Versus == vs })
}

// floorRowOf is the floor scenario's row of target at level.
func floorRowOf(f *Floor, level, target string) (FloorRow, bool) {
	if f == nil {
		return FloorRow{}, false
	}
	return first(f.Rows, func(x FloorRow) bool { return x.Level == level && x.Target == target })
}

// ratioTarget judges the worst of the floor's CPU-per-check ratios of
// workload over reference at level (each pair's median over the rounds)
// against limit.
func ratioTarget(f *Floor, name, goal, level string, limit float64, pairs ...[2]string) Target {
	t := Target{Name: name, Goal: goal}
	var parts []string
	worst := 0.0
	for _, p := range pairs {
		x, ok := floorRatio(f, level, p[0], p[1])
		if !ok {
			if f != nil && f.Baseline != nil && f.Baseline.Error != "" && strings.HasPrefix(p[1], floorBaseline) {
				t.Measured = "no baseline: " + f.Baseline.Error
			}
			return t
		}
		worst = max(worst, x.Median)
		parts = append(parts, fmt.Sprintf("%.2f× %s vs %s (%.2f–%.2f)", x.Median, p[0], p[1], x.Min, x.Max))
	}
	t.Value, t.Measured = round(worst, 3), strings.Join(parts, ", ")
	t.judge(worst <= limit, "%.2f× against %.2f×", worst, limit)
	return t
}

// p99Target judges the worse p99 of the allowed and denied rows at level
// (each the median over the rounds) over the reference row's.
func p99Target(f *Floor, name, goal, level, allowed, denied, ref string) Target {
	t := Target{Name: name, Goal: goal}
	a, okA := floorRowOf(f, level, allowed)
	d, okD := floorRowOf(f, level, denied)
	n, okN := floorRowOf(f, level, ref)
	if !okA || !okD || !okN || n.Latency.P99 <= 0 {
		return t
	}
	worst := max(a.Latency.P99, d.Latency.P99) / n.Latency.P99
	t.Value = round(worst, 3)
	t.Measured = fmt.Sprintf("%s allowed, %s denied vs %s at %.0f/s (medians over the rounds)",
		loadresult.Micros(a.Latency.P99), loadresult.Micros(d.Latency.P99), loadresult.Micros(n.Latency.P99), a.Rate)
	t.judge(worst <= targetFloorP99, "%.2f× the default no-op's p99", worst)
	return t
}

// floorTargets are the floor's CPU and latency targets, for this tree's
// gRPC port and its lean listener (target names ending in "-lean"), then
// ShouldRateLimit's on the lean listener.
func floorTargets(f *Floor) []Target {
	low, mid := shareName(floorShares[0]), shareName(floorShares[1])
	var out []Target
	for _, path := range []struct{ prefix, suffix, label string }{{"", "", ""}, {floorLean, "-lean", " — lean Check listener (--check-addr)"}} {
		a, d := path.prefix+"allowed", path.prefix+"denied"
		out = append(out,
			ratioTarget(f, "floor-cpu"+path.suffix, "CPU per check at saturation ≤ 0.70× the default grpc-go no-op, allowed and denied (pinned, 50 in flight)"+path.label,
				"saturation", targetFloorCPU, [2]string{a, floorDefaultNoop}, [2]string{d, floorDefaultNoop}),
			ratioTarget(f, "floor-low-rate"+path.suffix, "CPU per check at 10% of saturation ≤ 0.6× today's (the server of the baseline commit, same run)"+path.label,
				low, targetFloorLowRate, [2]string{a, floorBaseline + "allowed"}, [2]string{d, floorBaseline + "denied"}),
			p99Target(f, "floor-p99"+path.suffix, "p99 at 40% of saturation ≤ the default grpc-go no-op's, allowed and denied"+path.label,
				mid, a, d, floorDefaultNoop))
	}
	lean := floorRLS + floorLean
	return append(out,
		ratioTarget(f, "floor-rls-cpu-lean", "ShouldRateLimit on the lean listener: CPU per call at saturation ≤ 0.35× the default grpc-go no-op's, allowed and denied (pinned, one descriptor)",
			"saturation", targetRLSFloorNoop, [2]string{lean + "allowed", floorRLS + floorDefaultNoop}, [2]string{lean + "denied", floorRLS + floorDefaultNoop}),
		ratioTarget(f, "floor-rls-vs-redis", "ShouldRateLimit on the lean listener: CPU per call ≤ 0.15× envoyproxy/ratelimit with Redis (its CPU and Redis's), allowed and denied",
			"saturation", targetRLSFloorRedis, [2]string{lean + "allowed", floorRatelimit + "allowed"}, [2]string{lean + "denied", floorRatelimit + "denied"}),
		ratioTarget(f, "floor-rls-vs-localcache", "ShouldRateLimit on the lean listener: CPU per denial ≤ 0.3× envoyproxy/ratelimit's local-cache denials",
			"saturation", targetRLSFloorLocalCache, [2]string{lean + "denied", floorRLCache + "denied"}))
}

func ptr(b bool) *bool { return &b }

// targets judges the run against every target. The report states each
// missed one's margin; docs/performance.md says what usually explains it.
func targets(res *Results) []Target {
	var out []Target

	t := Target{Name: "throughput", Goal: "Check throughput at saturation ≥ 0.85× the no-op on this tree's stack, allowed and denied (the floor: pinned, 50 in flight)"}
	a, okA := floorRowOf(res.Floor, "saturation", "allowed")
	d, okD := floorRowOf(res.Floor, "saturation", "denied")
	n, okN := floorRowOf(res.Floor, "saturation", floorNoop)
	if okA && okD && okN && n.RPS > 0 {
		worst := min(a.RPS, d.RPS) / n.RPS
		t.Value = round(worst, 3)
		t.Measured = fmt.Sprintf("%.2f× allowed, %.2f× denied (%.0f and %.0f vs %.0f checks/s)", a.RPS/n.RPS, d.RPS/n.RPS, a.RPS, d.RPS, n.RPS)
		t.judge(worst >= targetRatio, "%.0f%% short of 0.85×", 100*(targetRatio-worst)/targetRatio)
	}
	out = append(out, t)

	midRate := shareName(floorShares[1])
	t = Target{Name: "p99", Goal: "p99 ≤ 1 ms at 40% of saturation, allowed and denied (the floor: pinned, open loop)"}
	a, okA = floorRowOf(res.Floor, midRate, "allowed")
	d, okD = floorRowOf(res.Floor, midRate, "denied")
	if okA && okD {
		worst := max(a.Latency.P99, d.Latency.P99)
		t.Value = worst
		t.Measured = fmt.Sprintf("%s allowed, %s denied at %.0f/s", loadresult.Micros(a.Latency.P99), loadresult.Micros(d.Latency.P99), a.Rate)
		t.judge(worst <= targetP99US, "%.1f× the 1 ms goal", worst/targetP99US)
	}
	out = append(out, t)

	t = Target{Name: "memory", Goal: "≤ 150 bytes per live key resident (RSS) at 1 M keys"}
	if m := res.Memory; m != nil && m.BytesPerKeyRSS > 0 {
		t.Value = m.BytesPerKeyRSS
		t.Measured = fmt.Sprintf("%.0f B/key resident at %.0f live keys, %.0f B/key live heap", m.BytesPerKeyRSS, m.Loaded.LiveKeys, m.BytesPerKeyHeap)
		t.judge(m.BytesPerKeyRSS <= targetBytesPerKey, "%.0f B/key over", m.BytesPerKeyRSS-targetBytesPerKey)
		if m.Keys < 1_000_000 {
			t.Measured += " — fewer than 1 M keys, not the target's figure"
			t.Met = nil
		}
	}
	out = append(out, t)

	out = append(out, accuracyTargets(res)...)
	out = append(out, floorTargets(res.Floor)...)
	return append(out, scaleTarget(res))
}

// writeReport writes REPORT.md from the results, one section after
// another.
func (r *runner) writeReport() error {
	var b md
	res := r.res
	writeHeader(&b, res)
	writeTargets(&b, res)
	section(&b, res, res.Floor, writeFloor)
	section(&b, res, res.Floor, writeRLSFloor)
	section(&b, res, res.Memory, writeMemory)
	section(&b, res, res.Accuracy, writeAccuracyReport)
	section(&b, res, res.Envoy, writeEnvoy)
	section(&b, res, res.Scale, writeScale)
	section(&b, res, res.Micro, writeMicro)
	writeNotes(&b, res)
	writeSteps(&b, res)
	return os.WriteFile(filepath.Join(r.out, "REPORT.md"), []byte(b.String()), 0o644)
}

// writeHeader writes the title, when and where the run was made, and
// the machine.
func writeHeader(b *md, res *Results) {
	b.f("# ratelimit-authz benchmarks\n\n")
	b.f("Generated by `make bench` (bench/run.sh → `go run ./bench`) on %s, in %s. ",
		res.StartedAt.Format("2006-01-02 15:04 MST"), res.FinishedAt.Sub(res.StartedAt).Round(time.Second))
	b.f("Raw figures: `results.json`; every load run: `runs/*.json`; process logs: `logs/`.\n\n")
	if res.Env.Quick {
		b.f("> **Quick run** (`--quick`): short runs that check the pipeline. Do not quote these figures.\n\n")
	}
	b.f("| machine | |\n|---|---|\n")
	b.f("| CPU | %s, %d cores |\n", res.Env.CPU, res.Env.Cores)
	b.f("| load average (1/5/15 min) | %.2f %.2f %.2f before, %.2f %.2f %.2f after |\n",
		res.Env.LoadBefore[0], res.Env.LoadBefore[1], res.Env.LoadBefore[2], res.Env.LoadAfter[0], res.Env.LoadAfter[1], res.Env.LoadAfter[2])
	b.f("| Go | %s |\n| commit | %s |\n", res.Env.GoVersion, res.Env.Git)
	if len(res.Env.ServerArgs) > 0 {
		b.f("| server flags (`--server-args`) | `%s` |\n", strings.Join(res.Env.ServerArgs, " "))
	}
	if res.Env.EnvoyVersion != "" {
		b.f("| Envoy | %s |\n", res.Env.EnvoyVersion)
	}
	if res.Env.NATSVersion != "" {
		b.f("| NATS | %s |\n", res.Env.NATSVersion)
	}
	b.f("\nThe load tool, the servers and Envoy share the same %d cores, so every throughput is a ratio to the no-op server measured in the same run, the two alternating. The load average before the run is other work on the machine; during it the benchmark itself keeps both cores busy (a load of 2 to 3), so more than that at a step's end means other work competed.\n\n", res.Env.Cores)
}

// writeTargets writes the targets and each one's verdict.
func writeTargets(b *md, res *Results) {
	b.f("## Targets\n\n| target | measured | |\n|---|---|---|\n")
	for _, t := range res.Targets {
		verdict := "not measured"
		if t.Met != nil {
			verdict = "**met**"
			if !*t.Met {
				verdict = "**missed**: " + t.Margin
			}
		}
		measured := t.Measured
		if measured == "" {
			measured = "—"
		}
		b.f("| %s | %s | %s |\n", t.Goal, measured, verdict)
	}
	b.f("\nWhat usually explains a missed target: [docs/performance.md](../../docs/performance.md#what-make-bench-measures).\n\n")
}

func writeMemory(b *md, res *Results, m *Memory) {
	b.f("## Memory: %d distinct keys in one %ds window\n\n", m.Keys, m.WindowS)
	copies := "no copy of it"
	switch {
	case m.Buckets == 2:
		copies = "a copy of it"
	case m.Buckets > 2:
		copies = fmt.Sprintf("%d copies of it", m.Buckets-1)
	}
	b.f("`token_create` (per client IP) with its window set to %ds, and %s on the same route, so that each check brings %d new key(s): %d checks, each from a new client IP, sent within one window (%.1fs, %.0f checks/s, %d errors). A (bucket, key) pair is a live key with its own entry, table slot and key bytes, whichever check brought it. `counter.max_keys` %d (the bound is per shard: a store filled to exactly max_keys refuses some keys early); sweeper every %gs. Resident memory from /proc/PID/status, live keys from `ratelimit_authz_counter_live_keys`, live heap from the first GC after each point (`GODEBUG=gctrace=1`; a burst of unmatched checks makes the server collect).\n\n",
		m.WindowS, copies, m.Buckets, m.Checks, m.LoadS, m.LoadRPS, m.Errors, m.MaxKeysConfig, m.SweepS)
	writeMemPoints(b, memPoint{"before", m.Baseline}, memPoint{"all keys live", m.Loaded}, memPoint{"after expiry and sweep", m.Expired})
	b.f("\n**%.0f bytes per live key resident** (RSS growth / live keys), **%.0f bytes per live key of live heap**; %.0f keys refused.", m.BytesPerKeyRSS, m.BytesPerKeyHeap, m.Refused)
	if m.Note != "" {
		b.f(" Note: %s.", m.Note)
	}
	b.f("\n\n")
	b.plot(res, "memory.png", "RSS and live keys over the memory run")
}

// writeMicro writes the microbenchmarks' section.
func writeMicro(b *md, res *Results, m *Micro) {
	b.f("## Go microbenchmarks\n\n`%s`", m.Command)
	if m.Compared {
		b.f(", compared with the previous run on this machine (`micro.prev.txt`)")
	}
	b.f(". Each figure is the median of the runs ± the 95%% confidence interval; `B/key` is BenchmarkMemoryPerKey's heap per live key.\n\n<details><summary>benchstat</summary>\n\n```\n%s\n```\n</details>\n\n", strings.TrimSpace(m.Benchstat+"\n"+m.Error))
}

// writeNotes lists the run's notes and the steps that failed.
func writeNotes(b *md, res *Results) {
	if len(res.Notes) == 0 && len(res.Errors) == 0 && res.PlotError == "" {
		return
	}
	b.f("## Notes\n\n")
	for _, n := range res.Notes {
		b.f("- %s\n", n)
	}
	if res.PlotError != "" {
		b.f("- plots: %s\n", firstLine(res.PlotError))
	}
	for _, e := range res.Errors {
		b.f("- **%s failed**: %s\n", e.Step, firstLine(e.Error))
	}
	b.f("\n")
}

// writeSteps writes how long each step took, and how to rerun.
func writeSteps(b *md, res *Results) {
	b.f("## Steps\n\nThe memory step's time includes the steps it ran while waiting for a fresh window and for its keys to expire.\n\n| step | seconds | load average at its end |\n|---|---:|---:|\n")
	for _, t := range res.Timings {
		b.f("| %s | %.0f | %.2f |\n", t.Step, t.Seconds, t.Load1)
	}
	b.f("\nRerun: `make bench` (all of it), or `go run ./bench --only floor,envoy` and friends; `go run ./cmd/ratelimit-bench check --help` for the load tool.\n")
}

// writeFloor writes the floor scenario's section.
func writeFloor(b *md, res *Results, f *Floor) {
	b.f("## Floor: CPU per check against a default grpc-go no-op\n\n")
	b.f("Every server bound to one CPU and the load tool (`ratelimit-bench check`) to the other (%s; each started by `taskset -c` and its `Cpus_allowed_list` checked after its start, so a Go process sizes GOMAXPROCS to 1), %d checks in flight over %d gRPC connections, %d round(s) of %gs (after %gs warm-up), the targets alternating in a rotating order within each round. CPU per check is the server process's user + system time over the run (/proc/PID/stat) divided by the checks it answered. Targets:\n\n",
		f.Pinning, f.Concurrency, f.Conns, f.Rounds, f.RunS, f.WarmupS)
	b.f("- **default-noop**: `ratelimit-bench noop-grpc`, generated code on a plain `grpc.NewServer()` with no options, one shared OK answer: the floor of any grpc-go ext_authz server.\n")
	b.f("- **noop**: `ratelimit-bench noop`, the no-op on this tree's gRPC stack (`internal/server`).\n")
	b.f("- **allowed**, **denied**: `ratelimit-authz serve` of this tree. **allowed**: the example API's route mix (`ratelimit-bench routes`), zipf(1.1) keys over 1000 tenants, 1000 channels, 10000 client IPs, 1000 accounts, limits out of reach, so every check counts and is allowed; **denied**: the same mix over 4 keys of each kind against the shipped limits, so most checks are over a limit. **lean-…**: the same on its lean Check listener (`--check-addr`).\n")
	b.f("- **lean-cost-allowed**: the lean listener with every request bucket a budget charged after the response (`cost: {response_header: %s}`), under the allowed load: the Check peeks at each bucket and records its key for the access log instead of counting. **charges**: the same server on its gRPC port under `ratelimit-bench accesslog`, Envoy's access-log stream (one entry per message, one stream per connection) with each entry charging 100 to its tenant's `activity_create`; its checks/s are charges/s, its CPU µs per check CPU per charge, each run checked against the entries the server counted.\n", costHeader)
	if bl := f.Baseline; bl != nil {
		if bl.Error != "" {
			b.f("- **baseline**: not measured (%s): %s.\n", bl.Ref, bl.Error)
		} else {
			b.f("- **baseline-allowed**, **baseline-denied**: `ratelimit-authz serve` built in this run from `%s` (`--baseline-ref`), \"today's\" server, on that commit's own configuration files.\n", bl.Commit)
		}
	}
	b.f("\nFixed rates are shares of the default no-op's median saturated throughput, %.0f checks/s; open loop, up to %d in flight.\n\n", f.SaturationRPS, f.Concurrency)
	b.f("*Waited* is the time the server's threads were runnable but waiting for their CPU, summed over its threads, as a share of the run (/proc/PID/task/*/schedstat; several threads waiting at once can pass 100%%): other work on that CPU, which makes the figures of that run less comparable.\n\n")
	writeFloorTables(b, f, func(target string) bool { return !isRLSTarget(target) })
	var tops []string
	for _, w := range []string{"allowed", "denied"} {
		on, okOn := floorRowOf(f, "saturation", floorLean+w+floorTop)
		off, okOff := floorRowOf(f, "saturation", floorLean+w)
		x, okX := floorRatio(f, "saturation", floorLean+w+floorTop, floorLean+w)
		if okOn && okOff && okX {
			tops = append(tops, fmt.Sprintf("%s %.2f µs on, %.2f µs off: **%.3f×** (rounds %.3f–%.3f)", w, on.CPUUS, off.CPUUS, x.Median, x.Min, x.Max))
		}
	}
	if len(tops) > 0 {
		b.f("\nThe top-keys sketch (**lean-…-top**: the same server with an admin listener, `--admin-addr`, which turns the sketch on) against the same server without, lean Check listener at saturation, CPU per check: %s.\n", strings.Join(tops, "; "))
	}
	if c, ok := floorRowOf(f, "saturation", floorCharges); ok {
		b.f("\nCost budgets charged after the response: **%.0f charges/s**, **%.1f µs of server CPU per charge** (%.1f–%.1f), the server pinned as the others.", c.RPS, c.CPUUS, c.CPUMin, c.CPUMax)
		if x, ok := floorRatio(f, "saturation", floorCost, floorLean+"allowed"); ok {
			pk, _ := floorRowOf(f, "saturation", floorCost)
			cn, _ := floorRowOf(f, "saturation", floorLean+"allowed")
			b.f(" The Check on the lean listener: %.1f µs per check peeking at cost buckets, %.1f µs counting, **%.3f×** (rounds %.3f–%.3f).", pk.CPUUS, cn.CPUUS, x.Median, x.Min, x.Max)
		}
		b.f("\n")
	}
}

// writeFloorTables writes the floor's rows of the targets keep accepts,
// then their ratios to each reference.
func writeFloorTables(b *md, f *Floor, keep func(target string) bool) {
	b.table([]string{"level", "target", "checks/s:", "CPU µs/check (range):", "p50:", "p90:", "p99:", "p99.9:", "denied:", "tool CPU µs/check:", "waited:", "errors:"})
	for _, row := range f.Rows {
		if !keep(row.Target) {
			continue
		}
		level := row.Level
		if row.Rate > 0 {
			level = fmt.Sprintf("%s (%.0f/s)", row.Level, row.Rate)
		}
		b.f("| %s | %s | %.0f | %.1f (%.1f–%.1f) | %s | %s | %s | %s | %.1f%% | %.1f | %.1f%% | %d |\n", level, row.Target, row.RPS, row.CPUUS, row.CPUMin, row.CPUMax,
			loadresult.Micros(row.Latency.P50), loadresult.Micros(row.Latency.P90), loadresult.Micros(row.Latency.P99), loadresult.Micros(row.Latency.P999),
			100*row.DeniedShare, row.ClientCPUUS, 100*row.WaitShare, row.Errors)
	}
	b.f("\nCPU per check of the server over each reference's, paired per round (median, range in brackets), and the median of the per-round p99 ratios:\n\n")
	b.table([]string{"level", "workload", "vs", "CPU ratio:", "per round", "p99 ratio:"})
	for _, x := range f.Ratios {
		if keep(x.Workload) {
			b.f("| %s | %s | %s | **%.3f** (%.3f–%.3f) | %s | %.2f |\n", x.Level, x.Workload, x.Versus, x.Median, x.Min, x.Max,
				strings.Trim(fmt.Sprint(x.PerRound), "[]"), x.P99Ratio)
		}
	}
	b.f("\n")
}

// writeRLSFloor writes the floor's ShouldRateLimit targets as a section
// of their own.
func writeRLSFloor(b *md, res *Results, f *Floor) {
	if !slices.ContainsFunc(f.Rows, func(x FloorRow) bool { return isRLSTarget(x.Target) }) {
		return
	}
	b.f("## ShouldRateLimit (RLS) against the no-op and the anchors\n\n")
	b.f("Pinned and measured as the floor's Check targets, at saturation, with `ratelimit-bench rls` (one descriptor per call, `(remote_address, <client IP>)`, over the descriptor file `ratelimit-bench rls-config` writes):\n\n")
	b.f("- **rls-default-noop** is `noop-grpc` answering OK; **rls-allowed**, **rls-denied** this tree's server on its gRPC port, **rls-lean-…** on its lean listener; **ratelimit-redis-…** envoyproxy/ratelimit `%s` with a Redis of its own (`redis-server` on the same CPU; CPU per call counts both), **ratelimit-localcache-denied** the same with `LOCAL_CACHE_SIZE_IN_BYTES`=%d (over-limit keys answered without Redis); **gubernator-…** gubernator `%s`, one node, driven with `ratelimit-bench gubernator` (GetRateLimits with the same keys and limits). An anchor that did not build is named in the notes.\n", ratelimitVersion, ratelimitLocalCache, gubernatorVer)
	b.f("\n")
	writeFloorTables(b, f, isRLSTarget)
}

// plot shows the plot name, when the run drew it.
func (b *md) plot(res *Results, name, alt string) {
	if slices.Contains(res.Plots, name) {
		b.f("![%s](%s)\n\n", alt, name)
	}
}

// section writes the section of a scenario's results x, when the run has
// them.
func section[T any](b *md, res *Results, x *T, write func(*md, *Results, *T)) {
	if x != nil {
		write(b, res, x)
	}
}

// table writes a table's header: the columns cols and then more, a
// column right-aligned (figures) when its name ends in ":".
func (b *md) table(cols []string, more ...string) {
	var head, rule string
	for _, c := range append(cols, more...) {
		name, right := strings.CutSuffix(c, ":")
		head += "| " + name + " "
		rule += map[bool]string{false: "|---", true: "|---:"}[right]
	}
	b.f("%s|\n%s|\n", head, rule)
}

// md is the report being written, in Markdown; f appends to it as
// fmt.Fprintf would.
type md struct{ strings.Builder }

func (b *md) f(format string, args ...any) { fmt.Fprintf(&b.Builder, format, args...) }

// memPoint is a named row of a memory table.
type memPoint struct {
	name string
	p    MemPoint
}

// writeMemPoints writes a table of a server's memory at the points.
func writeMemPoints(b *md, points ...memPoint) {
	b.WriteString("| | RSS | peak RSS | live keys | live heap |\n|---|---:|---:|---:|---:|\n")
	for _, row := range points {
		b.f("| %s | %s | %s | %.0f | %s |\n", row.name, mib(row.p.RSS), mib(row.p.HWM), row.p.LiveKeys, mibOrDash(row.p.LiveHeap))
	}
}

func mibOrDash(n int64) string {
	if n <= 0 {
		return "—"
	}
	return mib(n)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
