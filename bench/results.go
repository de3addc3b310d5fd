package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// resultsSchema is the version of results.json's layout: a change to
// what a field means or where it is takes a new one.
const resultsSchema = 2

// Results is bench/results/results.json: every figure of a run, which
// REPORT.md and scripts/plot.py are made from. Latencies are in µs.
type Results struct {
	Schema     int         `json:"schema"`
	StartedAt  time.Time   `json:"started_at"`
	FinishedAt time.Time   `json:"finished_at"`
	Env        Env         `json:"env"`
	Targets    []Target    `json:"targets"`
	Micro      *Micro      `json:"micro,omitempty"`
	Floor      *Floor      `json:"floor,omitempty"`
	Memory     *Memory     `json:"memory,omitempty"`
	Accuracy   *Accuracy   `json:"accuracy,omitempty"`
	Envoy      *EnvoyE2E   `json:"envoy,omitempty"`
	Scale      *Scale      `json:"scale,omitempty"`
	Notes      []string    `json:"notes,omitempty"`
	Timings    []StepTime  `json:"timings"`
	Plots      []string    `json:"plots,omitempty"`
	PlotError  string      `json:"plot_error,omitempty"`
	Errors     []StepError `json:"errors,omitempty"`
}

// Env describes the machine and the versions measured.
type Env struct {
	CPU          string     `json:"cpu"`
	Cores        int        `json:"cores"`
	GoVersion    string     `json:"go_version"`
	Git          string     `json:"git"`
	EnvoyVersion string     `json:"envoy_version,omitempty"`
	NATSVersion  string     `json:"nats_version,omitempty"`
	LoadBefore   [3]float64 `json:"load_before"`
	LoadAfter    [3]float64 `json:"load_after"`
	Quick        bool       `json:"quick"`
	ServerArgs   []string   `json:"server_args,omitempty"` // --server-args
}

// StepTime is how long a step took and the machine's load average as it
// ended (1 minute).
type StepTime struct {
	Step    string  `json:"step"`
	Seconds float64 `json:"seconds"`
	Load1   float64 `json:"load1"`
}

// StepError is a scenario that failed; the others still ran.
type StepError struct {
	Step  string `json:"step"`
	Error string `json:"error"`
}

// Target is one goal the report judges a run by, reported against, not
// asserted.
type Target struct {
	Name     string  `json:"name"`
	Goal     string  `json:"goal"`
	Measured string  `json:"measured"`
	Met      *bool   `json:"met"` // nil: not measured
	Margin   string  `json:"margin,omitempty"`
	Value    float64 `json:"value"`
}

// judge sets the verdict: met, or missed by the margin format and args
// say.
func (t *Target) judge(met bool, margin string, args ...any) {
	t.Met = &met
	if !met {
		t.Margin = fmt.Sprintf(margin, args...)
	}
}

// Micro is the Go microbenchmarks.
type Micro struct {
	Command   string `json:"command"`
	Benchstat string `json:"benchstat"`
	Compared  bool   `json:"compared_with_previous"`
	Error     string `json:"error,omitempty"`
}

