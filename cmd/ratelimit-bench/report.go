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

// printText writes the human summary.
func printText(w io.Writer, r *loadresult.Result) {
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
	if c := r.ClientCPUUS(); c > 0 {
		fmt.Fprintf(w, "client    %.1fµs of this tool's CPU per request\n", c)
	}
	fmt.Fprintf(w, "outcome   allowed %d  denied %d  errors %d", r.Allowed, r.Denied, r.Errors)
	if r.Requests > 0 {
		fmt.Fprintf(w, "  (%.1f%% denied)", 100*r.DeniedShare())
	}
	fmt.Fprintln(w)
	if r.Rate > 0 {
		fmt.Fprintf(w, "schedule  %d requests were over 1 ms overdue when a worker came free (their latency counts from when they were due)\n", r.Late)
	}
	l := r.Latency
	fmt.Fprintf(w, "latency   p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s)\n",
		loadresult.Micros(l.P50), loadresult.Micros(l.P90), loadresult.Micros(l.P99), loadresult.Micros(l.P999), loadresult.Micros(l.Max), loadresult.Micros(l.Mean))
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
		fmt.Fprintf(w, "windows   %d of %dms\n", len(r.Windows), r.WindowMS)
	}
}

// codeName names a code of the summary: Check's gRPC codes by name.
func codeName(mode, code string) string {
	names := map[string]string{"-1": "no-answer"}
	if mode == "check" {
		names = map[string]string{"0": "OK", "7": "PERMISSION_DENIED", "8": "RESOURCE_EXHAUSTED", "3": "INVALID_ARGUMENT", "-1": "no-answer"}
	}
	return cmp.Or(names[code], code)
}
