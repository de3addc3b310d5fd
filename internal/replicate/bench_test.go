package replicate

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// benchBatch is the size of a realistic batch: the keys one node changes
// in one sync interval under load.
const benchBatch = 1000

// BenchmarkPublishPerEntry: collect, encode (and seal) one interval's
// changes, per entry.
func BenchmarkPublishPerEntry(b *testing.B) {
	n := newNode(b, "a", benchConfig())
	keys := make([]string, benchBatch)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%06d", i)
	}
	big := counter.Limit{Limit: counter.MaxLimit, ScaleMS: 60_000}
	send := func([]byte) error { return nil }
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for _, k := range keys {
			n.store.Take(0, k, big, n.now)
		}
		b.StartTimer()
		n.r.pub.publishChanges(n.now, 1<<20, send, false)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/entry")
}

// BenchmarkReceivePerEntry: open (when sealed), decode, validate and merge
// one peer batch, per entry.
func BenchmarkReceivePerEntry(b *testing.B) {
	a, r := newNode(b, "a", benchConfig()), newNode(b, "b", benchConfig())
	big := counter.Limit{Limit: counter.MaxLimit, ScaleMS: 60_000}
	for i := range benchBatch {
		a.store.Take(0, fmt.Sprintf("tenant-%06d", i), big, a.now)
	}
	msgs := a.publish(b, 1<<20)
	if len(msgs) != 1 {
		b.Fatalf("%d messages, want 1", len(msgs))
	}
	msg := &nats.Msg{Subject: r.r.batchSubj, Data: msgs[0]}
	r.r.recv.onBatch(msg) // the keys exist from now on: steady state
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r.r.recv.onBatch(msg)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/entry")
}

// BenchmarkSyncRequestFlood: a raw NATS client floods a node that holds
// 100k live keys with sync requests whose timestamp is in the future;
// reported is the CPU time of the whole process (node, NATS server and
// client, all in process) per request. "forged": requests without the
// cluster key (any NATS client); "sealed": requests sealed with it (a
// compromised node, the worst case).
func BenchmarkSyncRequestFlood(b *testing.B) {
	for _, sealed := range []bool{false, true} {
		name := "forged"
		if sealed {
			name = "sealed"
		}
		b.Run(name, func(b *testing.B) { syncFlood(b, sealed) })
	}
}

func syncFlood(b *testing.B, sealed bool) {
	srv := testnats.Run(b)
	n := startLive(b, srv.ClientURL(), "victim", benchConfig(), nodeOpts{})
	n.waitReady(b)
	for i := range 100_000 {
		n.store.Take(0, fmt.Sprintf("tenant-%06d", i), long, time.Now())
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	req := (&message{header: header{Kind: kindSyncRequest, Node: "flood", Incarnation: 1, SentAtMS: time.Now().Add(10 * time.Second).UnixMilli()}}).encode(nil)
	if sealed {
		var ad []byte
		req = mustSealer(b, DefaultSubjectPrefix, benchKey).seal(nil, req, kindSyncRequest, &ad)
	}
	before := handledSyncRequests(b, n)
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		if err := nc.PublishRequest("ratelimit.sync", "_INBOX.flood", req); err != nil {
			b.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	poll.Until(b, 10*time.Minute, 10*time.Millisecond, func() error {
		if got := handledSyncRequests(b, n) - before; got < float64(b.N) {
			return fmt.Errorf("%v of %d requests handled", got, b.N)
		}
		return nil
	})
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/req")
	b.ReportMetric(cpu.Seconds(), "cpu-s")
	b.ReportMetric(metric(b, n.r.m.syncServed), "answered")
}

// cpuTime is the user + system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchKey seals the benchmarks' replication, as in production.
var benchKey = bytes.Repeat([]byte{0x5e}, KeySize)

func benchConfig() Config { return Config{Keys: [][]byte{benchKey}} }

// handledSyncRequests is how many sync requests the node has dealt with:
// answered, refused, or dropped unread.
func handledSyncRequests(t testing.TB, n *live) float64 {
	s := metric(t, n.r.m.syncServed)
	return s + sumReasons(t, n.r.m.syncRefused.reasons()) + sumReasons(t, n.r.m.malformed.reasons())
}
