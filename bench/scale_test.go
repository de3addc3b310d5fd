package main

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

const scaleOutput = `goos: linux
goarch: amd64
pkg: github.com/ratelimit-authz/ratelimit-authz/internal/replicate
cpu: AMD EPYC
BenchmarkReplicationScale/nodes=3/hot-2         	  100000	         0 ae-entries/node/1k-hits	         4.5 cpu-µs/hit	     19998 hits/s	      2889 in-B/node/1k-hits	     57775 in-B/node/s	         3.80 in-msgs/node/1k-hits	       270.9 merged/node/1k-hits	      1445 out-B/node/1k-hits	     28887 out-B/node/s	       135.4 sent-entries/node/1k-hits	         0 sync-B/node/1k-hits	 2 slow-consumer-events
some log line the benchmark printed
BenchmarkReplicationScale/nodes=30/flood         	  100000	         0 ae-entries/node/1k-hits	        64.65 cpu-µs/hit	    114780 hits/s	     11557 in-B/node/1k-hits	   1326523 in-B/node/s	         1.58 in-msgs/node/1k-hits	       966.7 merged/node/1k-hits	       398 out-B/node/1k-hits	     45742 out-B/node/s	        33.33 sent-entries/node/1k-hits	     22282 sync-B/node/1k-hits
PASS
ok  	github.com/ratelimit-authz/ratelimit-authz/internal/replicate	38.1s
`

func TestParseScaleBench(t *testing.T) {
	rows, err := parseScaleBench(scaleOutput)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(rows), rows)
	}
	hot, flood := rows[0], rows[1]
	if hot.Nodes != 3 || hot.Load != "hot" || hot.Hits != 100000 {
		t.Errorf("first row %d nodes %q %d hits, want 3 hot 100000", hot.Nodes, hot.Load, hot.Hits)
	}
	if flood.Nodes != 30 || flood.Load != "flood" {
		t.Errorf("second row %d nodes %q, want 30 flood (no GOMAXPROCS suffix)", flood.Nodes, flood.Load)
	}
	for unit, want := range map[string]float64{mInB: 2889, mInMsgs: 3.80, mMerged: 270.9, mCPU: 4.5, mSlow: 2, mOutBs: 28887} {
		if got := hot.value(unit); got != want {
			t.Errorf("hot %s = %v, want %v", unit, got, want)
		}
	}
	if got := flood.value(mSyncB); got != 22282 {
		t.Errorf("flood %s = %v, want 22282", mSyncB, got)
	}
	if got := flood.value(mSlow); got != 0 {
		t.Errorf("flood reports no %s: got %v", mSlow, got)
	}
}

func TestParseScaleBenchRefusesWhatItCannotRead(t *testing.T) {
	for name, out := range map[string]string{
		"no results":   "PASS\nok  \tpkg\t1s\n",
		"bad name":     "BenchmarkReplicationScale/three/hot-2 100 1 in-B/node/1k-hits\n",
		"one node":     "BenchmarkReplicationScale/nodes=1/hot-2 100 1 in-B/node/1k-hits\n",
		"odd fields":   "BenchmarkReplicationScale/nodes=3/hot-2 100 1 in-B/node/1k-hits 2\n",
		"bad value":    "BenchmarkReplicationScale/nodes=3/hot-2 100 x out-B/node/1k-hits 1 in-B/node/1k-hits 1 in-msgs/node/1k-hits 1 merged/node/1k-hits 1 cpu-µs/hit 1 hits/s\n",
		"missing unit": "BenchmarkReplicationScale/nodes=3/hot-2 100 1 out-B/node/1k-hits 1 in-B/node/1k-hits\n",
	} {
		if rows, err := parseScaleBench(out); err == nil {
			t.Errorf("%s: parsed %+v, want an error", name, rows)
		}
	}
}

