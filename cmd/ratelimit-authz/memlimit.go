package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// The Go runtime's soft memory limit, kept by serve.
//
// Left alone, the garbage collector lets the heap grow to twice what it
// found live (GOGC=100) before it collects again. Most of a loaded node's
// heap is the counter (up to counter.max_keys keys), and the counter's
// arrays hold no pointers: the collector marks them without scanning them,
// so collecting more often costs little, while doubling them doubles the
// node's resident memory. So by default (auto) the limit is kept at
//
//	runtime overhead + counter arrays + rest of the live heap + headroom
//
// where headroom is GOGC% of the rest of the live heap, at least
// memoryHeadroomFloor: the counter is exempt from GOGC's doubling, the rest
// of the heap is not. The counter's own size is bounded by max_keys, and
// the limit follows it, re-read every memoryLimitInterval: since it is
// above the live heap by the headroom (fragmentation counted as overhead),
// the collector does not run back to back to stay under it (no death
// spiral). Between two readings the counter's arrays can grow past the
// headroom (a flood doubles every shard's arrays at about the same time):
// the collector then runs often for up to memoryLimitInterval, its CPU
// capped at about half by the runtime, until the limit follows. A fixed size sets that
// limit instead (as GOMEMLIMIT would); off leaves the runtime's. A
// GOMEMLIMIT set by the operator always wins.

// memoryHeadroomFloor is the least headroom above the live heap.
const memoryHeadroomFloor = 32 << 20

// memoryLimitInterval is how often auto re-reads the counter's size.
const memoryLimitInterval = time.Second

// minMemoryLimit is the smallest fixed limit accepted: below it the
// collector would run nearly continuously.
const minMemoryLimit = 16 << 20

// memoryConfig is serve's --memory-limit.
type memoryConfig struct {
	flag     string
	mode     memoryMode
	bytes    int64  // the fixed limit, in mode memoryFixed
	operator string // GOMEMLIMIT as the operator set it, "" if not
	gogc     int    // GOGC in percent; -1: off
}

type memoryMode uint8

const (
	memoryAuto memoryMode = iota
	memoryOff
	memoryFixed
)

func (m *memoryConfig) addFlags(f *envFlags) {
	f.String(&m.flag, "memory-limit", "RATELIMIT_AUTHZ_MEMORY_LIMIT", "auto", "the Go runtime's soft memory `limit`: auto keeps it at the counter's arrays plus GOGC's headroom for the rest of the heap (so resident memory is not twice the counter's), a size (like 512MiB or 2GiB) fixes it, off or 0 leaves it to the runtime; a GOMEMLIMIT in the environment wins")
}

// resolve parses the flag and reads GOMEMLIMIT and GOGC from getenv.
func (m *memoryConfig) resolve(getenv func(string) string) error {
	mode, n, err := parseMemoryLimit(m.flag)
	if err != nil {
		return fmt.Errorf("--memory-limit: %w", err)
	}
	m.mode, m.bytes = mode, n
	m.operator = getenv("GOMEMLIMIT")
	m.gogc = 100
	switch g := strings.TrimSpace(getenv("GOGC")); {
	case g == "":
	case strings.EqualFold(g, "off"):
		m.gogc = -1
	default:
		if p, err := strconv.Atoi(g); err == nil {
			m.gogc = p
		}
	}
	return nil
}

// parseMemoryLimit parses auto, off, 0, a number of bytes, or a number
// with a unit: B, KiB, MiB, GiB, TiB (GOMEMLIMIT's), or KB, MB, GB, TB
// (powers of 1000).
func parseMemoryLimit(s string) (memoryMode, int64, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "auto", "":
		return memoryAuto, 0, nil
	case "off", "0":
		return memoryOff, 0, nil
	}
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	num, mult := s, int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, 0, fmt.Errorf("%q: use auto, off, or a size like 512MiB or 2GiB", s)
	}
	if n > math.MaxInt64/mult {
		return 0, 0, fmt.Errorf("%q: too large", s)
	}
	if n *= mult; n < minMemoryLimit {
		return 0, 0, fmt.Errorf("%q: below 16MiB the garbage collector would run nearly all the time; use off to leave the limit to the runtime", s)
	}
	return memoryFixed, n, nil
}

// memSample is what the auto limit is computed from.
type memSample struct {
	live     int64 // heap found live by the last collection
	overhead int64 // what the runtime maps besides the heap (stacks, metadata), not released to the OS
	counter  int64 // the counter's arrays now
}

// autoLimit is the auto limit for a sample: the counter, the rest of the
// live heap with GOGC's headroom (at least memoryHeadroomFloor), and the
// runtime's overhead. The counter is read now, the live heap at the last
// collection: if the counter grew since, the rest is taken as what is left
// (at least 0).
func autoLimit(s memSample, gogc int) int64 {
	rest := max(0, s.live-s.counter)
	headroom := max(memoryHeadroomFloor, rest*int64(gogc)/100)
	return s.overhead + s.counter + rest + headroom
}

var memMetrics = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
}

// readMemSample reads the runtime's figures into a sample; counter is
// the counter's size.
func readMemSample(buf []metrics.Sample, counter int64) memSample {
	metrics.Read(buf)
	v := func(i int) int64 {
		if buf[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(buf[i].Value.Uint64())
	}
	// Fragmentation inside in-use spans (heap/unused) counts against the
	// limit as the runtime sees it, and is no room for live objects: it
	// is overhead. Free spans are room for the heap to grow into.
	heap := v(3) + v(5)
	return memSample{live: v(0), overhead: max(0, v(1)-v(2)-heap), counter: counter}
}

// runMemoryLimit applies m until ctx is done, then restores the limit it
// found; counterBytes reports the counter's arrays. It logs what it chose.
// For auto it re-reads the counter's size every memoryLimitInterval and
// sets the limit anew; otherwise it returns once the limit is set.
func runMemoryLimit(ctx context.Context, m memoryConfig, counterBytes func() int64, log *slog.Logger) {
	switch {
	case m.operator != "":
		log.Info("memory limit: GOMEMLIMIT set by the operator is kept", "GOMEMLIMIT", m.operator, "memory_limit", m.flag)
		return
	case m.mode == memoryOff:
		log.Info("memory limit: off, the runtime's default (GOGC only)")
		return
	case m.mode == memoryFixed:
		prev := debug.SetMemoryLimit(m.bytes)
		log.Info("memory limit: fixed", "bytes", m.bytes)
		<-ctx.Done()
		debug.SetMemoryLimit(prev)
		return
	case m.gogc < 0:
		log.Info("memory limit: auto does nothing with GOGC=off (set a size to bound the heap)")
		return
	}
	buf := make([]metrics.Sample, len(memMetrics))
	for i, name := range memMetrics {
		buf[i].Name = name
	}
	limit := autoLimit(readMemSample(buf, counterBytes()), m.gogc)
	prev := debug.SetMemoryLimit(limit)
	defer debug.SetMemoryLimit(prev)
	log.Info("memory limit: auto, the counter's arrays plus GOGC's headroom for the rest of the heap; follows the counter",
		"bytes", limit, "counter_bytes", counterBytes(), "headroom_floor_bytes", memoryHeadroomFloor, "gogc", m.gogc)
	t := time.NewTicker(memoryLimitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s := readMemSample(buf, counterBytes())
			limit = autoLimit(s, m.gogc)
			debug.SetMemoryLimit(limit)
			log.Debug("memory limit", "bytes", limit, "counter_bytes", s.counter, "live_heap_bytes", s.live, "overhead_bytes", s.overhead)
		}
	}
}
