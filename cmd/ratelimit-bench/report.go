package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Result is the machine-readable summary of a run (--json). Latencies are
// in microseconds.
type Result struct {
	Tool        string            `json:"tool"`
	Mode        string            `json:"mode"` // "check" (gRPC) or "http"
	Targets     []string          `json:"targets"`
	Concurrency int               `json:"concurrency"`
	Connections int               `json:"connections,omitempty"`
	Rate        float64           `json:"rate"` // requested; 0 = closed loop
	Mix         string            `json:"mix"`
	Keys        string            `json:"keys"`
	StartedAt   time.Time         `json:"started_at"`
	WarmupS     float64           `json:"warmup_s"`
	DurationS   float64           `json:"duration_s"`   // planned
	ElapsedS    float64           `json:"elapsed_s"`    // measured
	Requests    int64             `json:"requests"`     // answered or failed in the measured time
	Sent        int64             `json:"sent"`         // warm-up included
	ClientCPUS  float64           `json:"client_cpu_s"` // the tool's own CPU time over all it sent
	RPS         float64           `json:"rps"`
	Allowed     int64             `json:"allowed"`
	Denied      int64             `json:"denied"`
	Errors      int64             `json:"errors"`
	Late        int64             `json:"late,omitempty"` // fixed rate: requests > 1 ms overdue when a worker came free
	Codes       map[string]int64  `json:"codes"`          // gRPC code or HTTP status → count ("-1": no answer)
	ErrorKinds  map[string]int64  `json:"error_kinds,omitempty"`
	Latency     LatencySummary    `json:"latency_us"`
	CDF         [][2]float64      `json:"cdf"` // [quantile, latency µs]
	WindowMS    int64             `json:"window_ms,omitempty"`
	Windows     []WindowResult    `json:"windows,omitempty"`
	MaxInSpan   int               `json:"max_admitted_in_any_window,omitempty"` // busiest span of one window length
	Extra       map[string]string `json:"extra,omitempty"`
}

// LatencySummary are the usual points, in microseconds.
type LatencySummary struct {
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
	Count uint64  `json:"count"`
}