func TestAvgDecimalLen(t *testing.T) {
	for n, want := range map[int]float64{1: 1, 10: 1, 100: 1.9, 1000: 2.89, 150: (10 + 90*2 + 50*3) / 150.0} {
		if got := avgDecimalLen(n); math.Abs(got-want) > 1e-9 {
			t.Errorf("avgDecimalLen(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestPredictScale(t *testing.T) {
	for _, n := range scaleNodeCounts {
		now := predictScale(benchShape, designNow, n, "flood", 500_000, 100)
		// Every hit a new key, sent once by its node to the N−1 others.
		if want := 1000 * float64(n-1) / float64(n); math.Abs(now.Merged-want) > 0.01 {
			t.Errorf("%d nodes: flood merged %v per 1k hits, want %v", n, now.Merged, want)
		}
		// "ip-" and 1.9 digits on average, a one-byte length and count,
		// limit index and window offset.
		if want := 1 + 1 + 1 + 4.9 + 1; math.Abs(now.EntryB-want) > 0.01 {
			t.Errorf("flood entry %v B, want %v", now.EntryB, want)
		}
		if math.Abs(now.InB-float64(n-1)*now.OutB) > 0.1*float64(n) {
			t.Errorf("%d nodes: in %v B is not (N−1) × out %v B", n, now.InB, now.OutB)
		}
		shares := predictScale(benchShape, designShares, n, "flood", 500_000, 100)
		if shares.Merged != 0 || shares.InB > 0.01*now.InB {
			t.Errorf("%d nodes: budget shares' flood merges %v and costs %v B against %v B", n, shares.Merged, shares.InB, now.InB)
		}
		hot, hotShares := predictScale(benchShape, designNow, n, "hot", hotRate, 0), predictScale(benchShape, designShares, n, "hot", hotRate, 0)
		if hot != hotShares {
			t.Errorf("%d nodes: hot keys replicate as today under budget shares: %+v vs %+v", n, hotShares, hot)
		}
		// At most a tick and an early batch per gap.
		if max := 1/benchShape.SyncS + 1/benchShape.EarlyGapS; hot.BatchesPS <= 1/benchShape.SyncS || hot.BatchesPS > max {
			t.Errorf("%d nodes: %v batches/s, want between the ticks' %v and %v", n, hot.BatchesPS, 1/benchShape.SyncS, max)
		}
	}
	// The hot keys' early phase: half of 250 at 200/s per key is 0.625 s
	// into the window, seen (N−1)/N × 50 ms later; before it 10 ticks a
	// second of all 100 keys, after it 100 early batches a second of
	// 20000/3 × 10 ms ≈ 66.7 keys each.
	hot := predictScale(benchShape, designNow, 3, "hot", hotRate, 0)
	f := 0.625 + 2.0/3*0.05
	wantBatches := f*10 + (1-f)*100
	wantEntries := f*10*100 + (1-f)*100*(20000.0/3*0.01)
	if math.Abs(hot.BatchesPS-wantBatches) > 0.05 {
		t.Errorf("hot, 3 nodes: %v batches/s, want %v", hot.BatchesPS, wantBatches)
	}
	if got := hot.Sent * hotRate / 1000; math.Abs(got-wantEntries) > 1 {
		t.Errorf("hot, 3 nodes: %v entries/s, want %v", got, wantEntries)
	}
}

func TestSolve2AndNATSFit(t *testing.T) {
	// 1 µs per publish, 0.25 µs per delivery.
	cpu := func(pub, del float64) float64 { return pub*1e-6 + del*0.25e-6 }
	c := NATSCapacity{Runs: []NATSRun{
		{Fanout: 1, Size: 128, PublishedPS: 200_000, DeliveredPS: 200_000, ServerCPU: cpu(200_000, 200_000)},
		{Fanout: 10, Size: 128, PublishedPS: 80_000, DeliveredPS: 800_000, ServerCPU: cpu(80_000, 800_000)},
		{Fanout: 10, Size: 1024, PublishedPS: 10, DeliveredPS: 100, ServerCPU: 0.9},
	}}
	c.fit()
	if math.Abs(c.PerPublishUS-1) > 1e-3 || math.Abs(c.PerDeliveryUS-0.25) > 1e-3 {
		t.Errorf("fit a = %v µs, b = %v µs; want 1 and 0.25", c.PerPublishUS, c.PerDeliveryUS)
	}
	// Noise that makes the publish cost negative: all of it on deliveries.
	c.Runs[0].ServerCPU = 0.01
	c.fit()
	if c.PerPublishUS != 0 || math.Abs(c.PerDeliveryUS-c.Runs[1].ServerCPU/800_000*1e6) > 1e-3 {
		t.Errorf("noisy fit a = %v, b = %v; want 0 and the fan-out-10 run's CPU per delivery", c.PerPublishUS, c.PerDeliveryUS)
	}
}

func TestSaturation(t *testing.T) {
	// 1 µs per delivery, publishes free, and every batch slot used: 110
	// batches per node per second. One server: N(N−1) × 110 µs ≥ 1 s at
	// N = 96 (95 × 94 × 110 µs < 1 s). Three: N × 110 × (N+2)/3 µs ≥ 1 s at
	// N = 165.
	s := saturation(benchShape, NATSCapacity{PerPublishUS: 0, PerDeliveryUS: 1})
	if len(s) != 3 {
		t.Fatalf("%d cases, want 3", len(s))
	}
	slots := s[2]
	if slots.OneServer != 96 || slots.ThreeServers != 165 || slots.BatchesPS != 110 {
		t.Errorf("every slot: %+v, want 96 and 165 nodes at 110 batches/s", slots)
	}
	for _, got := range s[:2] {
		if got.OneServer <= slots.OneServer || got.ThreeServers <= got.OneServer {
			t.Errorf("%+v: fewer batches than every slot saturate later, and three servers later than one", got)
		}
	}
	// A fixed load spread over more nodes leaves each fewer batches than a
	// load growing with the cluster, whose nodes keep theirs.
	if s[0].OneServer <= s[1].OneServer || s[1].BatchesPS < 35 {
		t.Errorf("fixed load %+v, growing load %+v", s[0], s[1])
	}
}

func TestFitScaleCPU(t *testing.T) {
	// CPU per hit = 2 µs + 3 µs × entries merged per hit of the cluster on
	// the flood rows; the hot rows, off that line, are not fitted.
	rows := []ScaleRow{}
	for i, x := range [][2]float64{{3, 300}, {10, 600}, {30, 950}, {3, 666}, {10, 900}, {30, 966}} {
		n := int(x[0])
		cpu := 2 + 3*mergedPerHit(n, x[1])
		if i < 3 {
			cpu *= 5
		}
		rows = append(rows, ScaleRow{Nodes: n, Load: []string{"hot", "flood"}[i/3],
			Before: &ScaleMetrics{Values: map[string]float64{mMerged: x[1], mCPU: cpu}},
			Model:  ScalePrediction{Merged: x[1]}})
	}
	fit := fitScaleCPU(rows)
	if fit == nil || math.Abs(fit.BaseUS-2) > 1e-3 || math.Abs(fit.PerEntryUS-3) > 1e-3 || fit.WorstResidual > 1e-3 || fit.Tree != "before" {
		t.Fatalf("fit %+v, want 2 µs + 3 µs per entry from the before tree, no residual", fit)
	}
	if want := 2 + 3*mergedPerHit(10, 900); math.Abs(rows[4].Model.CPUUS-want) > 0.01 {
		t.Errorf("flood, 10 nodes: model CPU %v, want %v", rows[4].Model.CPUUS, want)
	}
	if rows[1].Model.CPUUS != 0 {
		t.Errorf("hot, 10 nodes: model CPU %v, want none (the fit is the flood's)", rows[1].Model.CPUUS)
	}
}

func TestFitScaleCPUNeverBelowZero(t *testing.T) {
	// Noisy rows whose line crosses below the origin: the fit goes through
	// it instead, so no prediction is negative.
	rows := []ScaleRow{}
	for _, x := range [][3]float64{{3, 666, 1}, {10, 900, 20}, {30, 966, 60}} {
		rows = append(rows, ScaleRow{Nodes: int(x[0]), Load: "flood",
			Before:      &ScaleMetrics{Values: map[string]float64{mMerged: x[1], mCPU: x[2]}},
			ModelShares: ScalePrediction{Merged: 0}, Model: ScalePrediction{Merged: x[1]}})
	}
	fit := fitScaleCPU(rows)
	if fit == nil || fit.BaseUS != 0 || fit.PerEntryUS <= 0 {
		t.Fatalf("fit %+v, want a positive slope through the origin", fit)
	}
	for _, r := range rows {
		if r.Model.CPUUS <= 0 || r.ModelShares.CPUUS != 0 {
			t.Errorf("%d nodes: model CPU %v, shares %v", r.Nodes, r.Model.CPUUS, r.ModelShares.CPUUS)
		}
	}
}

// scaleResults is a fabricated run: the after tree's flood costs share
// of the before tree's bytes.
func scaleResults(share float64) *Results {
	tree := func(name string, flood float64) *ScaleTree {
		t := &ScaleTree{Tree: name, Ref: "fc56146", Commit: "fc56146e93ca8fdb28a07be6eb02e5698dcbfd64", Seconds: 37}
		for _, n := range scaleNodeCounts {
			for _, load := range []string{"hot", "flood"} {
				inB := 1000.0 * float64(n)
				if load == "flood" {
					inB = 10000 * flood
				}
				t.Rows = append(t.Rows, ScaleMetrics{Nodes: n, Load: load, Hits: 100000, Values: map[string]float64{
					mInB: inB, mOutB: inB / float64(n-1), mInMsgs: float64(n), mMerged: 100 * float64(n) * flood, mCPU: float64(n), mHits: 20000}})
			}
		}
		return t
	}
	s := &Scale{Benchtime: 100000, Command: "go test -bench ReplicationScale", Before: tree("before", 1), After: tree("after", share)}
	s.After.Ref = "this tree"
	s.NATS = &NATSCapacity{Runs: []NATSRun{{Fanout: 10, Size: 128, PublishedPS: 1e5, DeliveredPS: 1e6, ServerCPU: 0.5, PerDeliveryUS: 0.5}}, PerPublishUS: 0.5, PerDeliveryUS: 0.4}
	s.build()
	return &Results{Scale: s}
}

func TestScaleTargetAndReport(t *testing.T) {
	for _, c := range []struct {
		share float64
		met   bool
	}{{0.005, true}, {0.02, false}, {1, false}} {
		res := scaleResults(c.share)
		tg := scaleTarget(res)
		if tg.Met == nil || *tg.Met != c.met {
			t.Errorf("flood at %v of before: target %+v, want met=%v", c.share, tg, c.met)
			continue
		}
		if math.Abs(tg.Value-c.share) > 1e-9 {
			t.Errorf("flood at %v of before: value %v", c.share, tg.Value)
		}
		var b md
		writeScale(&b, res, res.Scale)
		report := b.String()
		for _, want := range []string{
			"| flood | 3 | before | 5000 (", "| flood | 30 | after |", "| hot | 10 | before | 1111 (",
			"| flood | 10 | **" + ratio(c.share, 1) + "** |",
			"a = 0.500 µs per message published, b = 0.400 µs per message delivered",
			"`fc56146e93ca8fdb28a07be6eb02e5698dcbfd64` (`--shares-baseline-ref fc56146`)",
		} {
			if !strings.Contains(report, want) {
				t.Errorf("flood at %v of before: the report lacks %q:\n%s", c.share, want, report)
			}
		}
		if len(res.Scale.Saturation) != 3 || !strings.Contains(report, "| every batch slot used") {
			t.Errorf("no saturation rows: %+v", res.Scale.Saturation)
		}
	}
	// Without a baseline there is nothing to judge.
	res := scaleResults(0.005)
	res.Scale.Before = &ScaleTree{Tree: "before", Ref: "nope", Error: "git rev-parse nope: unknown revision"}
	res.Scale.build()
	if tg := scaleTarget(res); tg.Met != nil || !strings.Contains(tg.Measured, "unknown revision") {
		t.Errorf("no baseline: target %+v, want not measured with the reason", tg)
	}
}

func TestNATSFanoutDeliversToEverySubscriber(t *testing.T) {
	srv := testnats.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run, err := natsFanout(ctx, srv.ClientURL(), os.Getpid(), 3, 64, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if run.PublishedPS <= 0 || run.Dropped != 0 {
		t.Fatalf("%+v: nothing published, or messages dropped", run)
	}
	// Each message reaches the three subscribers; the counts are read a
	// moment apart and the subscribers may lag the publisher a little.
	if r := run.DeliveredPS / run.PublishedPS; r < 2 || r > 3.5 {
		t.Errorf("%+v: %.2f deliveries per message published, want 3", run, r)
	}
	if run.ServerCPU <= 0 || run.PerDeliveryUS <= 0 {
		t.Errorf("%+v: no CPU measured for this process", run)
	}
}
