package main

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

// Results is bench/results/results.json: every figure of a run, which
// REPORT.md and scripts/plot.py are made from. Latencies are in µs.
type Results struct {
	Schema      int          `json:"schema"`
	StartedAt   time.Time    `json:"started_at"`
	FinishedAt  time.Time    `json:"finished_at"`
	Env         Env          `json:"env"`
	Targets     []Target     `json:"targets"`
	Micro       *Micro       `json:"micro,omitempty"`
	Single      *Single      `json:"single,omitempty"`
	Floor       *Floor       `json:"floor,omitempty"`
	Profile     *Profile     `json:"profile,omitempty"`
	Memory      *Memory      `json:"memory,omitempty"`
	Cluster     *Cluster     `json:"cluster,omitempty"`
	Accuracy    *Accuracy    `json:"accuracy,omitempty"`
	ClusterLoad *ClusterLoad `json:"cluster_load,omitempty"`
	Envoy       *EnvoyE2E    `json:"envoy,omitempty"`
	RLS         *RLS         `json:"rls,omitempty"`
	RLQS        *RLQSBench   `json:"rlqs,omitempty"`
	Scale       *Scale       `json:"scale,omitempty"`
	Notes       []string     `json:"notes,omitempty"`
	Timings     []StepTime   `json:"timings"`
	Plots       []string     `json:"plots,omitempty"`
	PlotError   string       `json:"plot_error,omitempty"`
	Errors      []StepError  `json:"errors,omitempty"`
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

// Single is scenario 1: one node against the no-op floor.
type Single struct {
	Plan
	Rows      []SingleRow `json:"rows"`
	FixedRate []SingleRow `json:"fixed_rate,omitempty"`
	CDFs      []CDFSeries `json:"cdfs"`
	Runs      []SingleRun `json:"runs"`
	Workloads []string    `json:"workloads"`
}

// SingleRow is one concurrency and workload: medians over the rounds.
type SingleRow struct {
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

// Floor is the floor scenario: CPU per check, pinned, against a
// default-configured grpc-go no-op, the no-op on this tree's stack and the
// baseline server, at saturation and at fixed rates.
type Floor struct {
	Plan
	ServerCPU int    `json:"server_cpu"`
	LoadCPU   int    `json:"load_cpu"`
	Pinning   string `json:"pinning"`
	// SaturationRPS is the default no-op's median saturated throughput,
	// which the fixed rates are shares of.
	SaturationRPS float64        `json:"default_noop_saturation_rps"`
	Baseline      *FloorBaseline `json:"baseline,omitempty"`
	Rows          []FloorRow     `json:"rows"`
	Ratios        []FloorRatio   `json:"ratios"`
	Profiles      []FloorProfile `json:"profiles,omitempty"`
	Runs          []SingleRun    `json:"runs"`
}

// FloorBaseline is the commit the baseline server was built from.
type FloorBaseline struct {
	Ref    string  `json:"ref"`
	Commit string  `json:"commit"`
	BuildS float64 `json:"build_s"`
	Error  string  `json:"error,omitempty"`
}

// FloorRow is one target at one level (saturation or a fixed rate):
// medians over the rounds.
type FloorRow struct {
	Level       string  `json:"level"` // saturation, 10%, 40%
	Rate        float64 `json:"rate,omitempty"`
	Target      string  `json:"target"`
	RPS         float64 `json:"rps"`
	CPUUS       float64 `json:"cpu_us_per_check"`
	CPUMin      float64 `json:"cpu_us_per_check_min"`
	CPUMax      float64 `json:"cpu_us_per_check_max"`
	ClientCPUUS float64 `json:"client_cpu_us_per_check"`
	// WaitShare is the time the server's threads waited for a CPU, as a
	// share of the run: other work on its CPU.
	WaitShare   float64 `json:"runqueue_wait_share"`
	Latency     Lat     `json:"latency_us"`
	DeniedShare float64 `json:"denied_share"`
	Errors      int64   `json:"errors"`
}

// FloorRatio is the server's CPU per check over a reference's at one
// level, paired per round.
type FloorRatio struct {
	Level    string    `json:"level"`
	Rate     float64   `json:"rate,omitempty"`
	Workload string    `json:"workload"` // allowed, denied
	Versus   string    `json:"versus"`   // default-noop, noop, baseline-allowed, baseline-denied
	PerRound []float64 `json:"per_round"`
	Median   float64   `json:"median"`
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	// P99Ratio is the median of the per-round p99 ratios.
	P99Ratio float64 `json:"p99_ratio"`
}

// FloorProfile is pprof -top of one target's CPU profile at one level:
// saturation, or a fixed rate (Rate > 0).
type FloorProfile struct {
	Target  string  `json:"target"`
	Level   string  `json:"level,omitempty"` // empty: saturation
	Rate    float64 `json:"rate,omitempty"`
	Seconds float64 `json:"seconds"`
	RPS     float64 `json:"rps"`
	File    string  `json:"file"`
	Top     string  `json:"top"`
	// Shares are the profile parts' cumulative time per check, at the
	// rate the load achieved.
	Shares []ProfileShare `json:"shares"`
}

// title names the profile by its target and level.
func (p FloorProfile) title() string {
	return p.Target + " at " + cmp.Or(p.Level, "saturation")
}

// RLS is the ShouldRateLimit scenario: the server against the no-op rate
// limit service, then the memory of descriptor keys.
type RLS struct {
	Plan
	Rows   []RLSRow   `json:"rows"`
	Memory *RLSMemory `json:"memory,omitempty"`
}

// RLSRow is one workload against the no-op: medians over the rounds.
type RLSRow struct {
	SingleRow
	Descriptors int     `json:"descriptors"`
	Denied      bool    `json:"denied"`
	CPURatio    float64 `json:"cpu_ratio"`
}

// RLSMemory is the memory of descriptor-style keys.
type RLSMemory struct {
	Keys            int64    `json:"keys"`
	MaxKeysConfig   int      `json:"max_keys_config"`
	LoadS           float64  `json:"load_s"`
	LoadRPS         float64  `json:"load_rps"`
	Errors          int64    `json:"errors"`
	Baseline        MemPoint `json:"baseline"`
	Loaded          MemPoint `json:"loaded"`
	BytesPerKeyRSS  float64  `json:"bytes_per_key_rss"`
	BytesPerKeyHeap float64  `json:"bytes_per_key_heap"`
	Note            string   `json:"note,omitempty"`
}

// Lat is a latency summary in µs.
type Lat struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Mean float64 `json:"mean"`
}

// SingleRun is one measured run (for the record).
type SingleRun struct {
	Round       int     `json:"round"`
	Concurrency int     `json:"concurrency"`
	Target      string  `json:"target"` // noop, allowed, denied
	Rate        float64 `json:"rate,omitempty"`
	RPS         float64 `json:"rps"`
	Allowed     int64   `json:"allowed"`
	Denied      int64   `json:"denied"`
	Errors      int64   `json:"errors"`
	Latency     Lat     `json:"latency_us"`
	ServerCPUUS float64 `json:"server_cpu_us_per_check"`
	ClientCPUUS float64 `json:"client_cpu_us_per_check"`
}

// CDFSeries is a latency distribution to plot: [quantile, µs] points.
type CDFSeries struct {
	Group  string       `json:"group"` // e.g. "grpc c=64"
	Label  string       `json:"label"`
	Points [][2]float64 `json:"points"`
}

// Profile summarises CPU profiles of the server and of the no-op server
// at the same fixed rate.
type Profile struct {
	Source      string         `json:"source"` // where the server's profile came from
	Seconds     float64        `json:"seconds"`
	Rate        float64        `json:"rate"`
	LoadRPS     float64        `json:"load_rps"`
	Top         string         `json:"top"`         // go tool pprof -top of the server
	DiffTop     string         `json:"diff_top"`    // go tool pprof -top -diff_base noop server
	Shares      []ProfileShare `json:"shares"`      // cumulative shares of chosen parts, server
	NoopShares  []ProfileShare `json:"noop_shares"` // the same parts in the no-op's profile
	ServerCPUUS float64        `json:"server_cpu_us_per_check"`
	NoopCPUUS   float64        `json:"noop_cpu_us_per_check"`
	File        string         `json:"file"`
	NoopFile    string         `json:"noop_file"`
	Error       string         `json:"error,omitempty"`
}

// ProfileShare is the cumulative share of the CPU samples in a part of
// the program.
type ProfileShare struct {
	Part       string  `json:"part"`
	Share      float64 `json:"share"` // 0…1
	PerCheckUS float64 `json:"us_per_check"`
}

// Memory is scenario 2.
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

// Cluster is scenario 3.
type Cluster struct {
	Skipped      string       `json:"skipped,omitempty"`
	Nodes        int          `json:"nodes"`
	Limit        int          `json:"limit"`
	WindowMS     int64        `json:"window_ms"`
	SyncInterval string       `json:"sync_interval"`
	Rows         []ClusterRow `json:"rows"`
}

// ClusterRow is one algorithm at one offered load.
type ClusterRow struct {
	Algorithm   string  `json:"algorithm"`
	Multiple    int     `json:"multiple"` // offered load / limit
	OfferedRPS  float64 `json:"offered_rps"`
	AchievedRPS float64 `json:"achieved_rps"`
	Windows     int     `json:"windows"`
	Min         int64   `json:"min"`
	Median      float64 `json:"median"`
	Max         int64   `json:"max"`
	MaxInSpan   int     `json:"max_in_any_span"`
	Errors      int64   `json:"errors"`
	Admitted    []int64 `json:"admitted"` // per window, in order
	StartMS     []int64 `json:"start_ms"`
}

// Accuracy is the accuracy scenario: bench/accuracy's output for this
// tree and for the baseline commit, measured in the same run.
type Accuracy struct {
	Skipped string `json:"skipped,omitempty"`
	// After is this tree's run; Before the baseline's (nil: not measured,
	// Baseline.Error says why when it was asked for).
	After    *loadresult.Accuracy `json:"after,omitempty"`
	Before   *loadresult.Accuracy `json:"before,omitempty"`
	Baseline *FloorBaseline       `json:"baseline,omitempty"`
}

// ClusterLoad is scenario 5: a cluster under steady load through a NATS
// outage.
type ClusterLoad struct {
	Skipped      string  `json:"skipped,omitempty"`
	Nodes        int     `json:"nodes"`
	Limit        int     `json:"limit"` // per 1 s window and tenant
	RatePerNode  float64 `json:"rate_per_node"`
	SyncInterval string  `json:"sync_interval"`
	UpS          float64 `json:"up_s"` // planned phases
	DownS        float64 `json:"down_s"`
	BackS        float64 `json:"back_s"`
	// When NATS was stopped and started again (s after the load started),
	// and how long after each every node reported itself disconnected,
	// then connected (ratelimit_authz_replicate_connected).
	StopAtS       float64 `json:"nats_stopped_at_s"`
	DisconnectedS float64 `json:"all_disconnected_after_s"`
	RestartAtS    float64 `json:"nats_restarted_at_s"`
	ReconnectedS  float64 `json:"all_reconnected_after_s"`
	// BatchesPerS is each node's batches published per second with NATS
	// up (ratelimit_authz_replicate_batches_sent_total).
	BatchesPerS []float64           `json:"batches_per_s_nats_up"`
	Errors      int64               `json:"errors"`
	Phases      []ClusterLoadPhase  `json:"phases"`
	Windows     []ClusterLoadWindow `json:"windows"`
}

// ClusterLoadWindow is one 1 s window of the cluster-load scenario.
type ClusterLoadWindow struct {
	StartMS int64   `json:"start_ms"`
	Phase   string  `json:"phase"` // partial, up, down, transition, back
	PerNode []int64 `json:"admitted_per_node"`
	Total   int64   `json:"admitted"`
}

// ClusterLoadPhase sums up the windows of one phase (NATS up, down, back)
// against what the cluster promises in it (reported, not asserted).
type ClusterLoadPhase struct {
	Phase      string  `json:"phase"`
	Windows    int     `json:"windows"`
	Min        int64   `json:"min"`
	Median     float64 `json:"median"`
	P90        int64   `json:"p90"`
	Max        int64   `json:"max"`
	MaxPerNode int64   `json:"max_per_node"`
	Expected   string  `json:"expected"`
	Met        *bool   `json:"met"` // nil: no window in the phase
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
