package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

// Outcome classes of one call.
const (
	classAllowed = iota // gRPC OK; HTTP 2xx
	classDenied         // gRPC non-OK decision; HTTP 429 or 403
	classError          // transport error, timeout, or any other HTTP status
)

// outcome is the result of one call.
type outcome struct {
	class int
	code  int    // gRPC code of the decision or HTTP status; -1 when the call failed
	err   string // kind of failure, for the error breakdown ("" unless classError)
}

// caller sends requests to the system under test. prepare may be called
// concurrently with itself and with call.
type caller interface {
	// prepare turns a generated request into what call sends.
	prepare(r request, id uint64) (any, error)
	// call sends p; seq is the request's sequence number over the whole
	// run, which spreads requests over connections and targets.
	call(ctx context.Context, seq uint64, p any) outcome
	close()
}

// drainer is a caller whose calls the server may still be taking when
// the last returned (a stream's sends): drain waits until it has taken
// them all, and the run's time includes that wait.
type drainer interface {
	drain(ctx context.Context) error
}

// loadConfig is one run's load shape.
type loadConfig struct {
	concurrency int           // workers: requests in flight at most
	rate        float64       // requests/s over all workers; 0 = closed loop, as fast as answers come
	duration    time.Duration // measured time, after the warm-up
	warmup      time.Duration // sent but not recorded
	requests    int64         // at most this many sent, warm-up included; 0 = no bound but time
	timeout     time.Duration // per request
	pool        int           // requests prepared ahead and reused; 0 = prepare each one
	seed        uint64
	mix         mix
	keys        keySpec
}

func (c *loadConfig) validate() error {
	switch {
	case c.concurrency < 1 || c.concurrency > 10_000:
		return fmt.Errorf("--concurrency %d: must be from 1 to 10000", c.concurrency)
	case c.rate < 0 || c.rate > 10_000_000:
		return fmt.Errorf("--rate %v: must be from 0 (as fast as possible) to 10000000", c.rate)
	case c.duration <= 0 || c.duration > maxDuration:
		return fmt.Errorf("--duration %v: must be positive and at most %v", c.duration, maxDuration)
	case c.warmup < 0 || c.warmup > maxDuration:
		return fmt.Errorf("--warmup %v: must be from 0 to %v", c.warmup, maxDuration)
	case c.requests < 0:
		return fmt.Errorf("--requests %d: must not be negative", c.requests)
	case c.timeout <= 0 || c.timeout > time.Minute:
		return fmt.Errorf("--timeout %v: must be positive and at most 1m", c.timeout)
	case c.pool < 0 || c.pool > 1<<20:
		return fmt.Errorf("--pool %d: must be from 0 to %d", c.pool, 1<<20)
	}
	return c.keys.validate()
}

const maxDuration = time.Hour

// workerStats is one worker's record, merged after the run into a
// runRecord.
type workerStats struct {
	hist     histogram
	classes  [3]int64
	codes    map[int]int64
	errKinds map[string]int64
	late     int64 // fixed rate: requests already more than 1 ms overdue when their worker came free
	sent     int64 // warm-up included
	lastDone time.Time
}

func newWorkerStats() *workerStats {
	return &workerStats{codes: map[int]int64{}, errKinds: map[string]int64{}}
}

func (s *workerStats) add(o outcome, latency time.Duration) {
	s.hist.record(latency)
	s.classes[o.class]++
	s.codes[o.code]++
	if o.class == classError {
		s.errKinds[o.err]++
	}
}

// intendedTime is when request k of worker w of c is due at a fixed rate:
// the run's requests are spaced 1/rate apart and dealt to the workers in
// turn, so the workers together send at the rate.
func intendedTime(t0 time.Time, rate float64, c, w int, k int64) time.Time {
	n := float64(k)*float64(c) + float64(w)
	return t0.Add(time.Duration(n / rate * float64(time.Second)))
}

// runLoad drives c with cfg and returns the merged record. It returns an
// error only when the run could not start; failed calls are counted.
func runLoad(ctx context.Context, cfg loadConfig, c caller) (*runRecord, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &loadRun{cfg: cfg, c: c}
	if err := r.preparePool(); err != nil {
		return nil, err
	}

	// Start a moment from now so that every worker starts together.
	r.t0 = time.Now().Add(20 * time.Millisecond)
	cpu0 := cpuTime()
	r.measureFrom = r.t0.Add(cfg.warmup)
	r.end = r.measureFrom.Add(cfg.duration)
	ctx, cancel := context.WithDeadline(ctx, r.end.Add(cfg.timeout+time.Second))
	defer cancel()

	var wg sync.WaitGroup
	stats := make([]*workerStats, cfg.concurrency)
	for w := range cfg.concurrency {
		st := newWorkerStats()
		stats[w] = st
		wg.Go(func() { r.work(ctx, w, st) })
	}
	wg.Wait()
	rec := mergeStats(stats, r.measureFrom, r.end)
	drainCalls(ctx, c, rec)
	rec.cpu = cpuTime() - cpu0
	return rec, nil
}

