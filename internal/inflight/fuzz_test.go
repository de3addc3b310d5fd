package inflight

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

func sampleBodies() []body {
	return []body{
		{Kind: kindGauges, Buckets: []string{"db_pool", "jobs"}, Entries: []wireEntry{
			{Bucket: 0, Key: "tenant-a", N: 3}, {Bucket: 1, Key: "", N: 0}, {Bucket: 0, Key: "#0123", N: counter.MaxLimit},
		}},
		{Kind: kindReleases, Buckets: []string{"db_pool"}, Entries: []wireEntry{
			{Bucket: 0, Key: "tenant-a", ID: "0f8fad5b-d9cb-469f-a165-70867728950e"},
		}},
		{Kind: kindGauges},
	}
}

// FuzzReceive: whatever a peer casts, decoded and applied to a table,
// never panics, keeps no more keys than the table's bound, and frees only
// leases whose request id, bucket and key it names.
func FuzzReceive(f *testing.F) {
	for _, b := range sampleBodies() {
		f.Add(b.encode(nil))
	}
	f.Add([]byte{kindGauges, 1, 1, 'x', 0x80})
	f.Add([]byte{kindReleases, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		tb, err := New(Config{Shards: 1, MaxKeys: 8, MaxPeersPerKey: 2})
		if err != nil {
			t.Fatal(err)
		}
		tb.Acquire(1, "tenant-a", "held", 1<<20, time.Hour, t0)
		s, err := NewSync(tb, nil, SyncConfig{Now: func() time.Time { return t0 }}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		s.SetBuckets(map[string]counter.Bucket{"db_pool": 1, "jobs": 2, "x": 3})
		s.Receive(7, data)
		s.Receive(8, data)
		var m body
		_ = decodeBody(data, &m)
		if st := tb.Stats(); st.Keys > 8 {
			t.Fatalf("%d keys, bound 8", st.Keys)
		}
		if l, _ := tb.InFlight(1, "tenant-a"); l != 1 && !(m.Kind == kindReleases && containsRelease(&m, "held")) {
			t.Fatalf("the lease was freed by %q", data)
		}
	})
}

func containsRelease(m *body, id string) bool {
	for _, e := range m.Entries {
		if e.ID == id && m.Buckets[e.Bucket] == "db_pool" && e.Key == "tenant-a" {
			return true
		}
	}
	return false
}

func TestBodyRoundTrip(t *testing.T) {
	for _, b := range sampleBodies() {
		var got body
		if err := decodeBody(b.encode(nil), &got); err != nil {
			t.Fatalf("%+v: %v", b, err)
		}
		if got.Kind != b.Kind || len(got.Entries) != len(b.Entries) || len(got.Buckets) != len(b.Buckets) {
			t.Fatalf("got %+v, want %+v", got, b)
		}
		for i := range b.Entries {
			if got.Entries[i] != b.Entries[i] {
				t.Fatalf("entry %d: got %+v, want %+v", i, got.Entries[i], b.Entries[i])
			}
		}
	}
}

func TestMalformedBodies(t *testing.T) {
	good := sampleBodies()[0].encode(nil)
	for name, data := range map[string][]byte{
		"empty":          {},
		"unknown kind":   {3, 0, 0},
		"truncated":      good[:len(good)-1],
		"trailing":       append(append([]byte{}, good...), 0),
		"bucket index":   (&body{Kind: kindGauges, Buckets: []string{"a"}, Entries: []wireEntry{{Bucket: 1}}}).encode(nil),
		"empty name":     {kindGauges, 1, 0, 0},
		"huge count":     {kindGauges, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"count too high": (&body{Kind: kindGauges, Buckets: []string{"a"}, Entries: []wireEntry{{Key: "k", N: counter.MaxLimit + 1}}}).encode(nil),
		"empty id":       (&body{Kind: kindReleases, Buckets: []string{"a"}, Entries: []wireEntry{{Key: "k"}}}).encode(nil),
	} {
		var m body
		if err := decodeBody(data, &m); err == nil {
			t.Errorf("%s: %q decoded", name, data)
		}
	}
}

// TestPackerSplitsBodies: gauges over several bodies each fit the
// bound and together carry every entry.
func TestPackerSplitsBodies(t *testing.T) {
	var got []wireEntry
	p := &packer{max: 64}
	p.emit = func(b []byte) {
		if len(b) > 64 {
			t.Fatalf("a body of %d bytes, bound 64", len(b))
		}
		var m body
		if err := decodeBody(b, &m); err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Entries...)
	}
	p.start(kindGauges)
	for i := range 20 {
		if !p.add("bucket", wireEntry{Key: string(rune('a' + i)), N: int64(i)}) {
			t.Fatal("an entry did not fit")
		}
	}
	if p.add("bucket", wireEntry{Key: string(make([]byte, 100))}) {
		t.Fatal("an entry larger than a body was packed")
	}
	p.flush()
	if len(got) != 20 || got[19].N != 19 {
		t.Fatalf("got %+v", got)
	}
}
