package replicate

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

func sampleMessages() []message {
	sent := int64(1_748_858_400_250) // 2025-06-02T10:00:00.250Z
	return []message{
		{
			header: header{Kind: kindBatch, Node: "node-a", Incarnation: 0xdeadbeefcafe, SentAtMS: sent, Seq: 7},
			Limits: []wireLimit{{Name: "activity_create", ScaleMS: 1000}, {Name: "inbound", ScaleMS: 60_000, Algorithm: counter.Sliding}},
			Entries: []entry{
				{Limit: 0, Window: sent / 1000, Key: "acme", Count: 42},
				{Limit: 1, Window: sent/60_000 - 1, Key: "channel-7", Count: 1},
				{Limit: 0, Window: sent/1000 + 1, Key: "", Count: counter.MaxCount},
			},
		},
		{header: header{Kind: kindSyncRequest, Node: "n", Incarnation: 1, SentAtMS: sent}},
		{
			header:  header{Kind: kindSyncReply, Node: "node-b", Incarnation: 2, SentAtMS: sent, Seq: 3, Last: true},
			Limits:  []wireLimit{{Name: "upload", ScaleMS: 1000}},
			Origins: []origin{{Node: "node-b", Incarnation: 2}, {Node: "node-c", Incarnation: 99}},
			Entries: []entry{
				{Limit: 0, Origin: 1, Window: sent / 1000, Key: "acme", Count: 5},
				{Limit: 0, Origin: 0, Window: sent / 1000, Key: "acme", Count: 6},
			},
		},
		{header: header{Kind: kindSyncReply, Node: "node-b", Incarnation: 2, SentAtMS: -5, Last: true}},
		{header: header{Kind: kindQuery, Node: "n", Incarnation: 1, SentAtMS: sent}, Body: `{"bucket":"upload"}`},
		{header: header{Kind: kindAnswer, Node: "m", Incarnation: 2, SentAtMS: sent}, Body: "\x00\xff"},
		{header: header{Kind: kindAnswer, Node: "m", Incarnation: 2, SentAtMS: sent}},
		{header: header{Kind: kindCast, Node: "m", Incarnation: 2, SentAtMS: sent, Seq: 9}, Body: "\x01\x00"},
	}
}

// normal makes nil and empty slices compare equal.
func normal(m message) message {
	if len(m.Limits) == 0 {
		m.Limits = nil
	}
	if len(m.Origins) == 0 {
		m.Origins = nil
	}
	if len(m.Entries) == 0 {
		m.Entries = nil
	}
	return m
}

func TestWireRoundTrip(t *testing.T) {
	var got message
	for i, m := range sampleMessages() {
		b := m.encode(nil)
		if err := decode(b, &got); err != nil {
			t.Fatalf("message %d: Decode: %v", i, err)
		}
		if !reflect.DeepEqual(normal(got), normal(m)) {
			t.Errorf("message %d:\n got %+v\nwant %+v", i, got, m)
		}
	}
}

func TestWireIsCompact(t *testing.T) {
	m := sampleMessages()[0]
	m.Limits = m.Limits[:1]
	m.Entries = []entry{{Window: m.SentAtMS / 1000, Key: "203.0.113.45", Count: 99}}
	one := len(m.encode(nil))
	for range 99 {
		m.Entries = append(m.Entries, m.Entries[0])
	}
	per := float64(len(m.encode(nil))-one) / 99
	// limit index, window offset, key length, 12-byte key, count.
	if per != 16 {
		t.Errorf("%.1f bytes per entry with an IPv4 key, want 16", per)
	}
}

