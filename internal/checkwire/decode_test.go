package checkwire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// Wire-form builders. Field numbers of envoy.service.auth.v3 and
// envoy.config.core.v3.
func fld(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
}
func str(num protowire.Number, s string) []byte { return fld(num, []byte(s)) }
func varint(num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
}
func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func req(attrs ...[]byte) []byte   { return fld(1, cat(attrs...)) }
func http(f ...[]byte) []byte      { return fld(4, fld(2, cat(f...))) } // attributes.request.http
func source(addr ...[]byte) []byte { return fld(1, fld(1, cat(addr...))) }
func socket(f ...[]byte) []byte    { return fld(1, cat(f...)) }
func entry(f ...[]byte) []byte     { return cat(f...) }
func header(k, v string) []byte    { return fld(3, cat(str(1, k), str(2, v))) }
func ext(k, v string) []byte       { return fld(10, cat(str(1, k), str(2, v))) }

func TestDecodeMatchesProtoUnmarshal(t *testing.T) {
	d := NewDecoder(testNames, true)
	noBody := NewDecoder(testNames, false)
	bad := "\xff\xfe"
	for _, tc := range []struct {
		name   string
		in     []byte
		accept bool
		check  func(*testing.T, *checkreq.Request)
	}{
		{name: "Envoy's request", in: marshal(t, envoyRequest()), accept: true, check: func(t *testing.T, r *checkreq.Request) {
			if r.Method != "POST" || r.Path != "/api/activities?page=2" || r.PeerAddress != "10.0.3.7" || r.Headers.Value("x-tenant-id") != "acme" || len(r.Headers) != 5 {
				t.Errorf("%+v", r)
			}
		}},
		{name: "empty", in: nil, accept: true},
		{name: "merged messages: last scalar wins", in: cat(req(http(str(2, "GET"), str(4, "/a"))), req(http(str(4, "/b")))), accept: true, check: func(t *testing.T, r *checkreq.Request) {
			if r.Method != "GET" || r.Path != "/b" {
				t.Errorf("%+v", r)
			}
		}},
		{name: "repeated header: last wins", in: req(http(header("x-tenant-id", "a"), header("x-tenant-id", "b"))), accept: true, check: func(t *testing.T, r *checkreq.Request) {
			if r.Headers.Value("x-tenant-id") != "b" || len(r.Headers) != 1 {
				t.Errorf("%+v", r.Headers)
			}
		}},
		{name: "entry without value", in: req(http(fld(3, str(1, "x-tenant-id")))), accept: true},
		{name: "entry without key", in: req(http(fld(3, str(2, "v")))), accept: true},
		{name: "entry with its key twice", in: req(http(fld(3, entry(str(1, "x-other"), str(1, "x-tenant-id"), str(2, "t"))))), accept: true},
		{name: "entry key of the wrong wire type", in: req(http(fld(3, entry(varint(1, 7), str(2, "t"))))), accept: true},
		{name: "entry with unknown fields", in: req(http(fld(3, entry(str(1, "x-tenant-id"), varint(3, 1), str(9, "x"), str(2, "t"))))), accept: true},
		{name: "headers of the wrong wire type", in: req(http(varint(3, 1))), accept: true},
		{name: "method of the wrong wire type keeps the earlier", in: req(http(str(2, "PUT"), varint(2, 5))), accept: true},
		{name: "http of the wrong wire type", in: req(fld(4, varint(2, 1))), accept: true},
		{name: "socket then pipe: no peer", in: req(source(socket(str(2, "192.0.2.1")), fld(2, str(1, "/run/x")))), accept: true},
		{name: "pipe then socket", in: req(source(fld(2, str(1, "/run/x")), socket(str(2, "192.0.2.2")))), accept: true},
		{name: "socket, pipe, socket without address", in: req(source(socket(str(2, "192.0.2.1")), fld(2, nil), socket(varint(3, 80)))), accept: true},
		{name: "socket merged", in: req(source(socket(str(2, "192.0.2.1"))), source(socket(varint(3, 80)))), accept: true},
		{name: "internal address clears", in: req(source(socket(str(2, "192.0.2.1")), fld(3, str(1, "l")))), accept: true},
		{name: "pipe of the wrong wire type changes nothing", in: req(source(socket(str(2, "192.0.2.1")), varint(2, 1))), accept: true},
		{name: "destination is not the peer", in: req(fld(2, fld(1, socket(str(2, "192.0.2.9"))))), accept: true},
		{name: "context extensions", in: req(ext(checkreq.ExtBuckets, "a,b"), ext("other", "x"), ext(checkreq.ExtRoute, "r"), ext(checkreq.ExtRoute, "s")), accept: true},
		{name: "body and raw body", in: req(http(fld(12, []byte("raw")), str(11, "text"))), accept: true},
		{name: "raw body only, not UTF-8", in: req(http(fld(12, []byte(bad)))), accept: true},
		{name: "unknown fields of every wire type", in: req(varint(99, 1), protowire.AppendFixed32(protowire.AppendTag(nil, 98, protowire.Fixed32Type), 1),
			protowire.AppendFixed64(protowire.AppendTag(nil, 97, protowire.Fixed64Type), 1), str(96, bad),
			cat(protowire.AppendTag(nil, 95, protowire.StartGroupType), varint(1, 1), protowire.AppendTag(nil, 95, protowire.EndGroupType))), accept: true},

		{name: "invalid UTF-8 in a kept header", in: req(http(header("x-tenant-id", bad)))},
		{name: "invalid UTF-8 in a skipped header", in: req(http(header("x-other", bad)))},
		{name: "invalid UTF-8 in a header name", in: req(http(header(bad, "v")))},
		{name: "invalid UTF-8 in the host", in: req(http(str(5, bad)))},
		{name: "invalid UTF-8 in the body", in: req(http(str(11, bad)))},
		{name: "invalid UTF-8 in the destination principal", in: req(fld(2, str(4, bad)))},
		{name: "invalid UTF-8 deep in metadata", in: req(fld(11, fld(1, cat(str(1, "ns"), fld(2, fld(1, cat(str(1, "k"), fld(2, str(3, bad)))))))))},
		{name: "invalid UTF-8 in a header_map value", in: req(http(fld(13, fld(1, cat(str(1, "k"), str(2, bad))))))},
		{name: "truncated varint", in: cat(req(http(str(2, "GET"))), []byte{0x08, 0x80})},
		{name: "truncated tag", in: []byte{0x80}},
		{name: "length past the end", in: []byte{0x0a, 0x05, 0x01}},
		{name: "nested length past its parent", in: req(fld(4, []byte{0x12, 0x7f, 0x00}))},
		{name: "field number 0", in: []byte{0x02, 0x00}},
		{name: "field number past the maximum", in: protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3|2), 0)},
		{name: "reserved wire type", in: []byte{0x0e}},
		{name: "stray end of group", in: req([]byte{0x0c})},
		{name: "unbalanced group", in: req(protowire.AppendTag(nil, 50, protowire.StartGroupType))},
		{name: "group closed by another number", in: req(protowire.AppendTag(nil, 50, protowire.StartGroupType), protowire.AppendTag(nil, 51, protowire.EndGroupType))},
		{name: "bad map entry", in: req(http(fld(3, []byte{0x0a, 0x09})))},
		{name: "bad unknown field in a skipped message", in: req(fld(2, []byte{0x80}))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, dec := range []*Decoder{d, noBody} {
				if got := compare(t, dec, tc.in); got != tc.accept {
					t.Fatalf("accepted %v, want %v", got, tc.accept)
				}
			}
			if tc.check != nil {
				var r checkreq.Request
				if err := d.Decode(tc.in, &r); err != nil {
					t.Fatal(err)
				}
				tc.check(t, &r)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	d := NewDecoder(testNames, true)
	var r checkreq.Request
	for _, tc := range []struct {
		in   []byte
		want error
	}{
		{[]byte{0x0a, 0x05}, ErrMalformed},
		{req(http(str(4, "\xc0"))), ErrInvalidUTF8},
		{nest(recursionLimit), ErrTooDeep},
	} {
		if err := d.Decode(tc.in, &r); !errors.Is(err, tc.want) {
			t.Errorf("Decode(%.20x…) = %v, want %v", tc.in, err, tc.want)
		}
	}
}

// nest is a request whose metadata holds a Struct nested levels deep
// (each level a map entry, a Value and a Struct), built outside in so
// that deep nesting costs linear time.
func nest(levels int) []byte {
	// size[i]: the encoded Struct of nesting i (0: empty).
	size := make([]int, levels+1)
	entryLen := func(i int) int { // Struct.fields entry {k: Value{struct_value: Struct(i-1)}}
		value := 1 + protowire.SizeVarint(uint64(size[i-1])) + size[i-1]
		return 3 + 1 + protowire.SizeVarint(uint64(value)) + value
	}
	for i := 1; i <= levels; i++ {
		e := entryLen(i)
		size[i] = 1 + protowire.SizeVarint(uint64(e)) + e
	}
	b := make([]byte, 0, size[levels])
	for i := levels; i >= 1; i-- {
		e := entryLen(i)
		value := 1 + protowire.SizeVarint(uint64(size[i-1])) + size[i-1]
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.BytesType), uint64(e))
		b = append(b, str(1, "k")...)
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(value))
		b = protowire.AppendVarint(protowire.AppendTag(b, 5, protowire.BytesType), uint64(size[i-1]))
	}
	return req(fld(11, fld(1, cat(str(1, "ns"), fld(2, b)))))
}

