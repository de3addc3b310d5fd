package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"runtime"
	"runtime/metrics"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

func TestParseMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		in    string
		mode  memoryMode
		bytes int64
		err   string
	}{
		{"auto", memoryAuto, 0, ""},
		{"AUTO", memoryAuto, 0, ""},
		{"off", memoryOff, 0, ""},
		{"0", memoryOff, 0, ""},
		{"512MiB", memoryFixed, 512 << 20, ""},
		{" 2GiB ", memoryFixed, 2 << 30, ""},
		{"2 GiB", memoryFixed, 2 << 30, ""},
		{"500MB", memoryFixed, 500e6, ""},
		{"268435456", memoryFixed, 1 << 28, ""},
		{"16777216B", memoryFixed, 16 << 20, ""},
		{"1TiB", memoryFixed, 1 << 40, ""},
		{"16777215", 0, 0, "below 16MiB"},
		{"1MiB", 0, 0, "below 16MiB"},
		{"-1", 0, 0, "use auto, off, or a size"},
		{"1.5GiB", 0, 0, "use auto, off, or a size"},
		{"12XB", 0, 0, "use auto, off, or a size"},
		{"GiB", 0, 0, "use auto, off, or a size"},
		{"9999999999TiB", 0, 0, "too large"},
		{"99999999999999999999", 0, 0, "use auto, off, or a size"},
	} {
		mode, n, err := parseMemoryLimit(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseMemoryLimit(%q) = %v, %d, %v; want an error with %q", c.in, mode, n, err, c.err)
			}
			continue
		}
		if err != nil || mode != c.mode || n != c.bytes {
			t.Errorf("parseMemoryLimit(%q) = %v, %d, %v; want %v, %d", c.in, mode, n, err, c.mode, c.bytes)
		}
	}
}

func TestAutoLimit(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name string
		s    memSample
		gogc int
		want int64
	}{
		{"counter dominates: the rest gets the floor", memSample{live: 110 * mib, overhead: 10 * mib, counter: 100 * mib}, 100, 10*mib + 100*mib + 10*mib + memoryHeadroomFloor},
		{"a large rest gets GOGC's headroom", memSample{live: 300 * mib, overhead: 10 * mib, counter: 100 * mib}, 100, 10*mib + 100*mib + 200*mib + 200*mib},
		{"GOGC=50 halves it", memSample{live: 300 * mib, overhead: 0, counter: 100 * mib}, 50, 100*mib + 200*mib + 100*mib},
		{"the counter grew since the last collection", memSample{live: 50 * mib, overhead: 0, counter: 80 * mib}, 100, 80*mib + memoryHeadroomFloor},
		{"empty", memSample{}, 100, memoryHeadroomFloor},
	} {
		if got := autoLimit(c.s, c.gogc); got != c.want {
			t.Errorf("%s: autoLimit(%+v, %d) = %d, want %d", c.name, c.s, c.gogc, got, c.want)
		}
	}
	// Whatever the figures, the limit is above the heap found live and the
	// counter now by at least the floor: the collector never has to run
	// back to back to stay under it.
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		s := memSample{live: r.Int64N(1 << 40), overhead: r.Int64N(1 << 30), counter: r.Int64N(1 << 40)}
		gogc := r.IntN(500)
		if got := autoLimit(s, gogc); got < max(s.live, s.counter)+s.overhead+memoryHeadroomFloor {
			t.Fatalf("autoLimit(%+v, %d) = %d: below the live heap plus the floor", s, gogc, got)
		}
	}
}

func TestMemoryConfigResolve(t *testing.T) {
	for _, c := range []struct {
		vars     map[string]string
		gogc     int
		operator string
	}{
		{nil, 100, ""},
		{map[string]string{"GOGC": "50"}, 50, ""},
		{map[string]string{"GOGC": "off"}, -1, ""},
		{map[string]string{"GOGC": "junk"}, 100, ""},
		{map[string]string{"GOMEMLIMIT": "1GiB"}, 100, "1GiB"},
	} {
		m := memoryConfig{flag: "auto"}
		if err := m.resolve(env(c.vars)); err != nil || m.gogc != c.gogc || m.operator != c.operator {
			t.Errorf("resolve with %v: gogc %d, GOMEMLIMIT %q, %v; want %d, %q", c.vars, m.gogc, m.operator, err, c.gogc, c.operator)
		}
	}
}