func TestDecodeErrors(t *testing.T) {
	good := sampleMessages()[0].encode(nil)
	var m message
	// Every truncation fails; none panics.
	for n := range len(good) {
		if err := decode(good[:n], &m); !errors.Is(err, errMalformed) {
			t.Fatalf("truncated to %d bytes: err %v, want ErrMalformed", n, err)
		}
	}
	bad := func(mut func(b []byte) []byte) []byte { return mut(bytes.Clone(good)) }
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, errMalformed},
		{"no magic", bad(func(b []byte) []byte { b[0] = 'X'; return b }), errMalformed},
		{"newer version", bad(func(b []byte) []byte { b[2] = 2; return b }), errVersion},
		{"unknown kind", bad(func(b []byte) []byte { b[3] = 9; return b }), errMalformed},
		{"trailing bytes", append(bytes.Clone(good), 0), errMalformed},
		{"empty node", []byte{'R', 'L', 1, 2, 0}, errMalformed},
		{"huge entry count", func() []byte {
			m := message{header: header{Kind: kindBatch, Node: "n"}}
			b := m.encode(nil)
			return append(b[:len(b)-1], 0xff, 0xff, 0xff, 0xff, 0x0f) // 2^32−1 entries, no bytes
		}(), errMalformed},
		{"limit index out of range", func() []byte {
			b := appendHeader(nil, &header{Kind: kindBatch, Node: "n"})
			b = append(b, 1, 1, 'b', 1, 0)  // one limit: "b", 1 ms, fixed
			return append(b, 1, 1, 0, 0, 1) // one entry of limit 1
		}(), errMalformed},
		{"limit index in range", func() []byte {
			b := appendHeader(nil, &header{Kind: kindBatch, Node: "n"})
			b = append(b, 1, 1, 'b', 1, 0)
			return append(b, 1, 0, 0, 0, 1)
		}(), nil},
		{"scale 0", func() []byte {
			m := sampleMessages()[0]
			m.Limits[1].ScaleMS = 0
			m.Entries = m.Entries[:1]
			return m.encode(nil)
		}(), errMalformed},
		{"origin out of range", func() []byte {
			m := sampleMessages()[2]
			m.Entries[0].Origin = 2
			return m.encode(nil)
		}(), errMalformed},
		{"key too long", func() []byte {
			m := sampleMessages()[0]
			m.Entries[0].Key = strings.Repeat("k", maxKeyLen+1)
			return m.encode(nil)
		}(), errMalformed},
		{"unknown flags", func() []byte {
			m := sampleMessages()[3]
			b := m.encode(nil)
			b[len(b)-4] = 0x80 // flags byte precedes the three empty tables
			return b
		}(), errMalformed},
	}
	for _, tt := range tests {
		err := decode(tt.data, &m)
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
	}
}

// splitAll packs entries with a splitter of max bytes and decodes every
// message.
func splitAll(t *testing.T, h header, max int, entries []entry, limits []wireLimit, origins []origin) ([]message, []int) {
	t.Helper()
	var msgs []message
	var sizes []int
	sp := newSplitter(max, func(b []byte) error {
		var m message
		if err := decode(b, &m); err != nil {
			t.Fatalf("splitter wrote an undecodable message: %v", err)
		}
		msgs = append(msgs, m)
		sizes = append(sizes, len(b))
		return nil
	})
	sp.start(h)
	for _, e := range entries {
		var o origin
		if origins != nil {
			o = origins[e.Origin]
		}
		if err := sp.add(limits[e.Limit], o, e.Window, e.Key, e.Count); err != nil {
			t.Fatalf("add: %v", err)
		}
	}
	if err := sp.flush(h.Kind == kindSyncReply); err != nil {
		t.Fatal(err)
	}
	return msgs, sizes
}