// Plan is how a scenario's load runs were made: rounds of runs of RunS
// after WarmupS, Concurrency in flight over Conns gRPC connections.
type Plan struct {
	Rounds      int     `json:"rounds"`
	RunS        float64 `json:"run_s"`
	WarmupS     float64 `json:"warmup_s,omitempty"`
	Conns       int     `json:"connections,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
}

// plan is the Plan of a scenario run with the options' rounds, run and
// warm-up.
func (o options) plan(conns, concurrency int) Plan {
	return Plan{o.rounds, o.run.Seconds(), o.warmup.Seconds(), conns, concurrency}
}

// Lat is a latency summary in µs.
type Lat struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Mean float64 `json:"mean"`
}

// CDFSeries is a latency distribution to plot: [quantile, µs] points.
type CDFSeries struct {
	Group  string       `json:"group"` // e.g. "grpc c=64"
	Label  string       `json:"label"`
	Points [][2]float64 `json:"points"`
}

// Memory is the memory scenario.
type Memory struct {
	Keys            int64       `json:"keys"`
	Checks          int64       `json:"checks"`
	Buckets         int         `json:"buckets_per_check"`
	WindowS         int         `json:"window_s"`
	SweepS          float64     `json:"sweep_interval_s"`
	MaxKeysConfig   int         `json:"max_keys_config"`
	LoadS           float64     `json:"load_s"`
	LoadRPS         float64     `json:"load_rps"`
	Errors          int64       `json:"errors"`
	Baseline        MemPoint    `json:"baseline"`
	Loaded          MemPoint    `json:"loaded"`
	Expired         MemPoint    `json:"expired"`
	BytesPerKeyRSS  float64     `json:"bytes_per_key_rss"`
	BytesPerKeyHeap float64     `json:"bytes_per_key_live_heap"`
	Refused         float64     `json:"keys_refused"`
	Series          []MemSample `json:"series"`
	Events          []MemEvent  `json:"events"`
	Note            string      `json:"note,omitempty"`
}

// MemPoint is the server's memory at one moment.
type MemPoint struct {
	RSS      int64   `json:"rss_bytes"`
	HWM      int64   `json:"rss_peak_bytes"`
	LiveKeys float64 `json:"live_keys"`
	// LiveHeap is the heap marked live by the first GC after this moment
	// (GODEBUG=gctrace=1), in bytes; 0 when no GC was seen.
	LiveHeap int64   `json:"live_heap_bytes"`
	HeapGoal int64   `json:"heap_goal_bytes"`
	AtS      float64 `json:"at_s"`
}

// MemSample is one sample of the memory time series.
type MemSample struct {
	T        float64 `json:"t_s"`
	RSS      int64   `json:"rss_bytes"`
	LiveKeys float64 `json:"live_keys"`
}

// MemEvent marks a moment of the memory run on the plot.
type MemEvent struct {
	T     float64 `json:"t_s"`
	Label string  `json:"label"`
}

// pooled is what a target's runs come to: the median of each figure, the
// range of the server's CPU per request, and the denied share and errors
// over all of them.
type pooled struct {
	rps, cpu, client, wait float64
	cpuMin, cpuMax         float64
	lat                    Lat
	denied                 float64
	errors                 int64
}

func pool(runs []*loadRun) pooled {
	var p pooled
	var rps, cpu, client, wait []float64
	var lat []Lat
	var requests, denied int64
	for _, r := range runs {
		rps, cpu, client = append(rps, r.RPS), append(cpu, r.ServerCPUUS), append(client, r.ClientCPUUS())
		wait, lat = append(wait, r.ServerWaitShare), append(lat, latOf(r))
		requests, denied, p.errors = requests+r.Requests, denied+r.Denied, p.errors+r.Errors
	}
	p.rps, p.cpu, p.client, p.wait = median(rps), median(cpu), median(client), median(wait)
	p.cpuMin, p.cpuMax = minMax(cpu)
	p.lat = medianLat(lat)
	if requests > 0 {
		p.denied = float64(denied) / float64(requests)
	}
	return p
}

func latOf(r *loadRun) Lat {
	return Lat{P50: r.Latency.P50, P90: r.Latency.P90, P99: r.Latency.P99, P999: r.Latency.P999, Mean: r.Latency.Mean}
}

// median returns the median of xs (the mean of the middle two for an even
// count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// medianLat is the point-wise median of latency summaries.
func medianLat(ls []Lat) Lat {
	pick := func(f func(Lat) float64) float64 {
		xs := make([]float64, len(ls))
		for i, l := range ls {
			xs[i] = f(l)
		}
		return median(xs)
	}
	return Lat{
		P50: pick(func(l Lat) float64 { return l.P50 }), P90: pick(func(l Lat) float64 { return l.P90 }),
		P99: pick(func(l Lat) float64 { return l.P99 }), P999: pick(func(l Lat) float64 { return l.P999 }),
		Mean: pick(func(l Lat) float64 { return l.Mean }),
	}
}

func minMax(xs []float64) (lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	return slices.Min(xs), slices.Max(xs)
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}
