package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

// startOn starts the command onCPU names: it runs on its CPU alone, and
// the runner's own threads keep their CPUs.
func startOn(t *testing.T, cpu int, bin string, args ...string) *exec.Cmd {
	t.Helper()
	bin, args = onCPU(cpu, bin, args...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func TestOnCPUBindsTheChildOnly(t *testing.T) {
	own, err := cpusAllowed(os.Getpid())
	if err != nil || len(own) == 0 {
		t.Fatalf("cpusAllowed: %v %v", own, err)
	}
	cpu := int(own[len(own)-1])
	cmd := startOn(t, cpu, "sleep", "30")
	// taskset execs the command in its own process: poll until it has.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if strings.TrimSpace(string(b)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child is %q, not sleep", b)
		}
	}
	if got, err := cpusAllowed(cmd.Process.Pid); err != nil || !slices.Equal(got, []uint64{uint64(cpu)}) {
		t.Errorf("child on CPUs %v (%v), want %d", got, err, cpu)
	}
	if got, err := cpusAllowed(os.Getpid()); err != nil || !slices.Equal(got, own) {
		t.Errorf("runner on CPUs %v (%v), want %v", got, err, own)
	}
	if bin, args := onCPU(-1, "sleep", "1"); bin != "sleep" || len(args) != 1 {
		t.Errorf("unbound: %s %v", bin, args)
	}
}