func TestSplitterSplitsOnlyWhenNeeded(t *testing.T) {
	limits := []wireLimit{{Name: "inbound", ScaleMS: 1000}, {Name: "upload", ScaleMS: 60_000, Algorithm: counter.Sliding}}
	sent := int64(1_748_858_400_250)
	var entries []entry
	for i := range 1000 {
		l := i % 2
		entries = append(entries, entry{Limit: l, Window: sent / limits[l].ScaleMS, Key: fmt.Sprintf("key-%04d", i), Count: int64(i + 1)})
	}
	h := header{Kind: kindBatch, Node: "a", Incarnation: 1, SentAtMS: sent, Seq: 10}

	msgs, _ := splitAll(t, h, 1<<20, entries, limits, nil)
	if len(msgs) != 1 || len(msgs[0].Entries) != 1000 {
		t.Fatalf("1000 entries under 1 MiB: %d messages", len(msgs))
	}

	const max = 1500
	msgs, sizes := splitAll(t, h, max, entries, limits, nil)
	if len(msgs) < 8 {
		t.Fatalf("%d messages of ≤ %d bytes for 1000 entries", len(msgs), max)
	}
	n := 0
	for i, m := range msgs {
		if sizes[i] > max {
			t.Errorf("message %d: %d bytes > %d", i, sizes[i], max)
		}
		if i < len(msgs)-1 && sizes[i] < max-40 {
			t.Errorf("message %d: %d bytes, split too early", i, sizes[i])
		}
		if m.Seq != h.Seq+uint64(i) {
			t.Errorf("message %d: seq %d", i, m.Seq)
		}
		for _, e := range m.Entries {
			want := entries[n]
			if l := m.Limits[e.Limit]; l != limits[want.Limit] || e.Key != want.Key || e.Count != want.Count || e.Window != want.Window {
				t.Fatalf("entry %d: %+v (%+v), want %+v", n, e, l, want)
			}
			n++
		}
	}
	if n != len(entries) {
		t.Errorf("%d entries came through, want %d", n, len(entries))
	}
}

func TestSplitterSyncReplyChunks(t *testing.T) {
	limits := []wireLimit{{Name: "inbound", ScaleMS: 1000}}
	origins := []origin{{"a", 1}, {"b", 2}, {"c", 3}}
	var entries []entry
	for i := range 300 {
		entries = append(entries, entry{Origin: i % 3, Window: 5, Key: fmt.Sprint("k", i), Count: 1})
	}
	h := header{Kind: kindSyncReply, Node: "a", Incarnation: 1, SentAtMS: 5000}
	msgs, _ := splitAll(t, h, 1024, entries, limits, origins)
	for i, m := range msgs {
		if m.Seq != uint64(i) || m.Last != (i == len(msgs)-1) {
			t.Errorf("chunk %d: seq %d last %v", i, m.Seq, m.Last)
		}
		for _, e := range m.Entries {
			if o := m.Origins[e.Origin]; o.Node != origins[0].Node && o.Node != origins[1].Node && o.Node != origins[2].Node {
				t.Errorf("origin %+v", o)
			}
		}
	}
	// An empty reply is one last chunk.
	msgs, _ = splitAll(t, h, 1024, nil, limits, origins)
	if len(msgs) != 1 || !msgs[0].Last || len(msgs[0].Entries) != 0 {
		t.Errorf("empty reply: %+v", msgs)
	}
}

func TestSplitterEntryTooLarge(t *testing.T) {
	sp := newSplitter(64, func([]byte) error { return nil })
	sp.start(header{Kind: kindBatch, Node: "a"})
	if err := sp.add(wireLimit{Name: "b", ScaleMS: 1}, origin{}, 0, strings.Repeat("k", 100), 1); !errors.Is(err, errEntryTooLarge) {
		t.Errorf("err %v, want errEntryTooLarge", err)
	}
	if err := sp.add(wireLimit{Name: "b", ScaleMS: 1}, origin{}, 0, "k", 1); err != nil {
		t.Errorf("a small entry after a refused one: %v", err)
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to
// a message that decodes to the same thing.
func FuzzDecode(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(m.encode(nil))
	}
	f.Add([]byte("RL\x01\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m, again message
		if err := decode(data, &m); err != nil {
			if !errors.Is(err, errMalformed) && !errors.Is(err, errVersion) {
				t.Fatalf("error %v wraps neither ErrMalformed nor ErrVersion", err)
			}
			return
		}
		b := m.encode(nil)
		if err := decode(b, &again); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(normal(m), normal(again)) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, again)
		}
	})
}
