// Package loadresult is the result of one run of the load tool
// (`ratelimit-bench check|rls|http --json FILE`, and `ratelimit-bench rlqs`'s,
// [RLQS]): the one declaration of the files it
// writes and the bench runner (bench/, `make bench`) reads, so that the
// sides cannot drift apart. Every latency is in microseconds.
//
// The runner and the tool are separate processes on purpose: the load's
// CPU is measured apart from the server's, and a load that fails ends
// only its own run. This file is the contract between them.
package loadresult

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Tool is the value of Result.Tool.
const Tool = "ratelimit-bench"

// Result is the machine-readable summary of a run. Latencies are in
// microseconds.
type Result struct {
	Tool        string           `json:"tool"`
	Mode        string           `json:"mode"` // "check" (ext_authz, gRPC), "rls" (ShouldRateLimit, gRPC) or "http"
	Targets     []string         `json:"targets"`
	Concurrency int              `json:"concurrency"`
	Connections int              `json:"connections,omitempty"`
	Rate        float64          `json:"rate"` // requested; 0 = closed loop
	Mix         string           `json:"mix"`
	Keys        string           `json:"keys"`
	StartedAt   time.Time        `json:"started_at"`
	WarmupS     float64          `json:"warmup_s"`
	DurationS   float64          `json:"duration_s"`   // planned
	ElapsedS    float64          `json:"elapsed_s"`    // measured
	Requests    int64            `json:"requests"`     // answered or failed in the measured time
	Sent        int64            `json:"sent"`         // warm-up included
	ClientCPUS  float64          `json:"client_cpu_s"` // the tool's own CPU time over all it sent
	RPS         float64          `json:"rps"`
	Allowed     int64            `json:"allowed"`
	Denied      int64            `json:"denied"`
	Errors      int64            `json:"errors"`
	Late        int64            `json:"late,omitempty"` // fixed rate: requests > 1 ms overdue when a worker came free
	Codes       map[string]int64 `json:"codes"`          // gRPC code or HTTP status → count ("-1": no answer)
	ErrorKinds  map[string]int64 `json:"error_kinds,omitempty"`
	Latency     Latency          `json:"latency_us"`
	CDF         [][2]float64     `json:"cdf"` // [quantile, latency µs]
}

// Latency are the usual points of a run's latency distribution, in
// microseconds.
type Latency struct {
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
	Count uint64  `json:"count"`
}

// ClientCPUUS is the tool's CPU time per request it sent (µs); 0 when it
// sent none.
func (r *Result) ClientCPUUS() float64 {
	if r.Sent == 0 {
		return 0
	}
	return r.ClientCPUS / float64(r.Sent) * 1e6
}

// DeniedShare is the share of the measured requests that were denied.
func (r *Result) DeniedShare() float64 {
	if r.Requests == 0 {
		return 0
	}
	return float64(r.Denied) / float64(r.Requests)
}

// ReadFile reads a result the tool wrote with --json.
func ReadFile(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loadresult: %w", err)
	}
	r, err := Unmarshal(b)
	if err != nil {
		return nil, fmt.Errorf("loadresult: read %s: %w", path, err)
	}
	return r, nil
}

// Unmarshal decodes a result; one that another tool wrote is an error.
func Unmarshal(b []byte) (*Result, error) {
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Tool != Tool {
		return nil, fmt.Errorf("tool %q, want %q", r.Tool, Tool)
	}
	return &r, nil
}

// Marshal is r as the tool writes it: indented JSON and a newline.
func (r *Result) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("loadresult: %w", err)
	}
	return append(b, '\n'), nil
}

// Micros formats a latency given in µs with a unit that suits it:
// "850µs", "1.25ms", "2.00s".
func Micros(us float64) string {
	switch {
	case us < 1000:
		return strconv.FormatFloat(us, 'f', 0, 64) + "µs"
	case us < 1e6:
		return strconv.FormatFloat(us/1e3, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(us/1e6, 'f', 2, 64) + "s"
}