// loadRun is what the workers of one run share.
type loadRun struct {
	cfg         loadConfig
	c           caller
	pool        []any         // requests prepared ahead; empty: prepare each
	seq         atomic.Uint64 // unique keys
	issued      atomic.Int64  // requests sent, for the count bound
	callNo      atomic.Uint64 // sequence over the run, for spreading over connections
	t0          time.Time     // when the workers start
	measureFrom time.Time     // the end of the warm-up
	end         time.Time     // the end of the measured time
}

// preparePool prepares the requests reused in turn, when cfg asks for
// them and its keys are not unique.
func (r *loadRun) preparePool() error {
	cfg := r.cfg
	if cfg.pool > 0 && cfg.keys.dist != keysUnique {
		g := newGenerator(cfg.mix, cfg.keys, cfg.seed, -1, &r.seq)
		r.pool = make([]any, cfg.pool)
		for i := range r.pool {
			p, err := r.c.prepare(g.next(), uint64(i))
			if err != nil {
				return err
			}
			r.pool[i] = p
		}
	}
	return nil
}

// work is worker w of the run: it sends requests until the run ends and
// records them in st.
func (r *loadRun) work(ctx context.Context, w int, st *workerStats) {
	cfg := r.cfg
	g := newGenerator(cfg.mix, cfg.keys, cfg.seed, w, &r.seq)
	rng := rand.New(rand.NewPCG(cfg.seed^0x5eed, uint64(w)))
	next := 0
	if len(r.pool) > 0 {
		next = rng.IntN(len(r.pool))
	}
	if !cli.Sleep(ctx, time.Until(r.t0)) {
		return
	}
	for k := int64(0); ; k++ {
		due, from, ok := r.due(ctx, w, k)
		if !ok {
			return
		}
		if cfg.requests > 0 && r.issued.Add(1) > cfg.requests {
			return
		}
		var p any
		if len(r.pool) > 0 {
			p, next = r.pool[next], (next+1)%len(r.pool)
		} else {
			var err error
			if p, err = r.c.prepare(g.next(), r.callNo.Load()); err != nil {
				st.classes[classError]++
				st.errKinds["prepare: "+err.Error()]++
				continue
			}
		}
		start := time.Now()
		cctx, ccancel := context.WithTimeout(ctx, cfg.timeout)
		o := r.c.call(cctx, r.callNo.Add(1)-1, p)
		ccancel()
		done := time.Now()
		st.sent++
		st.lastDone = done
		if due.Before(r.measureFrom) {
			continue
		}
		if cfg.rate > 0 && from.Equal(due) && start.Sub(due) > time.Millisecond {
			st.late++
		}
		st.add(o, done.Sub(from))
	}
}

// due waits until request k of worker w should leave and returns when
// that is (due) and when its latency counts from (from); false when the
// run is over for the worker.
func (r *loadRun) due(ctx context.Context, w int, k int64) (due, from time.Time, ok bool) {
	// At a fixed rate, a request already due when its worker comes free
	// waited behind slow answers: its latency counts from when it was due
	// (no coordinated omission). One the worker slept for counts from when
	// it left: a late wake-up is the tool's, not the server's.
	if r.cfg.rate > 0 {
		due = intendedTime(r.t0, r.cfg.rate, r.cfg.concurrency, w, k)
		if !due.Before(r.end) {
			return due, from, false
		}
		from = due
		if time.Now().Before(due) {
			if !cli.Sleep(ctx, time.Until(due)) {
				return due, from, false
			}
			from = time.Now()
		}
	} else {
		due = time.Now()
		from = due
		if !due.Before(r.end) || ctx.Err() != nil {
			return due, from, false
		}
	}
	return due, from, true
}

