package main

import (
	"math"
	"strings"
	"testing"
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
		if got := hot.Values[unit]; got != want {
			t.Errorf("hot %s = %v, want %v", unit, got, want)
		}
	}
	if got := flood.Values[mSyncB]; got != 22282 {
		t.Errorf("flood %s = %v, want 22282", mSyncB, got)
	}
	if got := flood.Values[mSlow]; got != 0 {
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

// scaleResults is a fabricated run whose floods with budget shares cost
// share of what they cost without.
func scaleResults(share float64) *Results {
	s := &Scale{Benchtime: 100000, Command: "go test -bench ReplicationScale", Seconds: 37}
	for _, load := range []string{"hot", "flood", "hot-noshares", "flood-noshares"} {
		for _, n := range []int{3, 10, 30} {
			inB := 1000.0 * float64(n)
			switch load {
			case "flood-noshares":
				inB = 10000
			case "flood":
				inB = 10000 * share
			}
			s.Rows = append(s.Rows, ScaleMetrics{Nodes: n, Load: load, Hits: 100000, Values: map[string]float64{
				mInB: inB, mOutB: inB / float64(n-1), mInMsgs: float64(n), mMerged: 100 * float64(n), mCPU: float64(n), mHits: 20000}})
		}
	}
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
		for _, want := range []string{"(37s)", "| hot | 10 | 1111 | 10000 | 10.00 |", "| flood | 30 | "} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("flood at %v of before: the report lacks %q:\n%s", c.share, want, b.String())
			}
		}
	}
	// A run without every node count's floods is not judged.
	res := scaleResults(0.005)
	res.Scale.Rows = res.Scale.Rows[:len(res.Scale.Rows)-1]
	if tg := scaleTarget(res); tg.Met != nil {
		t.Errorf("a flood row missing: target %+v, want not judged", tg)
	}
}

// FuzzParseScaleBench: any go test output is read or refused, never a
// panic, and every row read has a node count, a load and the figures
// the report needs.
func FuzzParseScaleBench(f *testing.F) {
	f.Add(scaleOutput)
	f.Add("BenchmarkReplicationScale/nodes=3/hot-2 100 1 out-B/node/1k-hits 1 in-B/node/1k-hits 1 in-msgs/node/1k-hits 1 merged/node/1k-hits 1 cpu-µs/hit 1 hits/s\n")
	f.Add("BenchmarkReplicationScale/nodes=99999999999999999999/x 1 NaN in-B/node/1k-hits\n")
	f.Fuzz(func(t *testing.T, out string) {
		rows, err := parseScaleBench(out)
		if err != nil {
			return
		}
		if len(rows) == 0 {
			t.Fatal("no rows and no error")
		}
		for _, m := range rows {
			if m.Nodes < 2 || m.Load == "" {
				t.Fatalf("row %+v", m)
			}
			for _, u := range []string{mOutB, mInB, mInMsgs, mMerged, mCPU, mHits} {
				if _, ok := m.Values[u]; !ok {
					t.Fatalf("row %+v lacks %s", m, u)
				}
			}
		}
	})
}
