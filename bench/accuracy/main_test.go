package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	c, done, err := parse([]string{"--nats-url", "nats://127.0.0.1:1", "--multiples", "1.1, 10"}, io.Discard, io.Discard)
	if err != nil || done || !slices.Equal(c.multiples, []float64{1.1, 10}) || c.limit != 100 || c.windows != 8 || c.window != time.Second {
		t.Errorf("parse: %+v, %v, %v", c, done, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--nats-url is required"},
		{[]string{"--nats-url", "x", "--multiples", "0"}, "--multiples"},
		{[]string{"--nats-url", "x", "--multiples", "ten"}, "--multiples"},
		{[]string{"--nats-url", "x", "--multiples", "10000", "--limit", "1000"}, "Takes/s per row"},
		{[]string{"--nats-url", "x", "--window", "1500us"}, "--window"},
		{[]string{"--nats-url", "x", "--windows", "0"}, "--windows"},
		{[]string{"--nats-url", "x", "extra"}, "unexpected argument"},
		{[]string{"--nats-url", "x", "--bursts", "storm"}, "--bursts"},
		{[]string{"--nats-url", "x", "--burst-runs", "0"}, "--burst-runs"},
		{[]string{"--nats-url", "x", "--multiples", ""}, "nothing to measure"},
	} {
		var stderr strings.Builder // where a mistake cli.Parse finds is told
		_, done, err := parse(tc.args, io.Discard, &stderr)
		if !done || err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%q: %v %q, want an error about %s", tc.args, err, stderr.String(), tc.want)
		}
	}
	c, _, err = parse([]string{"--nats-url", "x", "--multiples", "", "--bursts", "all"}, io.Discard, io.Discard)
	if err != nil || len(c.multiples) != 0 || !slices.Equal(c.bursts, burstNames) || c.burstRuns != 6 {
		t.Errorf("bursts only: %+v, %v", c, err)
	}
	for _, name := range burstNames {
		if _, ok := burstSpecs[name]; !ok {
			t.Errorf("burst %q has no spec", name)
		}
	}
	if len(burstNames) != len(burstSpecs) {
		t.Errorf("%d burst names, %d specs", len(burstNames), len(burstSpecs))
	}
	var out strings.Builder
	if _, done, err := parse([]string{"--help"}, &out, io.Discard); !done || err != nil || !strings.Contains(out.String(), "-nats-url") {
		t.Errorf("--help: %v, %q", err, out.String())
	}
}

// TestSummarise: the first, partial window is never counted, nor for a
// sliding window the first whole one; then the given number of windows.
func TestSummarise(t *testing.T) {
	for _, tc := range []struct {
		skip int
		want []int64
	}{{1, []int64{11, 12}}, {2, []int64{12, 13}}} {
		rr := &rowRun{skip: tc.skip}
		for n := range nodes {
			// Window s holds 10+s admitted in all, of 100 offered: node 0
			// admitted all but 2 of them, the others 1 each.
			rr.counts[n] = make([][2]int64, 4)
			for s := range rr.counts[n] {
				adm := int64(1)
				if n == 0 {
					adm = int64(10 + s - 2)
				}
				rr.counts[n][s] = [2]int64{int64(100 / nodes), adm}
			}
		}
		rr.behind[2] = 3 * time.Millisecond
		r := rr.summarise(7, 1000, 2)
		if !slices.Equal(r.Admitted, tc.want) || r.Windows != 2 || r.WindowStartMS[0] != int64(7+tc.skip)*1000 ||
			r.Min != tc.want[0] || r.Max != tc.want[1] || r.Median != float64(tc.want[0]+tc.want[1])/2 || r.MaxBehindMS != 3 {
			t.Errorf("skip %d: %+v, want admitted %v", tc.skip, r, tc.want)
		}
		if r.Offered[0] != 99 || !slices.Equal(r.AdmittedPerNode[0], []int64{tc.want[0] - 2, 1, 1}) {
			t.Errorf("skip %d: offered %v, per node %v", tc.skip, r.Offered, r.AdmittedPerNode)
		}
	}
	// Fewer windows than asked for: only those there are.
	rr := &rowRun{skip: 2}
	for n := range nodes {
		rr.counts[n] = make([][2]int64, 3)
	}
	if r := rr.summarise(0, 1000, 5); r.Windows != 1 {
		t.Errorf("3 slots, skip 2: %d windows, want 1", r.Windows)
	}
}