// drainCalls waits, when c is a drainer, until the server has taken all
// of c's calls: the run's time includes the wait, and its failure counts
// as an error.
func drainCalls(ctx context.Context, c caller, rec *runRecord) {
	if d, ok := c.(drainer); ok {
		err := d.drain(ctx)
		if now := time.Now(); rec.sent > 0 && now.After(rec.lastDone) {
			rec.lastDone = now
		}
		if err != nil {
			rec.classes[classError]++
			rec.errKinds["drain: "+err.Error()]++
		}
	}
}

// cpuTime is the CPU time (user + system, all threads) this process has
// used so far; 0 where getrusage fails.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runRecord is the merged record of a run, before it is summarised.
type runRecord struct {
	workerStats
	measureFrom time.Time
	end         time.Time
	cpu         time.Duration // the tool's own CPU over the run, warm-up included
}

func mergeStats(stats []*workerStats, measureFrom, end time.Time) *runRecord {
	r := &runRecord{workerStats: *newWorkerStats(), measureFrom: measureFrom, end: end}
	for _, s := range stats {
		r.hist.merge(&s.hist)
		for i, n := range s.classes {
			r.classes[i] += n
		}
		for k, n := range s.codes {
			r.codes[k] += n
		}
		for k, n := range s.errKinds {
			r.errKinds[k] += n
		}
		r.late += s.late
		r.sent += s.sent
		if s.lastDone.After(r.lastDone) {
			r.lastDone = s.lastDone
		}
	}
	return r
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// summarise turns a run's record into its result.
func summarise(r *runRecord, cfg loadConfig) loadresult.Result {
	h := &r.hist
	// The measured time: from the end of the warm-up to the last answer,
	// or the planned duration when nothing was answered.
	elapsed := r.end.Sub(r.measureFrom)
	if r.lastDone.After(r.measureFrom) {
		elapsed = r.lastDone.Sub(r.measureFrom)
	}
	res := loadresult.Result{
		Tool: loadresult.Tool, Concurrency: cfg.concurrency, Rate: cfg.rate, Mix: cfg.mix.String(), Keys: cfg.keys.String(),
		StartedAt: r.measureFrom.Add(-cfg.warmup).UTC(), WarmupS: cfg.warmup.Seconds(), DurationS: cfg.duration.Seconds(), ElapsedS: elapsed.Seconds(),
		Requests: r.classes[classAllowed] + r.classes[classDenied] + r.classes[classError], Sent: r.sent, ClientCPUS: r.cpu.Seconds(),
		Allowed: r.classes[classAllowed], Denied: r.classes[classDenied], Errors: r.classes[classError], Late: r.late, Codes: map[string]int64{},
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
	return res
}

// printText writes the human summary of a run: throughput, the tool's
// CPU, outcomes, latency percentiles, codes (gRPC code or HTTP status) and
// errors; --json has the rest.
func printText(w io.Writer, r *loadresult.Result) {
	load := "closed loop (as fast as answers come)"
	if r.Rate > 0 {
		load = fmt.Sprintf("fixed rate %.0f/s", r.Rate)
	}
	fmt.Fprintf(w, "%s %s  concurrency %d  connections %d  %s\nmix %s\nkeys %s\n",
		r.Mode, strings.Join(r.Targets, ","), r.Concurrency, r.Connections, load, r.Mix, r.Keys)
	fmt.Fprintf(w, "requests  %d in %.2fs after %.1fs of warm-up: %.0f/s, %.1fµs of this tool's CPU each\n",
		r.Requests, r.ElapsedS, r.WarmupS, r.RPS, r.ClientCPUUS())
	fmt.Fprintf(w, "outcome   allowed %d  denied %d (%.1f%%)  errors %d\n", r.Allowed, r.Denied, 100*r.DeniedShare(), r.Errors)
	if r.Rate > 0 {
		fmt.Fprintf(w, "schedule  %d requests over 1 ms overdue when a worker came free (their latency counts from when they were due)\n", r.Late)
	}
	l, m := r.Latency, loadresult.Micros
	fmt.Fprintf(w, "latency   p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s)\n", m(l.P50), m(l.P90), m(l.P99), m(l.P999), m(l.Max), m(l.Mean))
	fmt.Fprint(w, "codes    ")
	for _, k := range slices.SortedFunc(maps.Keys(r.Codes), func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return cmp.Compare(x, y)
	}) {
		fmt.Fprintf(w, " %s:%d", codeName(r.Mode, k), r.Codes[k])
	}
	fmt.Fprintln(w)
	for _, k := range slices.Sorted(maps.Keys(r.ErrorKinds)) {
		fmt.Fprintf(w, "error     %d × %s\n", r.ErrorKinds[k], k)
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
