package rlsconfig_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// matchCases exercise every kind of lookup of the fuzz configuration.
var matchCases = []struct {
	name    string
	domain  string
	entries []*ratelimitv3.RateLimitDescriptor_Entry
}{
	{"exact", "test-domain", entries("key2", "value2")},
	{"key only", "test-domain", entries("key2", "something")},
	{"two levels", "test-domain", entries("key1", "value1", "subkey1", "subvalue1")},
	{"wildcard", "test-domain", entries("midWild", "bar123b")},
	{"nested wildcard", "test-domain", entries("nestedWild", "val1", "wild", "goo2")},
	{"share threshold", "share-threshold", entries("files", "files/a.pdf")},
	{"no match", "test-domain", entries("nokey", "x")},
	{"concurrency", "inflight", entries("tenant", "acme", "request_id", "r1")},
	{"concurrency, three levels", "inflight", entries("tenant", "acme", "route", "r", "request_id", "r1")},
	{"unknown domain", "nope", entries("key2", "value2")},
}

// fuzzConfig is the test configurations together.
func fuzzConfig(tb testing.TB) *rlsconfig.Config {
	tb.Helper()
	var files []rlsconfig.File
	for _, n := range []string{"basic_config.yaml", "wildcard.yaml", "share_threshold.yaml", "concurrency.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			tb.Fatal(err)
		}
		files = append(files, rlsconfig.File{Name: n, Data: b})
	}
	// basic_config and wildcard share their domain and no key.
	c, err := rlsconfig.Parse(files, rlsconfig.Options{MergeDomains: true})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Match allocates nothing when key has room.
func TestMatchDoesNotAllocate(t *testing.T) {
	c := fuzzConfig(t)
	key := make([]byte, 0, 256)
	for _, tc := range matchCases {
		allocs := testing.AllocsPerRun(100, func() {
			_, key, _ = c.Match(tc.domain, tc.entries, key[:0])
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Match", tc.name, allocs)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { key = rlsconfig.AppendKey(matchCases[2].entries, key[:0]) })
	if allocs != 0 {
		t.Errorf("AppendKey: %v allocations", allocs)
	}
}

func BenchmarkMatch(b *testing.B) {
	c := fuzzConfig(b)
	for _, tc := range matchCases {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			key := make([]byte, 0, 256)
			for b.Loop() {
				_, key, _ = c.Match(tc.domain, tc.entries, key[:0])
			}
		})
	}
}

func BenchmarkMatchParallel(b *testing.B) {
	c := fuzzConfig(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := make([]byte, 0, 256)
		i := 0
		for pb.Next() {
			tc := matchCases[i%len(matchCases)]
			_, key, _ = c.Match(tc.domain, tc.entries, key[:0])
			i++
		}
	})
}