// The runner's own CPU time grows by what it burns, and its status has
// its resident memory.
func TestCPUTimeAndStatus(t *testing.T) {
	c0, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the process has used 200 ms more CPU (a busy machine
	// gives it the CPU later, not less of it), at most 20 s.
	var c1 time.Duration
	for start := time.Now(); time.Since(start) < 20*time.Second; {
		for spin := time.Now(); time.Since(spin) < 50*time.Millisecond; {
		}
		if c1, err = cpuTime(os.Getpid(), os.Getpid()); err != nil || c1-2*c0 >= 200*time.Millisecond {
			break
		}
	}
	if err != nil || c1-2*c0 < 200*time.Millisecond {
		t.Errorf("CPU time %v then %v counted twice (%v): want at least 200ms more", c0, c1, err)
	}
	if st, err := status(os.Getpid()); err != nil || st.VmRSS < 1<<20 || st.VmHWM < st.VmRSS {
		t.Errorf("status: RSS %d, peak %d (%v)", st.VmRSS, st.VmHWM, err)
	}
	if _, err := cpuTime(os.Getpid(), 1<<30); err == nil {
		t.Error("cpuTime: no error for a process that does not exist")
	}
}

func TestCPUsAllowedOfAMissingProcess(t *testing.T) {
	if _, err := cpusAllowed(1 << 30); err == nil {
		t.Error("no error for a process that does not exist")
	}
	if _, err := runqueueWait(1 << 30); err == nil {
		t.Error("runqueueWait: no error for a process that does not exist")
	}
}

// A process whose threads are kept from their CPU accumulates run-queue
// wait: two busy children pinned to the same CPU each wait about half
// the time.
func TestRunqueueWaitSeesContention(t *testing.T) {
	cpus, err := cpusAllowed(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var busy []*exec.Cmd
	for range 2 {
		busy = append(busy, startOn(t, int(cpus[0]), "sh", "-c", "while :; do :; done"))
	}
	w0, err := runqueueWait(busy[0].Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	w1, err := runqueueWait(busy[0].Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if d := w1 - w0; d < 100*time.Millisecond {
		t.Errorf("a busy process sharing its CPU with another waited %v of 500ms", d)
	}
}

func floorRun(cpu, p99 float64) *loadRun {
	return &loadRun{Result: loadresult.Result{RPS: 1000, Requests: 100, Latency: loadresult.Latency{P99: p99}}, ServerCPUUS: cpu}
}

// Ratios pair the same round of the server and the reference; a round
// without a CPU figure on either side is left out.
func TestFloorRatiosPairRounds(t *testing.T) {
	runs := map[string][]*loadRun{
		floorDefaultNoop:   {floorRun(40, 100), floorRun(50, 100), floorRun(60, 0)},
		floorNoop:          {floorRun(20, 100), floorRun(0, 100), floorRun(30, 100)},
		"allowed":          {floorRun(20, 50), floorRun(40, 200), floorRun(30, 100)},
		"denied":           {floorRun(40, 100), floorRun(50, 100), floorRun(66, 100)},
		"baseline-allowed": {floorRun(40, 100), floorRun(40, 100), floorRun(40, 100)},
		"lean-allowed":     {floorRun(10, 50), floorRun(20, 100), floorRun(30, 100)},
		"lean-allowed-top": {floorRun(11, 50), floorRun(20, 100), floorRun(33, 100)},
		floorCost:          {floorRun(12, 50), floorRun(24, 100), floorRun(30, 100)},
		floorCharges:       {floorRun(5, 50), floorRun(5, 100), floorRun(5, 100)},
	}
	got := map[string]FloorRatio{}
	for _, x := range floorRatios("saturation", 0, runs) {
		got[x.Workload+"/"+x.Versus] = x
	}
	a := got["allowed/"+floorDefaultNoop]
	if a.Median != 0.5 || a.Min != 0.5 || a.Max != 0.8 || len(a.PerRound) != 3 || a.PerRound[1] != 0.8 {
		t.Errorf("allowed vs default no-op: %+v", a)
	}
	if a.P99Ratio != 1.25 { // 0.5, 2 (the third round's reference has no p99)
		t.Errorf("p99 ratio %v, want 1.25", a.P99Ratio)
	}
	if n := got["allowed/"+floorNoop]; len(n.PerRound) != 2 || n.Median != 1 {
		t.Errorf("allowed vs noop (one round without a figure): %+v", n)
	}
	if b := got["allowed/baseline-allowed"]; b.Median != 0.75 {
		t.Errorf("allowed vs baseline: %+v", b)
	}
	if _, ok := got["denied/baseline-denied"]; ok {
		t.Error("a ratio against a baseline that did not run")
	}
	if d := got["denied/"+floorDefaultNoop]; d.Median != 1 || d.Max != 1.1 {
		t.Errorf("denied vs default no-op: %+v", d)
	}
	// The lean listener against the references and the gRPC port.
	if l := got["lean-allowed/allowed"]; l.Median != 0.5 || l.Max != 1 || l.Min != 0.5 {
		t.Errorf("lean-allowed vs allowed: %+v", l)
	}
	if l := got["lean-allowed/baseline-allowed"]; l.Median != 0.5 {
		t.Errorf("lean-allowed vs baseline-allowed: %+v", l)
	}
	if _, ok := got["allowed/allowed"]; ok {
		t.Error("the gRPC port compared with itself")
	}
	// The sketch on against off, and against nothing else.
	if l := got["lean-allowed-top/lean-allowed"]; l.Median != 1.1 || l.Min != 1 || l.Max != 1.1 {
		t.Errorf("lean-allowed-top vs lean-allowed: %+v", l)
	}
	if _, ok := got["lean-allowed-top/"+floorDefaultNoop]; ok {
		t.Error("the sketch on compared with a no-op")
	}
	// Peeking at cost buckets against counting, and nothing else; the
	// charges against nothing.
	if c := got[floorCost+"/lean-allowed"]; c.Median != 1.2 || c.Min != 1 || c.Max != 1.2 {
		t.Errorf("%s vs lean-allowed: %+v", floorCost, c)
	}
	for k := range got {
		if w, _, _ := strings.Cut(k, "/"); (w == floorCost && k != floorCost+"/lean-allowed") || w == floorCharges {
			t.Errorf("unexpected ratio %s", k)
		}
	}
	row := floorRow("saturation", 0, "allowed", runs["allowed"])
	if row.CPUUS != 30 || row.CPUMin != 20 || row.CPUMax != 40 || row.Latency.P99 != 100 || row.DeniedShare != 0 {
		t.Errorf("row %+v", row)
	}
}

func floorResults(allowedSat, deniedSat, allowedLow, deniedLow, p99 float64) *Results {
	f := &Floor{Baseline: &FloorBaseline{Ref: "main", Commit: "0123456789abcdef"}}
	f.Ratios = []FloorRatio{
		{Level: "saturation", Workload: "allowed", Versus: floorDefaultNoop, Median: allowedSat},
		{Level: "saturation", Workload: "denied", Versus: floorDefaultNoop, Median: deniedSat},
		{Level: "10%", Workload: "allowed", Versus: "baseline-allowed", Median: allowedLow},
		{Level: "10%", Workload: "denied", Versus: "baseline-denied", Median: deniedLow},
	}
	f.Rows = []FloorRow{
		{Level: "40%", Target: "allowed", Rate: 4000, Latency: Lat{P99: p99}},
		{Level: "40%", Target: "denied", Rate: 4000, Latency: Lat{P99: 300}},
		{Level: "40%", Target: floorDefaultNoop, Rate: 4000, Latency: Lat{P99: 400}},
	}
	return &Results{Floor: f, Memory: &Memory{Keys: 1_000_000, BytesPerKeyRSS: 140, Loaded: MemPoint{LiveKeys: 1_000_000}}}
}

func floorTargetsByName(res *Results) map[string]Target {
	got := map[string]Target{}
	for _, tg := range targets(res) {
		got[tg.Name] = tg
	}
	return got
}

func TestFloorTargets(t *testing.T) {
	met := floorTargetsByName(floorResults(0.6, 0.7, 0.5, 0.6, 350))
	for _, name := range []string{"floor-cpu", "floor-low-rate", "floor-p99", "memory"} {
		if tg := met[name]; tg.Met == nil || !*tg.Met {
			t.Errorf("%s: %+v, want met", name, tg)
		}
	}
	// The worse of allowed and denied decides.
	missed := floorTargetsByName(floorResults(0.6, 0.71, 0.5, 0.61, 401))
	for _, name := range []string{"floor-cpu", "floor-low-rate", "floor-p99"} {
		if tg := missed[name]; tg.Met == nil || *tg.Met || tg.Margin == "" {
			t.Errorf("%s: %+v, want missed with a margin", name, tg)
		}
	}
	if v := missed["floor-cpu"].Value; v != 0.71 {
		t.Errorf("floor-cpu value %v, want the worse 0.71", v)
	}
	res := floorResults(0.6, 0.7, 0.5, 0.6, 350)
	res.Memory.Keys, res.Memory.BytesPerKeyRSS = 100_000, 150
	res.Floor.Ratios = res.Floor.Ratios[:2]
	res.Floor.Baseline.Error = "git rev-parse main: exit status 128"
	got := floorTargetsByName(res)
	if tg := got["memory"]; tg.Met != nil || !strings.Contains(tg.Measured, "fewer than 1 M keys") {
		t.Errorf("rss at 100k keys: %+v, want not judged", tg)
	}
	if tg := got["floor-low-rate"]; tg.Met != nil || !strings.Contains(tg.Measured, "no baseline: git rev-parse") {
		t.Errorf("low rate without a baseline: %+v", tg)
	}
	for _, tg := range targets(&Results{}) {
		if strings.HasPrefix(tg.Name, "floor") && tg.Met != nil {
			t.Errorf("%s judged without figures", tg.Name)
		}
	}
}

func TestFloorReportRenders(t *testing.T) {
	out := t.TempDir()
	res := floorResults(0.9, 0.95, 0.5, 0.6, 350)
	res.StartedAt, res.FinishedAt = time.Unix(0, 0), time.Unix(60, 0)
	res.Floor.Pinning = "servers on CPU 0, load tool on CPU 1"
	res.Floor.SaturationRPS = 20000
	res.Floor.Rows = append(res.Floor.Rows, FloorRow{Level: "saturation", Target: floorDefaultNoop, RPS: 20000, CPUUS: 36.2, CPUMin: 35, CPUMax: 37, WaitShare: 0.025},
		FloorRow{Level: "saturation", Target: floorNoop, CPUUS: 30}, FloorRow{Level: "saturation", Target: "allowed", CPUUS: 32.6},
		FloorRow{Level: "saturation", Target: "lean-denied", CPUUS: 20}, FloorRow{Level: "saturation", Target: "lean-denied-top", CPUUS: 20.4},
		FloorRow{Level: "saturation", Target: floorCharges, RPS: 41000, CPUUS: 8.5, CPUMin: 8, CPUMax: 9},
		FloorRow{Level: "saturation", Target: "lean-allowed", CPUUS: 12}, FloorRow{Level: "saturation", Target: floorCost, CPUUS: 12.6})
	res.Floor.Ratios[0].PerRound = []float64{0.9, 0.91}
	res.Floor.Ratios = append(res.Floor.Ratios, FloorRatio{Level: "saturation", Workload: "lean-denied-top", Versus: "lean-denied", Median: 1.02, Min: 0.99, Max: 1.05})
	res.Floor.Ratios = append(res.Floor.Ratios, FloorRatio{Level: "saturation", Workload: floorCost, Versus: "lean-allowed", Median: 1.05, Min: 1.01, Max: 1.09})
	r := &runner{out: out, res: res}
	r.res.Targets = targets(r.res)
	if err := r.writeReport(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(out, "REPORT.md"))
	for _, want := range []string{"## Floor: CPU per check against a default grpc-go no-op", "servers on CPU 0, load tool on CPU 1",
		"built in this run from `0123456789abcdef`", "| saturation | default-noop | 20000 | 36.2 (35.0–37.0) |", "| 0.0 | 2.5% | 0 |",
		"| saturation | allowed | default-noop | **0.900** (0.000–0.000) | 0.9 0.91 |",
		"**missed**: 0.95× against 0.70×",
		"lean Check listener at saturation, CPU per check: denied 20.40 µs on, 20.00 µs off: **1.020×** (rounds 0.990–1.050).",
		"**41000 charges/s**, **8.5 µs of server CPU per charge** (8.0–9.0)", "12.6 µs per check peeking at cost buckets, 12.0 µs counting, **1.050×** (rounds 1.010–1.090)"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
}

// A baseline ref that is not a commit, or that looks like an option, is a
// clear error before anything is built.
func TestBuildBaselineRejectsBadRefs(t *testing.T) {
	dir := t.TempDir()
	r := &runner{root: root(t), tmp: dir, logDir: dir}
	for _, ref := range []string{"no-such-ref-anywhere", "--output=" + filepath.Join(dir, "x"), ""} {
		b, err := r.buildBaseline(t.Context(), ref)
		if err == nil || !strings.Contains(err.Error(), "git rev-parse") {
			t.Errorf("ref %q: %v", ref, err)
		}
		if b == nil || b.Commit != "" || b.bin != "" {
			t.Errorf("ref %q: baseline %+v", ref, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Error("an option-like ref wrote a file")
	}
}

// TestFloorLeanTargets: the lean listener's rows are judged by targets of
// their own, beside the gRPC port's.
func TestFloorLeanTargets(t *testing.T) {
	res := floorResults(0.9, 0.95, 0.8, 0.85, 500) // the gRPC port misses
	f := res.Floor
	f.Ratios = append(f.Ratios,
		FloorRatio{Level: "saturation", Workload: floorLean + "allowed", Versus: floorDefaultNoop, Median: 0.4},
		FloorRatio{Level: "saturation", Workload: floorLean + "denied", Versus: floorDefaultNoop, Median: 0.45},
		FloorRatio{Level: "10%", Workload: floorLean + "allowed", Versus: "baseline-allowed", Median: 0.5},
		FloorRatio{Level: "10%", Workload: floorLean + "denied", Versus: "baseline-denied", Median: 0.55})
	f.Rows = append(f.Rows,
		FloorRow{Level: "40%", Target: floorLean + "allowed", Rate: 4000, Latency: Lat{P99: 350}},
		FloorRow{Level: "40%", Target: floorLean + "denied", Rate: 4000, Latency: Lat{P99: 390}})
	got := floorTargetsByName(res)
	for _, name := range []string{"floor-cpu", "floor-low-rate", "floor-p99"} {
		if tg := got[name]; tg.Met == nil || *tg.Met {
			t.Errorf("%s: %+v, want missed", name, tg)
		}
		if tg := got[name+"-lean"]; tg.Met == nil || !*tg.Met || !strings.Contains(tg.Goal, "--check-addr") {
			t.Errorf("%s-lean: %+v, want met, naming the listener", name, tg)
		}
	}
	if v := got["floor-cpu-lean"].Value; v != 0.45 {
		t.Errorf("floor-cpu-lean value %v, want the worse 0.45", v)
	}
}
