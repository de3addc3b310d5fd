package checkwire

import (
	"testing"
	"unsafe"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// within reports whether s lies inside b.
func within(s string, b []byte) bool {
	if s == "" {
		return true
	}
	p, start := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p+uintptr(len(s)) <= start+uintptr(len(b))
}

func addSeeds(f *testing.F) {
	f.Add(marshal(f, envoyRequest()))
	f.Add(cat(req(http(str(2, "GET"), str(4, "/a"), header("x-tenant-id", "a"))), req(http(str(4, "/b"), header("x-tenant-id", "b")))))
	f.Add(req(source(socket(str(2, "192.0.2.1")), fld(2, str(1, "/run/x")), socket(varint(3, 80)))))
	f.Add(req(ext(checkreq.ExtBuckets, "a,b"), ext(checkreq.ExtRoute, "r"), http(fld(12, []byte("raw")), str(11, "body"))))
	f.Add(req(http(fld(3, entry(varint(1, 7), str(1, "x-tenant-id"), str(2, "t"), str(2, "u"))))))
	f.Add(req(http(header("x-tenant-id", "\xff"))))
	f.Add(nest(40))
	f.Add([]byte{0x0a, 0x05, 0x01})
}

// FuzzDecode: Decode never panics, reads nothing outside its input (every
// string is a view into it) and keeps only the named headers, each once.
// (TestDecodeHostile and TestDecodeViews guard the allocations.)
func FuzzDecode(f *testing.F) {
	addSeeds(f)
	d := NewDecoder(testNames, true)
	f.Fuzz(func(t *testing.T, in []byte) {
		var r checkreq.Request
		if err := d.Decode(in, &r); err != nil {
			return
		}
		for _, s := range []string{r.Method, r.Path, r.PeerAddress, r.Body} {
			if !within(s, in) {
				t.Fatalf("%q is not inside the input", s)
			}
		}
		if len(r.Headers) > len(testNames) || len(r.ContextExtensions) > 2 {
			t.Fatalf("kept %d headers, %d extensions", len(r.Headers), len(r.ContextExtensions))
		}
		seen := map[string]bool{}
		for _, h := range r.Headers {
			if seen[h.Name] || !within(h.Value, in) {
				t.Fatalf("header %q twice or not a view", h.Name)
			}
			seen[h.Name] = true
		}
	})
}