// decodeEntries turns fuzz bytes into up to 4 entries: each key and value
// uvarint-length prefixed; a short input ends the list.
func decodeEntries(data []byte) []*ratelimitv3.RateLimitDescriptor_Entry {
	var out []*ratelimitv3.RateLimitDescriptor_Entry
	next := func() (string, bool) {
		n, w := binary.Uvarint(data)
		if w <= 0 || uint64(len(data)-w) < n {
			return "", false
		}
		s := string(data[w : w+int(n)])
		data = data[w+int(n):]
		return s, true
	}
	for len(out) < 4 {
		k, ok := next()
		if !ok {
			break
		}
		v, ok := next()
		if !ok {
			break
		}
		out = append(out, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return out
}

func encodeEntries(kv ...string) []byte {
	var b []byte
	for _, s := range kv {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// FuzzMatch: random entries against a fixed configuration never panic,
// allocate nothing beyond the key, and give one rule's descriptors
// distinct keys unless they differ only at share_threshold levels.
func FuzzMatch(f *testing.F) {
	c := fuzzConfig(f)
	for _, kv := range [][]string{
		{"key1", "value1", "subkey1", "x"},
		{"key1", "value1", "subkey1", "subvalue1"},
		{"key2", "value2"}, {"key2", ""}, {"key2", "\x00\xff"},
		{"midWild", "barb"}, {"multiWild", "foobarbaz"},
		{"nestedWild", "val1", "wild", "goo"},
		{"files", "files/a"}, {"files_no_share", "files_no_share/"},
		{"request_id", "r1"}, {"tenant", "acme", "request_id", "r1"},
		{"tenant", "acme", "route", "r", "request_id", "r1"},
		{"shared", "pool-a", "request_id", "r1"},
	} {
		f.Add("test-domain", encodeEntries(kv...), encodeEntries(kv...))
		f.Add("share-threshold", encodeEntries(kv...), encodeEntries(kv[:len(kv)-1]...))
	}
	f.Add("test-domain", encodeEntries("key1", "value1", "subkey1", "a"), encodeEntries("key1", "value1", "subkey1", "b"))
	f.Add("test-domain", encodeEntries("key2", "ab", "x", ""), encodeEntries("key2", "a", "bx", ""))
	f.Add("test-domain", encodeEntries("nestedWild", "val1", "wild", "goo1"), encodeEntries("nestedWild", "val1", "wild", "goo2"))
	f.Add("inflight", encodeEntries("tenant", "acme", "request_id", "r1"), encodeEntries("tenant", "acme", "request_id", "r2"))
	f.Add("inflight", encodeEntries("tenant", "ab", "route", "c", "request_id", "r1"), encodeEntries("tenant", "a", "route", "bc", "request_id", "r1"))
	key := make([]byte, 0, 1<<16)
	f.Fuzz(func(t *testing.T, domain string, a, b []byte) {
		ea, eb := decodeEntries(a), decodeEntries(b)
		ra, ka, fa := c.Match(domain, ea, nil)
		rb, kb, _ := c.Match(domain, eb, nil)
		if ra < -1 || ra >= len(c.Rules()) {
			t.Fatalf("rule %d of %d", ra, len(c.Rules()))
		}
		if fa != slices.Contains(c.Domains(), domain) {
			t.Fatalf("domainFound %v for %q", fa, domain)
		}
		if r2, k2, _ := c.Match(domain, ea, nil); r2 != ra || !bytes.Equal(k2, ka) {
			t.Fatal("Match is not deterministic")
		}
		if ra < 0 && len(ka) != 0 {
			t.Fatalf("no match, key %q", ka)
		}
		if ra >= 0 && ra == rb && bytes.Equal(ka, kb) && !sameModuloShare(c, domain, ea, eb) {
			t.Fatalf("%v and %v share rule %d and key %q", ea, eb, ra, ka)
		}
		if len(ka) <= cap(key) {
			if n := testing.AllocsPerRun(1, func() { _, key, _ = c.Match(domain, ea, key[:0]) }); n != 0 {
				t.Fatalf("%v allocations", n)
			}
		}
		if ra >= 0 || len(ea) == 0 {
			return
		}
		// AppendKey is injective over entry lists.
		if !equalEntries(ea, eb) && bytes.Equal(rlsconfig.AppendKey(ea, nil), rlsconfig.AppendKey(eb, nil)) {
			t.Fatalf("AppendKey: %v and %v give one key", ea, eb)
		}
	})
}

func equalEntries(a, b []*ratelimitv3.RateLimitDescriptor_Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].GetKey() != b[i].GetKey() || a[i].GetValue() != b[i].GetValue() {
			return false
		}
	}
	return true
}

// sameModuloShare: a and b are equal but for values at the
// share_threshold levels of the fuzz configuration (files: files/*,
// shared: pool-*) and for the request id, the last entry, of a
// concurrency rule.
func sameModuloShare(c *rlsconfig.Config, domain string, a, b []*ratelimitv3.RateLimitDescriptor_Entry) bool {
	if equalEntries(a, b) {
		return true
	}
	if domain == "share-threshold" && len(a) == 1 && len(b) == 1 && a[0].GetKey() == "files" && b[0].GetKey() == "files" {
		return true
	}
	if domain != "inflight" || len(a) != len(b) {
		return false
	}
	if r, _, _ := c.Match(domain, a, nil); r < 0 || !c.Rules()[r].Concurrency {
		return false
	}
	a, b = a[:len(a)-1], b[:len(b)-1]
	if len(a) > 0 && a[0].GetKey() == "shared" && b[0].GetKey() == "shared" {
		a, b = a[1:], b[1:]
	}
	return equalEntries(a, b)
}
