package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
)

func root(t *testing.T) string {
	t.Helper()
	r, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestGeneratedConfigsAreValid(t *testing.T) {
	dir := t.TempDir()
	allowed := filepath.Join(dir, "allowed.yaml")
	if err := writeAllowedConfig(root(t), allowed); err != nil {
		t.Fatal(err)
	}
	r, err := configfile.LoadFile(allowed)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Buckets {
		lim, ok := b.Configured()
		if b.Count == configfile.CountFailures {
			continue
		}
		if !ok || lim.Limit != roomyLimit {
			t.Errorf("allowed config: bucket %s limit %+v, want %d", b.Name, lim, roomyLimit)
		}
	}

	cost := filepath.Join(dir, "cost.yaml")
	if err := writeCostConfig(root(t), cost); err != nil {
		t.Fatal(err)
	}
	if r, err = configfile.LoadFile(cost); err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Buckets {
		if b.Count != configfile.CountFailures && (!b.Cost.AfterResponse() || b.Cost.Header != costHeader) {
			t.Errorf("cost config: bucket %s costs %v, want the response header %s", b.Name, b.Cost, costHeader)
		}
	}

	mem := filepath.Join(dir, "memory.yaml")
	if err := writeMemoryConfig(root(t), mem, 90*time.Second, 3, 1_250_000); err != nil {
		t.Fatal(err)
	}
	r, err = configfile.LoadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	if r.Counter.MaxKeys != 1_250_000 {
		t.Errorf("memory config: max_keys %d", r.Counter.MaxKeys)
	}
	for _, name := range []string{"token_create", "token_create_2", "token_create_3"} {
		lim, _ := r.Buckets[indexOf(r, name)].Configured()
		if lim.ScaleMS != 90_000 || lim.Limit != 10 {
			t.Errorf("memory config: %s %+v, want 10 per 90s", name, lim)
		}
	}
	for _, rt := range r.Routes {
		if rt.Path == "/api/v1/tokens" && len(rt.Buckets) != 3 {
			t.Errorf("memory config: /api/v1/tokens counts %d buckets, want 3", len(rt.Buckets))
		}
	}
}

func indexOf(r *configfile.Rules, name string) int {
	for i, b := range r.Buckets {
		if b.Name == name {
			return i
		}
	}
	return -1
}

func TestLastGC(t *testing.T) {
	log := filepath.Join(t.TempDir(), "server.log")
	os.WriteFile(log, []byte(`time=… level=INFO msg=serving
gc 1 @0.010s 1%: 0.010+0.5+0.003 ms clock, 0.02+0.1/0.4/0.1+0.006 ms cpu, 3->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P
gc 12 @31.2s 3%: 0.05+12+0.01 ms clock, 0.1+1/20/3+0.02 ms cpu, 210->220->118 MB, 236 MB goal, 0 MB stacks, 0 MB globals, 2 P
time=… level=INFO msg=more
`), 0o644)
	n, live, goal := lastGC(log)
	if n != 12 || live != 118<<20 || goal != 236<<20 {
		t.Errorf("lastGC = %d, %d, %d", n, live, goal)
	}
	if n, _, _ := lastGC(filepath.Join(t.TempDir(), "missing")); n != 0 {
		t.Errorf("missing log: gc %d", n)
	}
}

func TestWindows(t *testing.T) {
	at := time.UnixMilli(125_500)
	if got := nextBoundary(at, time.Minute); !got.Equal(time.UnixMilli(180_000)) {
		t.Errorf("nextBoundary = %v", got.UnixMilli())
	}
	if got := windowOf(at, time.Second); got != 125 {
		t.Errorf("windowOf = %d", got)
	}
}

func TestMedians(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	l := medianLat([]Lat{{P50: 1, P99: 10}, {P50: 3, P99: 30}, {P50: 2, P99: 20}})
	if l.P50 != 2 || l.P99 != 20 {
		t.Errorf("medianLat = %+v", l)
	}
}

// The throughput and p99 targets are judged from the floor: throughput
// at saturation against the no-op on the same stack, p99 at 40% of it.
func TestTargets(t *testing.T) {
	res := &Results{
		Floor: &Floor{Rows: []FloorRow{
			{Level: "saturation", Target: floorNoop, RPS: 100},
			{Level: "saturation", Target: "allowed", RPS: 90},
			{Level: "saturation", Target: "denied", RPS: 80},
			{Level: "40%", Rate: 4000, Target: "allowed", Latency: Lat{P99: 800}},
			{Level: "40%", Rate: 4000, Target: "denied", Latency: Lat{P99: 1500}},
		}},
		Memory: &Memory{Keys: 1_000_000, BytesPerKeyRSS: 120, BytesPerKeyHeap: 100},
	}
	got := map[string]Target{}
	for _, tg := range targets(res) {
		got[tg.Name] = tg
	}
	for name, met := range map[string]bool{"throughput": false, "p99": false, "memory": true} {
		tg := got[name]
		if tg.Met == nil || *tg.Met != met {
			t.Errorf("%s: met %v, want %v (%+v)", name, tg.Met, met, tg)
		}
	}
	if tp := got["throughput"]; tp.Value != 0.8 || !strings.Contains(tp.Margin, "6% short") || !strings.Contains(tp.Measured, "0.90× allowed, 0.80× denied (90 and 80 vs 100 checks/s)") {
		t.Errorf("throughput %+v", tp)
	}
	if p := got["p99"]; p.Value != 1500 || !strings.Contains(p.Measured, "at 4000/s") {
		t.Errorf("p99 %+v", p)
	}
	if _, ok := got["cluster"]; ok {
		t.Error("a cluster target: the accuracy targets judge the cluster")
	}
	for _, tg := range targets(&Results{}) {
		if tg.Met != nil {
			t.Errorf("%s judged without figures", tg.Name)
		}
	}
}

func TestReportRenders(t *testing.T) {
	out := t.TempDir()
	r := &runner{out: out, res: &Results{
		StartedAt: time.Unix(0, 0), FinishedAt: time.Unix(300, 0),
		Env: Env{CPU: "test", Cores: 2},
		Floor: &Floor{Rows: []FloorRow{{Level: "saturation", Target: floorNoop, RPS: 10000, CPUUS: 20},
			{Level: "saturation", Target: "allowed", RPS: 5000, CPUUS: 40}, {Level: "saturation", Target: "denied", RPS: 9000, CPUUS: 22}}},
		Memory: &Memory{Keys: 1000, BytesPerKeyRSS: 300, BytesPerKeyHeap: 120, Loaded: MemPoint{RSS: 1 << 20}},
		Envoy: &EnvoyE2E{Rows: []EnvoyRow{{Concurrency: 1, Listener: "on", AddedP50: 300, ServerCPUMSPer1000: 60},
			{Concurrency: 1, Listener: "quota", AddedP50: 30, ServerCPUMSPer1000: 3}}},
		Micro:  &Micro{Command: "go test", Benchstat: "geomean 1"},
		Errors: []StepError{{"envoy", "boom\nmore"}},
		Plots:  []string{"memory.png"},
	}}
	r.res.Targets = targets(r.res)
	if err := r.writeReport(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(out, "REPORT.md"))
	for _, want := range []string{"## Targets", "**missed**", "## Memory",
		"## End to end",
		"![RSS and live keys", "**envoy failed**: boom", "| 1 | quota filter (RLQS) |", "at concurrency 1, added p50 **0.100×**, CPU **0.0500×**", "geomean 1"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	if bytes.Contains(b, []byte("latency-cdf-envoy.png")) {
		t.Error("REPORT.md links a plot that was not drawn")
	}
}

func TestOptions(t *testing.T) {
	o, done, err := parseOptions([]string{"--only", "floor,envoy", "--rounds", "3"}, io.Discard, io.Discard)
	if err != nil || done || !o.only["floor"] || !o.only["envoy"] || o.only["micro"] || o.rounds != 3 {
		t.Errorf("options %+v, %v, %v", o, done, err)
	}
	for _, args := range [][]string{{"--only", "bogus"}, {"--only", "single"}, {"--only", "cluster"}, {"--rounds", "0"}, {"extra"}, {"--nope"}} {
		if _, done, err := parseOptions(args, io.Discard, io.Discard); !done || err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if o, _, _ := parseOptions([]string{"--quick"}, io.Discard, io.Discard); o.memKeys != 100_000 || o.rounds != 1 || !o.only["accuracy"] {
		t.Errorf("quick: %+v", o)
	}
	if o, _, _ := parseOptions(nil, io.Discard, io.Discard); !o.only["floor"] || o.baselineRef != defaultBaselineRef {
		t.Errorf("defaults: floor %v, baseline %q", o.only["floor"], o.baselineRef)
	}
	if o, _, err := parseOptions([]string{"--server-args", " --a=1  --b 2 "}, io.Discard, io.Discard); err != nil || strings.Join(o.serverArgs, "|") != "--a=1|--b|2" {
		t.Errorf("server args %q, %v", o.serverArgs, err)
	}
	if o, _, err := parseOptions([]string{"--baseline-ref", ""}, io.Discard, io.Discard); err != nil || o.baselineRef != "" {
		t.Errorf("no baseline: %q, %v", o.baselineRef, err)
	}
	if v := envoyVersion("envoy  version: 0f1b9a/1.40.0/Clean/RELEASE/BoringSSL"); v != "1.40.0" {
		t.Errorf("envoyVersion = %q", v)
	}
}

// TestRewriteReport: --report-only rewrites REPORT.md from results.json,
// judging the targets anew, and runs nothing.
func TestRewriteReport(t *testing.T) {
	out := t.TempDir()
	res := &Results{Schema: resultsSchema, StartedAt: time.Unix(0, 0), FinishedAt: time.Unix(300, 0), Env: Env{CPU: "test", Cores: 2},
		Memory:  &Memory{Keys: 1_000_000, BytesPerKeyRSS: 140, BytesPerKeyHeap: 100, Loaded: MemPoint{RSS: 1 << 20, LiveKeys: 1_000_000}},
		Timings: []StepTime{{Step: "memory", Seconds: 300}}}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "results.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := &runner{out: out, logDir: filepath.Join(out, "logs"), stdout: io.Discard, opt: options{plot: false}}
	if err := r.rewriteReport(context.Background()); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(filepath.Join(out, "REPORT.md"))
	if err != nil {
		t.Fatal(err)
	}
	// results.json of another layout is refused, not misread.
	res.Schema = resultsSchema - 1
	if b, err = json.Marshal(res); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "results.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.rewriteReport(context.Background()); err == nil || !strings.Contains(err.Error(), "schema") {
		t.Errorf("an older results.json: %v, want a schema error", err)
	}
	for _, want := range []string{"| ≤ 150 bytes per live key resident (RSS) at 1 M keys | 140 B/key resident at 1000000 live keys, 100 B/key live heap | **met** |", "| memory | 300 |"} {
		if !bytes.Contains(report, []byte(want)) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
}