// The protobuf runtime's nesting bound, at its edge: both paths accept the
// deepest message it accepts and refuse one level more.
func TestDecodeDepthBound(t *testing.T) {
	d := NewDecoder(testNames, false)
	lo, hi := 1, recursionLimit
	accepts := func(n int) bool { return compare(t, d, nest(n)) }
	if !accepts(lo) || accepts(hi) {
		t.Fatalf("depth %d accepted %v, %d accepted %v", lo, accepts(lo), hi, accepts(hi))
	}
	for hi-lo > 1 { // find the edge; compare checks both agree at every step
		mid := (lo + hi) / 2
		if accepts(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	t.Logf("deepest accepted Struct nesting: %d levels", lo)
	// Unknown groups nest under their own bound.
	for _, n := range []int{protowire.DefaultRecursionLimit - 1, protowire.DefaultRecursionLimit, protowire.DefaultRecursionLimit + 1, 100000} {
		var b []byte
		for i := 0; i < n; i++ {
			b = protowire.AppendTag(b, 60, protowire.StartGroupType)
		}
		for i := 0; i < n; i++ {
			b = protowire.AppendTag(b, 60, protowire.EndGroupType)
		}
		compare(t, d, req(b))
	}
}

// Hostile requests of the sizes the gRPC port admits (4 MiB) decode
// without allocating, and keep only what the decision reads.
func TestDecodeHostile(t *testing.T) {
	d := NewDecoder(testNames, false)
	many := func(n int, h func(i int) []byte) []byte {
		var b []byte
		for i := 0; i < n; i++ {
			b = append(b, h(i)...)
		}
		return req(http(b))
	}
	big := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name  string
		in    []byte
		kept  int
		valid bool
	}{
		{"100k headers", many(100_000, func(i int) []byte { return header("x-h-"+strings.Repeat("z", i%20), "value-of-some-length") }), 0, true},
		{"one 1 MiB header", req(http(header("x-tenant-id", big))), 1, true},
		{"one header repeated 10k times", many(10_000, func(i int) []byte { return header("x-tenant-id", "t") }), 1, true},
		{"a 1 MiB body nobody reads", req(http(str(11, big))), 0, true},
		{"deep unknown groups", req(bytes.Repeat(protowire.AppendTag(nil, 60, protowire.StartGroupType), 1<<20)), 0, false},
		{"lengths past the end, everywhere", bytes.Repeat([]byte{0x0a, 0xff, 0xff, 0xff, 0x7f}, 1000), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("%d bytes", len(tc.in))
			if got := compare(t, d, tc.in); got != tc.valid {
				t.Fatalf("accepted %v, want %v", got, tc.valid)
			}
			var r checkreq.Request
			err := d.Decode(tc.in, &r)
			if len(r.Headers) != tc.kept {
				t.Errorf("kept %d headers, want %d", len(r.Headers), tc.kept)
			}
			if r.Body != "" {
				t.Error("a body nobody reads was kept")
			}
			if n := testing.AllocsPerRun(5, func() { d.Decode(tc.in, &r) }); n != 0 && err == nil {
				t.Errorf("%v allocations per decode", n)
			}
		})
	}
}

// The strings of a decoded Request are views into the input: nothing is
// copied, so a body the rules read costs no copy either.
func TestDecodeViews(t *testing.T) {
	d := NewDecoder(testNames, true)
	in := marshal(t, envoyRequest())
	in = append(in, req(http(str(11, strings.Repeat("b", 4096))))...)
	var r checkreq.Request
	if err := d.Decode(in, &r); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{r.Method, r.Path, r.PeerAddress, r.Body, r.Headers.Value("x-tenant-id")} {
		if !within(s, in) {
			t.Errorf("%.20q is not a view into the input", s)
		}
	}
	if n := testing.AllocsPerRun(100, func() { d.Decode(in, &r) }); n != 0 {
		t.Errorf("Decode allocates %v times", n)
	}
}