// WindowResult is one wall-clock window: its start (unix ms) and what was
// admitted and denied in it, each request put in the window of the
// midpoint of its call.
type WindowResult struct {
	StartMS int64 `json:"start_ms"`
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func summarise(r *runRecord, cfg loadConfig) Result {
	h := &r.hist
	res := Result{
		Tool:        "ratelimit-bench",
		Concurrency: cfg.concurrency,
		Rate:        cfg.rate,
		Mix:         cfg.mix.String(),
		Keys:        cfg.keys.String(),
		StartedAt:   r.measureFrom.Add(-cfg.warmup).UTC(),
		WarmupS:     cfg.warmup.Seconds(),
		DurationS:   cfg.duration.Seconds(),
		ElapsedS:    r.elapsed().Seconds(),
		Requests:    r.classes[classAllowed] + r.classes[classDenied] + r.classes[classError],
		Sent:        r.sent,
		ClientCPUS:  r.cpu.Seconds(),
		Allowed:     r.classes[classAllowed],
		Denied:      r.classes[classDenied],
		Errors:      r.classes[classError],
		Late:        r.late,
		Codes:       map[string]int64{},
		Latency: LatencySummary{
			Min: us(h.quantile(0)), Mean: us(h.mean()),
			P50: us(h.quantile(0.50)), P90: us(h.quantile(0.90)), P99: us(h.quantile(0.99)), P999: us(h.quantile(0.999)),
			Max: us(h.quantile(1)), Count: h.n,
		},
	}
	if res.ElapsedS > 0 {
		res.RPS = float64(res.Requests) / res.ElapsedS
	}
	for code, n := range r.codes {
		res.Codes[strconv.Itoa(code)] = n
	}
	if len(r.errKinds) > 0 {
		res.ErrorKinds = maps.Clone(r.errKinds)
	}
	if h.n > 0 {
		for _, q := range cdfQuantiles {
			res.CDF = append(res.CDF, [2]float64{q, us(h.quantile(q))})
		}
	}
	if cfg.window > 0 {
		res.WindowMS = cfg.window.Milliseconds()
		for _, w := range r.sortedWindows() {
			c := r.windows[w]
			res.Windows = append(res.Windows, WindowResult{StartMS: w * cfg.window.Milliseconds(), Allowed: c.allowed, Denied: c.denied})
		}
		res.MaxInSpan = maxInSpan(r.admitted, cfg.window)
	}
	return res
}

// fmtDur prints a latency in µs with sensible units.
func fmtDur(usec float64) string {
	switch {
	case usec < 1000:
		return strconv.FormatFloat(usec, 'f', 0, 64) + "µs"
	case usec < 1e6:
		return strconv.FormatFloat(usec/1e3, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(usec/1e6, 'f', 2, 64) + "s"
}

// printText writes the human summary.
func printText(w io.Writer, r Result) {
	load := "closed loop (as fast as answers come)"
	if r.Rate > 0 {
		load = fmt.Sprintf("fixed rate %.0f/s", r.Rate)
	}
	conns := ""
	if r.Connections > 0 {
		conns = fmt.Sprintf("  connections %d", r.Connections)
	}
	fmt.Fprintf(w, "%s %s  concurrency %d%s  %s\n", r.Mode, strings.Join(r.Targets, ","), r.Concurrency, conns, load)
	fmt.Fprintf(w, "mix %s\nkeys %s\n", r.Mix, r.Keys)
	fmt.Fprintf(w, "requests  %d in %.2fs (warm-up %.1fs not counted): %.0f req/s\n", r.Requests, r.ElapsedS, r.WarmupS, r.RPS)
	if r.Sent > 0 && r.ClientCPUS > 0 {
		fmt.Fprintf(w, "client    %.1fµs of this tool's CPU per request\n", r.ClientCPUS/float64(r.Sent)*1e6)
	}
	fmt.Fprintf(w, "outcome   allowed %d  denied %d  errors %d", r.Allowed, r.Denied, r.Errors)
	if r.Requests > 0 {
		fmt.Fprintf(w, "  (%.1f%% denied)", 100*float64(r.Denied)/float64(r.Requests))
	}
	fmt.Fprintln(w)
	if r.Rate > 0 {
		fmt.Fprintf(w, "schedule  %d requests were over 1 ms overdue when a worker came free (their latency counts from when they were due)\n", r.Late)
	}
	l := r.Latency
	fmt.Fprintf(w, "latency   p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s)\n",
		fmtDur(l.P50), fmtDur(l.P90), fmtDur(l.P99), fmtDur(l.P999), fmtDur(l.Max), fmtDur(l.Mean))
	if len(r.Codes) > 0 {
		keys := slices.SortedFunc(maps.Keys(r.Codes), func(a, b string) int {
			x, _ := strconv.Atoi(a)
			y, _ := strconv.Atoi(b)
			return cmp.Compare(x, y)
		})
		fmt.Fprint(w, "codes    ")
		for _, k := range keys {
			fmt.Fprintf(w, " %s:%d", codeName(r.Mode, k), r.Codes[k])
		}
		fmt.Fprintln(w)
	}
	for _, k := range slices.Sorted(maps.Keys(r.ErrorKinds)) {
		fmt.Fprintf(w, "error     %d × %s\n", r.ErrorKinds[k], k)
	}
	if r.WindowMS > 0 {
		fmt.Fprintf(w, "windows   %d of %dms; busiest %dms span admitted %d\n", len(r.Windows), r.WindowMS, r.WindowMS, r.MaxInSpan)
	}
}

var grpcCodeNames = map[string]string{
	"0": "OK", "7": "PERMISSION_DENIED", "8": "RESOURCE_EXHAUSTED", "3": "INVALID_ARGUMENT", "-1": "no-answer",
}

func codeName(mode, code string) string {
	if mode == "check" {
		if n, ok := grpcCodeNames[code]; ok {
			return n
		}
	}
	if code == "-1" {
		return "no-answer"
	}
	return code
}
