package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// memory is the memory scenario: a million distinct keys, client IPs on the
// token_create bucket (per client IP, a minute-long window) and its copies,
// all arriving within one window; resident memory and live keys before,
// at the end, and after the window has ended and the sweeper has run.
// Each check counts in opt.memBuckets buckets, so it brings that many
// new keys: half a million checks fit in a minute on two shared cores
// where a million might not.
//
// The keys must arrive within one window, so the load starts only when
// the rest of the current window can hold it; while it waits (and while
// the keys expire) the tasks in pending run, and are removed from it.
func (r *runner) memory(ctx context.Context, pending *[]task) error {
	window := r.opt.memWindow
	keys := r.opt.memKeys
	copies := int64(r.opt.memBuckets)
	checks := (keys + copies - 1) / copies
	keys = checks * copies
	// The key bound is per shard (max_keys / 64 each), so a store filled to
	// exactly max_keys refuses some keys early; 25% headroom lets all in.
	maxKeys := int(keys + keys/4)
	sweep := min(5*time.Second, window/4)
	cfg := filepath.Join(r.tmp, "memory.yaml")
	if err := writeMemoryConfig(r.root, cfg, window, int(copies), maxKeys); err != nil {
		return err
	}
	m := &Memory{Keys: keys, Checks: checks, Buckets: int(copies), WindowS: int(window.Seconds()), SweepS: sweep.Seconds(), MaxKeysConfig: maxKeys}
	r.res.Memory = m
	srv, err := r.startCheckServer(ctx, "s2-server", cfg, []string{"GODEBUG=gctrace=1"},
		"--sweep-interval", sweep.String())
	if err != nil {
		return err
	}
	defer srv.stop()
	metricsURL, grpcAddr := "http://"+srv.http+"/metrics", srv.grpc

	t0 := time.Now()
	since := func() float64 { return round(time.Since(t0).Seconds(), 2) }
	var mu sync.Mutex
	event := func(label string) {
		mu.Lock()
		m.Events = append(m.Events, MemEvent{T: since(), Label: label})
		mu.Unlock()
	}
	sctx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			st, err := status(srv.PID())
			if err == nil {
				live := -1.0
				if mt, err := scrape.Get(httpClient, metricsURL); err == nil {
					live = mt.Sum("ratelimit_authz_counter_live_keys")
				}
				mu.Lock()
				m.Series = append(m.Series, MemSample{T: since(), RSS: int64(st.VmRSS), LiveKeys: live})
				mu.Unlock()
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	})
	defer func() { stopSampling(); sampling.Wait() }()

	point := func() (MemPoint, error) {
		st, err := status(srv.PID())
		if err != nil {
			return MemPoint{}, err
		}
		mt, err := scrape.Get(httpClient, metricsURL)
		if err != nil {
			return MemPoint{}, err
		}
		return MemPoint{RSS: int64(st.VmRSS), HWM: int64(st.VmHWM), LiveKeys: mt.Sum("ratelimit_authz_counter_live_keys"), AtS: since()}, nil
	}

	// Baseline: the server warmed up (connections, buffers) and collected.
	warm, err := r.load(ctx, "s2-warm", 10*time.Second, "check", "--target", grpcAddr, "--routes", "unmatched",
		"--requests", "20000", "--concurrency", "16", "--duration", "10s", "--warmup", "0")
	if err != nil {
		return err
	}
	if m.Baseline, err = point(); err != nil {
		return err
	}
	m.Baseline.LiveHeap, m.Baseline.HeapGoal = r.gcSettle(ctx, "baseline", grpcAddr, srv.LogPath())

	// Wait for a window that can hold the whole load; run pending tasks
	// meanwhile.
	// The rate the load will reach: from the warm-up just measured
	// (unmatched checks, cheaper than new keys, so taken at half), so that
	// a busy machine waits for a window that can hold the load instead of
	// straddling two.
	rate := 15000.0
	if warm.RPS > 0 {
		rate = min(rate, 0.5*warm.RPS)
	}
	est := time.Duration(float64(checks)/rate*float64(time.Second)) + 3*time.Second
	if est > window {
		r.note("memory: at ~%.0f checks/s the %d checks need ~%v, longer than one %v window; the load starts with a window, and keys of it expire before the last arrive", rate, checks, est.Round(time.Second), window)
	}
	for {
		rem := time.Until(nextBoundary(time.Now(), window))
		if rem >= est {
			break
		}
		ran := false
		for i, t := range *pending {
			if t.estimate < rem-2*time.Second {
				*pending = append((*pending)[:i:i], (*pending)[i+1:]...)
				r.printf("(memory waits %v for a fresh window: running %s meanwhile)\n", rem.Round(time.Second), t.name)
				event("idle: " + t.name)
				r.step(ctx, t.name, t.run)
				ran = true
				break
			}
		}
		if !ran {
			r.printf("(memory waits %v for a fresh window)\n", rem.Round(time.Second))
			if !cli.Sleep(ctx, rem+100*time.Millisecond) {
				return ctx.Err()
			}
			break
		}
	}

	loadStart := time.Now()
	event("load starts")
	r.printf("sending %d checks, each a new client IP counted in %d buckets (token_create…: per IP, window %v): %d keys …\n", checks, copies, window, keys)
	maxLoad := min(5*time.Minute, time.Until(r.deadline)-time.Minute)
	res, err := r.load(ctx, "s2-load", maxLoad, "check", "--target", grpcAddr, "--routes", "legacy_tokens", "--keys", "unique",
		"--requests", strconv.FormatInt(checks, 10), "--concurrency", "32", "--connections", strconv.Itoa(grpcConns),
		"--duration", maxLoad.String(), "--warmup", "0", "--timeout", "5s", "--pool", "0")
	if err != nil {
		return err
	}
	loadEnd := time.Now()
	event("all keys sent")
	m.LoadS, m.LoadRPS, m.Errors = round(res.ElapsedS, 2), round1(res.RPS), res.Errors
	if m.Loaded, err = point(); err != nil {
		return err
	}
	if mt, err := scrape.Get(httpClient, metricsURL); err == nil {
		m.Refused = mt.Sum("ratelimit_authz_counter_keys_refused_total")
	}
	m.Loaded.LiveHeap, m.Loaded.HeapGoal = r.gcSettle(ctx, "loaded", grpcAddr, srv.LogPath())
	if first, last := windowOf(loadStart, window), windowOf(loadEnd, window); first != last {
		m.Note = fmt.Sprintf("the load straddled a window boundary: %d keys live at its end of %d sent", int64(m.Loaded.LiveKeys), keys)
	}
	delta := float64(m.Loaded.RSS - m.Baseline.RSS)
	if m.Loaded.LiveKeys > 0 {
		m.BytesPerKeyRSS = round1(delta / m.Loaded.LiveKeys)
		if m.Loaded.LiveHeap > 0 && m.Baseline.LiveHeap > 0 {
			m.BytesPerKeyHeap = round1(float64(m.Loaded.LiveHeap-m.Baseline.LiveHeap) / m.Loaded.LiveKeys)
		}
	}
	r.printf("%d checks in %.1fs (%.0f/s, %d errors): RSS %s → %s, live keys %.0f, %.0f bytes/key resident, %.0f bytes/key live heap\n",
		checks, m.LoadS, m.LoadRPS, m.Errors, mib(m.Baseline.RSS), mib(m.Loaded.RSS), m.Loaded.LiveKeys, m.BytesPerKeyRSS, m.BytesPerKeyHeap)

	// Expiry: the window of the last key ends, then the sweeper runs.
	expiry := nextBoundary(loadEnd, window).Add(sweep + 1500*time.Millisecond)
	for len(*pending) > 0 && ctx.Err() == nil {
		t := (*pending)[0]
		*pending = (*pending)[1:]
		r.printf("(memory waits %v for its keys to expire: running %s meanwhile)\n", max(0, time.Until(expiry)).Round(time.Second), t.name)
		event("idle: " + t.name)
		r.step(ctx, t.name, t.run)
	}
	if d := time.Until(expiry); d > 0 {
		r.printf("(waiting %v for the window to end and the sweeper to run)\n", d.Round(time.Second))
		if !cli.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
	event("expired + swept")
	if m.Expired, err = point(); err != nil {
		return err
	}
	m.Expired.LiveHeap, m.Expired.HeapGoal = r.gcSettle(ctx, "expired", grpcAddr, srv.LogPath())
	r.printf("after expiry: live keys %.0f, RSS %s, live heap %s\n", m.Expired.LiveKeys, mib(m.Expired.RSS), mib(m.Expired.LiveHeap))
	time.Sleep(time.Second) // one more sample for the plot
	return nil
}