// TestServeMemoryLimit runs serve with each setting and reads the
// runtime's limit while it runs and after it stopped.
func TestServeMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	current := func() int64 { return debug.SetMemoryLimit(-1) }
	run := func(t *testing.T, vars map[string]string, wantLog string) (*servedNode, int64) {
		t.Helper()
		n := serveReady(t, vars)
		poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
			if !strings.Contains(n.logs.String(), wantLog) {
				return fmt.Errorf("no %q in the log:\n%s", wantLog, n.logs)
			}
			return nil
		})
		return n, current()
	}

	t.Run("auto", func(t *testing.T) {
		n, limit := run(t, map[string]string{"RATELIMIT_AUTHZ_MEMORY_LIMIT": "auto"}, "memory limit: auto")
		if limit == math.MaxInt64 || limit < memoryHeadroomFloor || limit > 4<<30 {
			t.Errorf("auto limit %d while serving", limit)
		}
		if c := n.node.CounterBytes(); limit < c+memoryHeadroomFloor {
			t.Errorf("auto limit %d below the counter's %d bytes plus the floor", limit, c)
		}
		if err := n.stop(); err != nil {
			t.Fatal(err)
		}
		if got := current(); got != before {
			t.Errorf("limit %d after serve stopped, want the %d it found", got, before)
		}
	})
	t.Run("fixed", func(t *testing.T) {
		n, limit := run(t, map[string]string{"RATELIMIT_AUTHZ_MEMORY_LIMIT": "3GiB"}, "memory limit: fixed")
		if limit != 3<<30 {
			t.Errorf("limit %d while serving with 3GiB", limit)
		}
		n.stop()
		if got := current(); got != before {
			t.Errorf("limit %d after serve stopped, want %d", got, before)
		}
	})
	t.Run("operator", func(t *testing.T) {
		// GOMEMLIMIT as the operator set it: serve leaves the runtime's
		// limit (the runtime read the real variable at start) alone.
		_, limit := run(t, map[string]string{"RATELIMIT_AUTHZ_MEMORY_LIMIT": "3GiB", "GOMEMLIMIT": "7GiB"}, "GOMEMLIMIT set by the operator is kept")
		if limit != before {
			t.Errorf("limit %d with GOMEMLIMIT set, want the runtime's %d", limit, before)
		}
	})
	t.Run("off", func(t *testing.T) {
		_, limit := run(t, map[string]string{"RATELIMIT_AUTHZ_MEMORY_LIMIT": "off"}, "memory limit: off")
		if limit != before {
			t.Errorf("limit %d with off, want the runtime's %d", limit, before)
		}
	})
}

func TestServeMemoryLimitUsage(t *testing.T) {
	var errOut bytes.Buffer
	err := run(context.Background(), []string{"serve", "--memory-limit", "10MB"}, env(nil), io.Discard, &errOut)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--memory-limit: \"10MB\": below 16MiB") {
		t.Errorf("serve --memory-limit 10MB: exit %d, %v", exitCode(err), err)
	}
	err = run(context.Background(), []string{"serve"}, env(map[string]string{"RATELIMIT_AUTHZ_MEMORY_LIMIT": "lots"}), io.Discard, &errOut)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--memory-limit: \"lots\": use auto, off, or a size") {
		t.Errorf("RATELIMIT_AUTHZ_MEMORY_LIMIT=lots: exit %d, %v", exitCode(err), err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-memory-limit", "RATELIMIT_AUTHZ_MEMORY_LIMIT", `(default "auto")`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
}

// A fragmented heap (objects freed but their spans still in use) counts
// against the limit as the runtime sees it: after a collection, auto's
// limit leaves the runtime at least the floor of room above what is live,
// counting everything mapped and neither released nor free.
func TestAutoLimitCountsFragmentation(t *testing.T) {
	const n, keep = 1 << 20, 16
	objs := make([]*[64]byte, n)
	for i := range objs {
		objs[i] = new([64]byte)
	}
	for i := range objs {
		if i%keep != 0 {
			objs[i] = nil
		}
	}
	runtime.GC()
	runtime.GC()
	buf := make([]metrics.Sample, len(memMetrics))
	for i, name := range memMetrics {
		buf[i].Name = name
	}
	s := readMemSample(buf, 0)
	v := func(i int) int64 { return int64(buf[i].Value.Uint64()) }
	total, released, objects, unused, free := v(1), v(2), v(3), v(4), v(5)
	if unused <= memoryHeadroomFloor {
		t.Fatalf("the test made only %d bytes of fragmentation, want more than the floor, %d, to show anything", unused, memoryHeadroomFloor)
	}
	// What the runtime counts against the limit, less the garbage a
	// collection frees, plus the floor.
	need := total - released - free - (objects - s.live) + memoryHeadroomFloor
	if got := autoLimit(s, 100); got < need {
		t.Errorf("auto limit %d with %d bytes of fragmentation: below the %d the runtime needs to keep the live heap and the floor", got, unused, need)
	}
	runtime.KeepAlive(objs)
}
