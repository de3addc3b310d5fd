package top_test

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// FuzzHitKeys: any key, of any length or bytes, is kept in at most
// MaxKeyBytes, read back as itself when it fits, and counted exactly once.
func FuzzHitKeys(f *testing.F) {
	for _, s := range []string{"", "a", "tenant-42", "\x00\xff<script>", string(make([]byte, 300)), "é" + string(make([]byte, 40))} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, key string, n uint8) {
		s, err := top.New(top.Config{MaxKeyBytes: 32, Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		hit(s, 0, key, false, t0)
		s.Hit(0, key, int64(n), true, t0.UnixMilli()/1000, 1000, t0.UnixMilli())
		got := s.Read(0, t0, 0).Minute
		if len(got.TopDenied) != 1 || got.Denied != 1 || got.TopDenied[0].Hits != 1 {
			t.Fatalf("key %q: denied %+v", key, got)
		}
		k := got.TopDenied[0].Key
		if len(k) > 32 || (len(key) <= 32 && k != key) {
			t.Fatalf("key %q kept as %q", key, k)
		}
		if n > 0 && (len(got.TopAdmitted) != 1 || got.TopAdmitted[0].Key != k || got.Admitted != uint64(n)) {
			t.Fatalf("key %q: admitted %+v", key, got)
		}
	})
}