// nextBoundary is the start of the window (aligned to the Unix epoch, as
// the server's fixed windows are) after the one holding t.
func nextBoundary(t time.Time, window time.Duration) time.Time {
	w := windowOf(t, window)
	return time.UnixMilli((w + 1) * window.Milliseconds())
}

func windowOf(t time.Time, window time.Duration) int64 {
	return t.UnixMilli() / window.Milliseconds()
}

// gcLine is one GODEBUG=gctrace=1 line: "gc 7 @2.1s 1%: … 12->13->6 MB,
// 14 MB goal, …". The third heap figure is the heap marked live.
var gcLine = regexp.MustCompile(`(?m)^gc (\d+) @[\d.]+s .*?(\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)

// lastGC returns the number, live heap and heap goal (bytes) of the last
// GC in the server's log.
func lastGC(logPath string) (n int, live, goal int64) {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return 0, 0, 0
	}
	all := gcLine.FindAllSubmatch(b, -1)
	if len(all) == 0 {
		return 0, 0, 0
	}
	m := all[len(all)-1]
	n, _ = strconv.Atoi(string(m[1]))
	l, _ := strconv.ParseInt(string(m[4]), 10, 64)
	g, _ := strconv.ParseInt(string(m[5]), 10, 64)
	return n, l << 20, g << 20
}

// gcSettle makes the server collect once (by sending it checks that match
// no route: garbage from the transport, no new keys) and returns the heap
// that collection found live, and its next goal. 0 when no GC came.
func (r *runner) gcSettle(ctx context.Context, name, grpcAddr, logPath string) (live, goal int64) {
	n0, _, _ := lastGC(logPath)
	for i := range 12 {
		if _, err := r.load(ctx, fmt.Sprintf("s2-gc-%s-%d", name, i), 5*time.Second, "check", "--target", grpcAddr,
			"--routes", "unmatched", "--requests", "40000", "--concurrency", "16", "--duration", "5s", "--warmup", "0"); err != nil {
			return 0, 0
		}
		time.Sleep(100 * time.Millisecond)
		if n, l, g := lastGC(logPath); n > n0 {
			return l, g
		}
	}
	return 0, 0
}

func mib(b int64) string {
	return strings.TrimSuffix(strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64), ".0") + " MiB"
}
