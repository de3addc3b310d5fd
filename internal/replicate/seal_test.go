package replicate

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var (
	keyA = bytes.Repeat([]byte{0xa1}, KeySize)
	keyB = bytes.Repeat([]byte{0xb2}, KeySize)
	keyC = bytes.Repeat([]byte{0xc3}, KeySize)
)

func mustSealer(t testing.TB, prefix string, keys ...[]byte) *sealer {
	t.Helper()
	s, err := newSealer(keys, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sampleWire(t testing.TB) []byte {
	t.Helper()
	m := sampleMessages()[0]
	return m.encode(nil)
}

func TestSealOpens(t *testing.T) {
	s := mustSealer(t, "ratelimit", keyA)
	msg := sampleWire(t)
	var ad []byte
	sealed := s.seal(nil, msg, kindBatch, &ad)
	if len(sealed) != len(msg)+sealOverhead {
		t.Errorf("sealed %d bytes for %d, want %d more", len(sealed), len(msg), sealOverhead)
	}
	if bytes.Contains(sealed, []byte("acme")) {
		t.Error("the sealed message shows a key in clear")
	}
	got, err := s.open(nil, sealed, kindBatch, &ad)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("open: %v", err)
	}
	// Two seals of one message differ (random nonce).
	if again := s.seal(nil, msg, kindBatch, &ad); bytes.Equal(again, sealed) {
		t.Error("two seals are identical")
	}
}

func TestOpenRefuses(t *testing.T) {
	s := mustSealer(t, "ratelimit", keyA)
	msg := sampleWire(t)
	var ad []byte
	sealed := s.seal(nil, msg, kindBatch, &ad)
	other := mustSealer(t, "ratelimit", keyB).seal(nil, msg, kindBatch, &ad)
	otherCluster := mustSealer(t, "other", keyA).seal(nil, msg, kindBatch, &ad)
	for _, c := range []struct {
		name string
		data []byte
		kind msgKind
		want error
	}{
		{"plain message", msg, kindBatch, errUnsealed},
		{"empty", nil, kindBatch, errUnsealed},
		{"another key", other, kindBatch, errUnknownKey},
		{"a batch opened as a sync reply", sealed, kindSyncReply, errUnauthentic},
		{"a batch opened as a sync request", sealed, kindSyncRequest, errUnauthentic},
		{"another cluster's prefix", otherCluster, kindBatch, errUnauthentic},
		{"header only", sealed[:sealedHeader], kindBatch, errUnauthentic},
		{"no tag", sealed[:len(sealed)-16], kindBatch, errUnauthentic},
		{"a byte more", append(bytes.Clone(sealed), 0), kindBatch, errUnauthentic},
	} {
		if _, err := s.open(nil, c.data, c.kind, &ad); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Every single bit flipped anywhere: refused, never opened.
	for i := range sealed {
		for bit := range 8 {
			d := bytes.Clone(sealed)
			d[i] ^= 1 << bit
			if _, err := s.open(nil, d, kindBatch, &ad); err == nil {
				t.Fatalf("opened with bit %d of byte %d flipped", bit, i)
			}
		}
	}
	// Every truncation: refused.
	for n := range len(sealed) {
		if _, err := s.open(nil, sealed[:n], kindBatch, &ad); err == nil {
			t.Fatalf("opened truncated to %d bytes", n)
		}
	}
}

// TestKeyRotation walks the documented rotation: every node goes from
// [old] to [old, new] to [new, old] to [new], one node at a time, and at
// each step every pair of nodes still reads the other.
func TestKeyRotation(t *testing.T) {
	steps := [][][]byte{{keyA}, {keyA, keyB}, {keyB, keyA}, {keyB}}
	msg := sampleWire(t)
	var ad []byte
	for i := 0; i+1 < len(steps); i++ {
		from, to := mustSealer(t, "p", steps[i]...), mustSealer(t, "p", steps[i+1]...)
		for _, pair := range [][2]*sealer{{from, to}, {to, from}} {
			if _, err := pair[1].open(nil, pair[0].seal(nil, msg, kindBatch, &ad), kindBatch, &ad); err != nil {
				t.Errorf("step %d→%d: %v", i, i+1, err)
			}
		}
	}
	// Skipping a step splits the cluster: [old] cannot read [new].
	if _, err := mustSealer(t, "p", keyA).open(nil, mustSealer(t, "p", keyB).seal(nil, msg, kindBatch, &ad), kindBatch, &ad); !errors.Is(err, errUnknownKey) {
		t.Errorf("old reads new: %v", err)
	}
}

func TestNewSealerRefuses(t *testing.T) {
	for _, keys := range [][][]byte{
		{keyA[:31]}, {append(bytes.Clone(keyA), 1)}, {keyA, keyB, keyC}, {keyA, keyA},
	} {
		if _, err := newSealer(keys, "p"); err == nil {
			t.Errorf("accepted %d keys of %d bytes", len(keys), len(keys[0]))
		}
	}
	if s, err := newSealer(nil, "p"); s != nil || err != nil {
		t.Errorf("no keys: %v, %v", s, err)
	}
}

func TestParseKey(t *testing.T) {
	hexKey := strings.Repeat("0f", 32)
	for _, ok := range []string{hexKey, strings.ToUpper(hexKey), " " + hexKey + "\n",
		"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
		"_-_-AwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="} {
		if k, err := ParseKey(ok); err != nil || len(k) != KeySize {
			t.Errorf("ParseKey(%q): %d bytes, %v", ok, len(k), err)
		}
	}
	for _, bad := range []string{"", "  ", hexKey[:62], hexKey + "00", "c2hvcnQ=", "not base64!", strings.Repeat("zz", 32)} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
	keys, err := ParseKeys("# rotation\n" + hexKey + "\n\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n")
	if err != nil || len(keys) != 2 {
		t.Errorf("ParseKeys: %d, %v", len(keys), err)
	}
}

func BenchmarkSealOpenPerEntry(b *testing.B) {
	s := mustSealer(b, "ratelimit", keyA)
	m := message{header: header{Kind: kindBatch, Node: "node-1", Incarnation: 1, SentAtMS: t0.UnixMilli()},
		Limits: []wireLimit{{Name: "activity_create", ScaleMS: 1000}}}
	for i := range benchBatch {
		m.Entries = append(m.Entries, entry{Window: t0.Unix(), Key: "tenant-" + strings.Repeat("x", i%8) + string(rune('a'+i%26)), Count: int64(i)})
	}
	msg := m.encode(nil)
	var ad, sealed, plain []byte
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for range b.N {
		sealed = s.seal(sealed[:0], msg, kindBatch, &ad)
		var err error
		if plain, err = s.open(plain[:0], sealed, kindBatch, &ad); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/entry")
}
