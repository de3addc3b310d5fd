package replicate

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// BenchmarkReplicationScale measures what replication costs each node as
// the cluster grows: N nodes in this process, each with its own NATS
// connection, on one real nats-server; b.N hits spread evenly over the
// nodes, either over hotKeys hot keys at a steady hotRate hits/s of the
// whole cluster, each node cycling through all of them ("hot", against
// hotLimit: the cost is per sync interval, so per second), or each on a
// key never seen before, as fast as the nodes go ("flood": a botnet on a
// per-IP bucket, floodLimit; the cost is per hit). Reported, per node, after
// every batch has been received: the bytes and messages it publishes and
// receives and the entries it merges, per 1000 hits of the whole cluster
// and per second; and the process's CPU per hit (the nodes and the load;
// the NATS server runs apart). Each load runs with budget shares (the
// default) and without ("-noshares": every change replicated, as
// --budget-shares=false runs a cluster). Run it with a fixed count, e.g.
//
//	go test -run '^$' -bench ReplicationScale -benchtime 20000x ./internal/replicate/
func BenchmarkReplicationScale(b *testing.B) {
	for _, nodes := range []int{3, 10, 30} {
		for _, load := range []string{"hot", "flood", "hot-noshares", "flood-noshares"} {
			b.Run(fmt.Sprintf("nodes=%d/%s", nodes, load), func(b *testing.B) { replicationScale(b, nodes, load) })
		}
	}
}

// scaleNode is one node of the scale benchmark and what its connection
// carried.
type scaleNode struct {
	*live
	nc        atomic.Pointer[nats.Conn]
	outBytes  atomic.Int64 // every message published
	syncBytes atomic.Int64 // of which sync replies (to one requester each)
	outMsgs   atomic.Int64 // batches published
	baseOut   [2]int64     // bytes, messages
	baseSync  int64
	baseMerge float64
	baseSent  float64
	baseAE    float64
	baseSlow  float64
}

// The hot load: hotRate hits per second over the whole cluster, spread
// over hotKeys keys, so hotRate/hotKeys = 200 hits per key per second.
const (
	hotRate = 20_000
	hotKeys = 100
)

// hotLimit is a per-tenant limit that the hot load approaches without
// reaching it: 200 hits per 1 s window is 80% of 250, so every hit is
// admitted (the load is the same whatever the admission rule) while each
// key spends the last part of every window past half its limit, and each
// node near its share of it: a hot key keeps replicating under any rule
// that replicates keys close to their limit.
var hotLimit = counter.Limit{Limit: 250, ScaleMS: 1000}

// floodLimit is a per-client-IP limit as deployed: 100 per minute. Each
// flood key is hit once, far from it.
var floodLimit = counter.Limit{Limit: 100, ScaleMS: 60_000}

