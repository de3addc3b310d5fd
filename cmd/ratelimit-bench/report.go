package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// summarise turns a run's record into its result.
func summarise(r *runRecord, cfg loadConfig) loadresult.Result {
	h := &r.hist
	res := loadresult.Result{
		Tool:        loadresult.Tool,
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
		Latency: loadresult.Latency{
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
		for _, w := range slices.Sorted(maps.Keys(r.windows)) {
			c := r.windows[w]
			res.Windows = append(res.Windows, loadresult.Window{StartMS: w * cfg.window.Milliseconds(), Allowed: c[classAllowed], Denied: c[classDenied]})
		}
	}
	return res
}

// printText writes the human summary of a run: throughput, the tool's
// CPU, outcomes, latency percentiles, codes (gRPC code or HTTP status) and
// errors; --json has the rest.
func printText(w io.Writer, r *loadresult.Result) {
	fmt.Fprintf(w, "%s %s  concurrency %d  connections %d  rate %g/s (0: closed loop)\nmix %s\nkeys %s\n",
		r.Mode, strings.Join(r.Targets, ","), r.Concurrency, r.Connections, r.Rate, r.Mix, r.Keys)
	fmt.Fprintf(w, "requests  %d in %.2fs after %.1fs of warm-up: %.0f/s, %.1fµs of this tool's CPU each\n",
		r.Requests, r.ElapsedS, r.WarmupS, r.RPS, r.ClientCPUUS())
	fmt.Fprintf(w, "outcome   allowed %d  denied %d (%.1f%%)  errors %d  late %d (fixed rate: over 1 ms overdue)\n",
		r.Allowed, r.Denied, 100*r.DeniedShare(), r.Errors, r.Late)
	l, m := r.Latency, loadresult.Micros
	fmt.Fprintf(w, "latency   p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s)\n", m(l.P50), m(l.P90), m(l.P99), m(l.P999), m(l.Max), m(l.Mean))
	fmt.Fprintf(w, "codes     %v (-1: no answer)\n", r.Codes) // fmt sorts a map's keys
	for _, k := range slices.Sorted(maps.Keys(r.ErrorKinds)) {
		fmt.Fprintf(w, "error     %d × %s\n", r.ErrorKinds[k], k)
	}
}
