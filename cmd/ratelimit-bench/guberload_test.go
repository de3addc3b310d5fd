package main

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The request carries one RateLimitReq per descriptor, with the rls
// load's keys and the limit given, in gubernator's field numbers.
func TestGuberRequestEncodesTheRLSKeys(t *testing.T) {
	b := guberRequest(request{route: "activities", path: "/v1/x", clientIP: "10.0.0.1", headers: map[string]string{"x-tenant-id": "t1"}}, 3, 7, 2*time.Second)
	type req struct {
		name, key             string
		hits, limit, duration uint64
	}
	var got []req
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			t.Fatalf("field %d type %d (n %d): want requests (1, bytes)", num, typ, n)
		}
		b = b[n:]
		m, n := protowire.ConsumeBytes(b)
		if n < 0 {
			t.Fatal("truncated RateLimitReq")
		}
		b = b[n:]
		var r req
		for len(m) > 0 {
			num, typ, n := protowire.ConsumeTag(m)
			m = m[n:]
			switch {
			case typ == protowire.BytesType:
				v, n := protowire.ConsumeBytes(m)
				m = m[n:]
				if num == 1 {
					r.name = string(v)
				} else if num == 2 {
					r.key = string(v)
				}
			case typ == protowire.VarintType:
				v, n := protowire.ConsumeVarint(m)
				m = m[n:]
				switch num {
				case 3:
					r.hits = v
				case 4:
					r.limit = v
				case 5:
					r.duration = v
				}
			default:
				t.Fatalf("field %d: unexpected type %d", num, typ)
			}
		}
		got = append(got, r)
	}
	want := []req{
		{"bench_remote_address", "10.0.0.1", 1, 7, 2000},
		{"bench_generic_key", "activities_t1", 1, 7, 2000},
		{"bench_path", "/v1/x", 1, 7, 2000},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d requests, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestGuberStatus(t *testing.T) {
	resp := func(status uint64, errMsg string) []byte {
		var m []byte
		if status != 0 {
			m = protowire.AppendTag(m, 1, protowire.VarintType)
			m = protowire.AppendVarint(m, status)
		}
		m = protowire.AppendTag(m, 2, protowire.VarintType)
		m = protowire.AppendVarint(m, 5)
		if errMsg != "" {
			m = protowire.AppendTag(m, 5, protowire.BytesType)
			m = protowire.AppendString(m, errMsg)
		}
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		return protowire.AppendBytes(b, m)
	}
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	for _, c := range []struct {
		name    string
		in      []byte
		want    int32
		wantErr bool
	}{
		{"empty", nil, 0, false},
		{"under", resp(0, ""), 0, false},
		{"over", resp(1, ""), 1, false},
		{"one of three over", cat(resp(0, ""), resp(1, ""), resp(0, "")), 1, false},
		{"error", resp(0, "no peer"), 0, true},
		{"truncated", resp(1, "")[:3], 0, true},
	} {
		got, err := guberStatus(c.in)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s: %d, %v; want %d, error %v", c.name, got, err, c.want, c.wantErr)
		}
	}
}

// FuzzGuberStatus: any answer is read as under (0), over (1) or an error,
// never a panic.
func FuzzGuberStatus(f *testing.F) {
	var over []byte
	over = protowire.AppendTag(over, 1, protowire.VarintType)
	over = protowire.AppendVarint(over, 1)
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, over)
	f.Add(b)
	f.Add([]byte{0x0a, 0x02, 0x2a, 0x00})
	f.Add([]byte{0x0a, 0x80})
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := guberStatus(in)
		if err == nil && got != 0 && got != 1 {
			t.Fatalf("status %d", got)
		}
	})
}