func replicationScale(b *testing.B, nodes int, load string) {
	load, noShares := strings.CutSuffix(load, "-noshares")
	srv := testnats.StartProcess(b)
	ns := make([]*scaleNode, nodes)
	for i := range ns {
		sn := &scaleNode{}
		cfg := Config{SyncInterval: 100 * time.Millisecond, MaxPeers: 64, SyncAnswersPerSecond: 1000, SubjectPrefix: "scale"}
		if noShares {
			cfg.ShareDelay = -1
		}
		sn.live = startLive(b, srv.URL(), "n"+strconv.Itoa(i), cfg, nodeOpts{hooks: hooks{
			send: func(nc *nats.Conn, subj string, data []byte) error {
				sn.nc.Store(nc)
				sn.outBytes.Add(int64(len(subj) + len(data)))
				if subj == "scale.batch" {
					sn.outMsgs.Add(1)
				} else {
					sn.syncBytes.Add(int64(len(subj) + len(data)))
				}
				return nc.Publish(subj, data)
			},
		}})
		ns[i] = sn
	}
	for _, n := range ns {
		n.waitReady(b)
	}
	// Every node has published (a heartbeat at least) and so holds its
	// connection, and the warm-start sync requests have been answered (no
	// node handled one for 1.5 s: an answer may wait up to a second for a
	// fresh snapshot, and a node's requests are answered one at a time):
	// what follows is the steady state.
	handled := func() (sum float64) {
		for _, n := range ns {
			if n.nc.Load() == nil {
				return -1
			}
			sum += handledSyncRequests(b, n.live)
		}
		return sum
	}
	last, since := handled(), time.Now()
	poll.UntilTrue(b, waitLong, step, func() bool {
		if h := handled(); h < 0 || h != last {
			last, since = h, time.Now()
		}
		return last >= 0 && time.Since(since) > 1500*time.Millisecond
	})
	for _, n := range ns {
		n.baseOut = [2]int64{n.outBytes.Load(), n.outMsgs.Load()}
		n.baseSync = n.syncBytes.Load()
		n.baseMerge = metric(b, n.r.m.entriesMerged)
		n.baseSent = metric(b, n.r.m.entriesSent)
		n.baseAE = metric(b, n.r.m.antiEntropy)
		n.baseSlow = metric(b, n.r.m.slowConsumer)
	}
	var ru0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Go(func() {
			var key []byte
			for h := i; h < b.N; h += nodes {
				if due := start.Add(time.Duration(h) * time.Second / hotRate); load == "hot" && time.Until(due) > time.Millisecond {
					time.Sleep(time.Until(due))
				}
				key = key[:0]
				lim := floodLimit
				if load == "hot" {
					// This node's j-th hit, j = h/nodes: every node goes
					// round all the keys whatever the node count.
					key = strconv.AppendInt(append(key, "hot-"...), int64((h/nodes+i)%hotKeys), 10)
					lim = hotLimit
				} else {
					key = strconv.AppendInt(append(key, "ip-"...), int64(h), 10)
				}
				n.store.Take(0, string(key), lim, time.Now())
			}
		})
	}
	wg.Wait()
	elapsed := b.Elapsed()
	// Every change published and received: each node's peers merged what
	// it sent (entries a peer already had merge as no-ops, so the wait is
	// on what was received). A message's entries count as received before
	// they merge, so the wait ends only once the merges have stopped
	// changing for mergeSettle as well.
	const mergeSettle = 200 * time.Millisecond
	lastMerged, settled := -1.0, time.Now()
	poll.UntilTrue(b, waitLong, 10*time.Millisecond, func() bool {
		for _, n := range ns {
			if n.r.pub.pending() > 0 {
				return false
			}
		}
		var sent, merged float64
		for _, n := range ns {
			sent += metric(b, n.r.m.entriesSent)
			merged += metric(b, n.r.m.entriesMerged)
		}
		for _, n := range ns {
			if metric(b, n.r.m.entriesReceived) < sent-metric(b, n.r.m.entriesSent) {
				return false
			}
		}
		if merged != lastMerged {
			lastMerged, settled = merged, time.Now()
			return false
		}
		return time.Since(settled) >= mergeSettle
	})
	b.StopTimer()
	var ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	// Batches go to every other node (no echo); sync replies to one.
	var batchB, batchM, syncB, merged, sent, ae, slow float64
	for _, n := range ns {
		slow += metric(b, n.r.m.slowConsumer) - n.baseSlow
		syncB += float64(n.syncBytes.Load() - n.baseSync)
		batchB += float64(n.outBytes.Load()-n.baseOut[0]) - float64(n.syncBytes.Load()-n.baseSync)
		batchM += float64(n.outMsgs.Load() - n.baseOut[1])
		merged += metric(b, n.r.m.entriesMerged) - n.baseMerge
		sent += metric(b, n.r.m.entriesSent) - n.baseSent
		ae += metric(b, n.r.m.antiEntropy) - n.baseAE
	}
	inB := batchB * float64(nodes-1)            // over all nodes
	per := float64(nodes) * float64(b.N) / 1000 // node × thousand hits
	b.ReportMetric(batchB/per, "out-B/node/1k-hits")
	b.ReportMetric(inB/per, "in-B/node/1k-hits")
	b.ReportMetric(batchM*float64(nodes-1)/per, "in-msgs/node/1k-hits")
	b.ReportMetric(merged/per, "merged/node/1k-hits")
	b.ReportMetric(sent/per, "sent-entries/node/1k-hits")
	b.ReportMetric(ae/per, "ae-entries/node/1k-hits")
	b.ReportMetric(syncB/per, "sync-B/node/1k-hits")
	secs := float64(nodes) * elapsed.Seconds() // node × seconds of load
	b.ReportMetric(batchB/secs, "out-B/node/s")
	b.ReportMetric(inB/secs, "in-B/node/s")
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/hit")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "hits/s")
	// Each is followed by a resync: sync-B above.
	b.ReportMetric(slow, "slow-consumer-events")
	b.ReportMetric(0, "ns/op") // the figure of interest is per node, above
}
