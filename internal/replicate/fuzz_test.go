package replicate

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// fuzzBuckets: bucket 0 counts in 1 s windows up to 400, bucket 1 in 1 s
// and 1 min windows up to 2000.
func fuzzBuckets() []Bucket {
	return bounded(map[int64]int64{1000: 400}, map[int64]int64{1000: 2000, 60_000: 2000})
}

func fuzzSeeds(f *testing.F) {
	for _, m := range sampleMessages() {
		m.SentAtMS = t0.UnixMilli()
		for i := range m.Entries {
			m.Entries[i].Window = counter.WindowOf(t0.UnixMilli(), m.Limits[m.Entries[i].Limit].ScaleMS)
		}
		f.Add(m.encode(nil))
	}
	f.Add(enc(forged("\xff\xff", 1, t0, "victim", 100))) // a node id that is not UTF-8
	f.Add(enc(forged("a", 1, t0, "victim", counter.MaxCount)))
	f.Add([]byte("RL\x01\x01"))
	f.Add([]byte{})
}

// FuzzMerge: whatever arrives on the batch, sync and reply subjects,
// decoded and merged into a store, never panics, never stores more keys
// than the store's bound, and never a count above the bucket's bound.
func FuzzMerge(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		store, err := counter.New(counter.Config{Track: true, MaxKeys: 64, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		bs := fuzzBuckets()
		n := newNodeWith(t, "b", Config{Buckets: bs}, nodeOpts{
			store: store,
			hooks: hooks{send: func(*nats.Conn, string, []byte) error { return nil }},
		})
		nc := &nats.Conn{} // never connected: replies are sized by MaxMessageBytes
		n.r.guard("batch", n.r.recv.onBatch)(&nats.Msg{Data: data})
		n.r.guard("sync request", func(m *nats.Msg) { n.r.syncer.onRequest(nc, m) })(&nats.Msg{Data: data, Reply: "_INBOX.x"})
		var m message
		var buf rxBuffers
		if n.r.read(data, &m, kindSyncReply, &buf, n.now) {
			n.r.syncer.mergeReply(&m, n.now)
		}
		if got := metric(t, n.r.m.panics); got != 0 {
			t.Fatalf("%v panics recovered", got)
		}
		if store.Len() > 64 {
			t.Fatalf("%d keys stored, bound 64", store.Len())
		}
		for _, pc := range store.LiveCounts(nil, n.now) {
			if int(pc.Bucket) >= len(bs) {
				t.Fatalf("stored %+v: no such bucket", pc)
			}
			bound, ok := bs[pc.Bucket].Bounds[pc.ScaleMS]
			if !ok || pc.Count > bound {
				t.Fatalf("stored %+v: bound %d, %v", pc, bound, ok)
			}
		}
	})
}

// FuzzOpen: opening arbitrary bytes as a sealed message never panics and
// never succeeds without the key; a sealed seed opens to what was sealed.
func FuzzOpen(f *testing.F) {
	s := mustSealer(f, "ratelimit", keyA, keyB)
	var ad []byte
	for _, m := range sampleMessages() {
		f.Add(s.seal(nil, m.encode(nil), m.Kind, &ad), uint8(m.Kind))
	}
	f.Add([]byte("RS\x01"), uint8(1))
	f.Add([]byte("RS\x02xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		var ad []byte
		plain, err := s.open(nil, data, msgKind(kind), &ad)
		if err != nil {
			return
		}
		// It opened: it was sealed with a key of s (only the seeds are);
		// what it holds must still pass decode before any use.
		var m message
		_ = decode(plain, &m)
	})
}
