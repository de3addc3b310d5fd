package checkwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The bounds the tests decode with: rls's defaults.
const testMaxDescriptors, testMaxEntries = 64, 32

// rateLimitView renders what a decision reads of m, at most maxD+1
// descriptors and maxE+1 entries a descriptor (what the decoder keeps).
func rateLimitView(m *rlsv3.RateLimitRequest, maxD, maxE int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain %q hits %d", m.GetDomain(), m.GetHitsAddend())
	for i, d := range m.GetDescriptors() {
		if i > maxD {
			break
		}
		fmt.Fprintf(&b, "\n[")
		for j, e := range d.GetEntries() {
			if j > maxE {
				break
			}
			fmt.Fprintf(&b, " %q=%q", e.GetKey(), e.GetValue())
		}
		fmt.Fprintf(&b, " ]")
		if l := d.GetLimit(); l != nil {
			fmt.Fprintf(&b, " limit %d/%d", l.GetRequestsPerUnit(), l.GetUnit())
		}
		if h := d.GetHitsAddend(); h != nil {
			fmt.Fprintf(&b, " hits %d", h.GetValue())
		}
		if d.GetIsNegativeHits() {
			fmt.Fprintf(&b, " negative")
		}
	}
	return b.String()
}

// compareRateLimit decodes b both ways and fails t when they disagree: on
// whether b is a RateLimitRequest at all, or on anything a decision
// reads. It returns whether b was accepted.
func compareRateLimit(t testing.TB, d *RateLimitDecoder, r *RateLimitRequest, b []byte) bool {
	t.Helper()
	var m rlsv3.RateLimitRequest
	refErr := proto.Unmarshal(b, &m)
	err := d.Decode(b, r)
	defer r.Reset()
	if (refErr == nil) != (err == nil) {
		t.Fatalf("proto.Unmarshal: %v; Decode: %v (input %x)", refErr, err, b)
	}
	if err != nil {
		return false
	}
	got, want := rateLimitView(r.Message(), d.maxDescriptors, d.maxEntries), rateLimitView(&m, d.maxDescriptors, d.maxEntries)
	if got != want {
		t.Fatalf("Decode:\n%s\nproto.Unmarshal:\n%s\n(input %x)", got, want, b)
	}
	return true
}

// Wire-form builders of envoy.service.ratelimit.v3.RateLimitRequest.
func rlReq(f ...[]byte) []byte   { return cat(f...) }
func rlDesc(f ...[]byte) []byte  { return fld(2, cat(f...)) }
func rlEntry(k, v string) []byte { return fld(1, cat(str(1, k), str(2, v))) }
func rlLimit(f ...[]byte) []byte { return fld(2, cat(f...)) }
func rlHits(f ...[]byte) []byte  { return fld(3, cat(f...)) }
func group(num protowire.Number, f ...[]byte) []byte {
	return cat(protowire.AppendTag(nil, num, protowire.StartGroupType), cat(f...), protowire.AppendTag(nil, num, protowire.EndGroupType))
}

// envoyRateLimitRequest is a request as Envoy's ratelimit filter sends it
// for the shipped configuration: a tenant's descriptor and a per-IP one.
func envoyRateLimitRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}, {Key: "path", Value: "/api/activities"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.23"}}},
	}}
}

// rateLimitSeeds are inputs of every shape the decoder distinguishes.
func rateLimitSeeds(t testing.TB) map[string][]byte {
	bad := "\xff\xfe"
	many := func(n int, part []byte) []byte { return bytes.Repeat(part, n) }
	return map[string][]byte{
		"Envoy's request": marshal(t, envoyRateLimitRequest()),
		"every field": marshal(t, &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {}},
			Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: wrapperspb.UInt32(3)},
			HitsAddend: wrapperspb.UInt64(math.MaxUint64), IsNegativeHits: true,
		}, {HitsAddend: wrapperspb.UInt64(0)}, {}}}),
		"empty":                               nil,
		"domain twice: the last":              rlReq(str(1, "a"), str(1, "b")),
		"domain of the wrong wire type":       rlReq(str(1, "a"), varint(1, 5)),
		"domain not UTF-8":                    rlReq(str(1, bad)),
		"hits of the wrong wire type":         rlReq(varint(3, 4), str(3, "x")),
		"hits beyond uint32":                  rlReq(varint(3, 1<<32+5)),
		"descriptors of the wrong wire type":  rlReq(varint(2, 1), rlDesc(rlEntry("k", "v"))),
		"empty descriptor":                    rlReq(rlDesc()),
		"entry key not UTF-8":                 rlReq(rlDesc(rlEntry(bad, "v"))),
		"entry value not UTF-8":               rlReq(rlDesc(rlEntry("k", bad))),
		"entry key twice, value missing":      rlReq(rlDesc(fld(1, cat(str(1, "a"), str(1, "b"))))),
		"entry fields of the wrong wire type": rlReq(rlDesc(fld(1, cat(str(1, "a"), varint(1, 3), varint(2, 1), str(2, "v"))))),
		"entries of the wrong wire type":      rlReq(rlDesc(varint(1, 2), rlEntry("k", "v"))),
		"limit merged":                        rlReq(rlDesc(rlLimit(varint(1, 5), varint(2, 3)), rlEntry("k", "v"), rlLimit(varint(1, 9)))),
		"limit zeroed by a later zero":        rlReq(rlDesc(rlLimit(varint(1, 5)), rlLimit(varint(1, 0)))),
		"limit unit beyond int32":             rlReq(rlDesc(rlLimit(varint(2, 1<<40|4)))),
		"limit unit negative":                 rlReq(rlDesc(rlLimit(varint(2, math.MaxUint64)))),
		"limit multiplier":                    rlReq(rlDesc(rlLimit(fld(3, varint(1, 3))))),
		"limit multiplier malformed":          rlReq(rlDesc(rlLimit(fld(3, []byte{0x08})))),
		"limit of the wrong wire type":        rlReq(rlDesc(varint(2, 1))),
		"limit rpu of the wrong wire type":    rlReq(rlDesc(rlLimit(str(1, "x")))),
		"hits merged":                         rlReq(rlDesc(rlHits(varint(1, 5)), rlHits())),
		"hits present but empty":              rlReq(rlDesc(rlHits())),
		"hits value of the wrong wire type":   rlReq(rlDesc(rlHits(str(1, "x")))),
		"hits value overflowing":              rlReq(rlDesc(rlHits(protowire.AppendTag(nil, 1, protowire.VarintType), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}))),
		"negative hits flag":                  rlReq(rlDesc(varint(4, 1))),
		"negative hits flag as bytes":         rlReq(rlDesc(str(4, "x"))),
		"unknown fields of every wire type": rlReq(varint(99, 1), protowire.AppendFixed32(protowire.AppendTag(nil, 98, protowire.Fixed32Type), 1),
			protowire.AppendFixed64(protowire.AppendTag(nil, 97, protowire.Fixed64Type), 1), str(96, bad), group(95, varint(1, 1)),
			rlDesc(str(9, bad), group(8), fld(1, cat(varint(7, 1), str(3, bad), str(1, "k"))))),
		"groups in place of messages":     rlReq(group(2, varint(1, 1)), rlDesc(group(1), group(2), group(3))),
		"truncated":                       marshal(t, envoyRateLimitRequest())[:20],
		"truncated varint":                {0x18, 0x80},
		"length past the end":             {0x0a, 0x05, 'a'},
		"entry length past the end":       rlReq(fld(2, []byte{0x0a, 0x04, 0x0a})),
		"end group at the top":            protowire.AppendTag(nil, 5, protowire.EndGroupType),
		"end group in a descriptor":       rlReq(rlDesc(protowire.AppendTag(nil, 5, protowire.EndGroupType))),
		"end group in an entry":           rlReq(rlDesc(fld(1, protowire.AppendTag(nil, 5, protowire.EndGroupType)))),
		"unbalanced group":                rlReq(protowire.AppendTag(nil, 5, protowire.StartGroupType)),
		"field number 0":                  {0x02, 0x00},
		"field number too large":          protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3),
		"descriptors over the bound":      rlReq(str(1, "d"), many(testMaxDescriptors+5, rlDesc(rlEntry("k", "v")))),
		"entries over the bound":          rlReq(rlDesc(many(testMaxEntries+5, rlEntry("k", "v")))),
		"a bad entry past the bound":      rlReq(rlDesc(many(testMaxEntries+2, rlEntry("k", "v")), rlEntry("k", bad))),
		"a bad descriptor past the bound": rlReq(many(testMaxDescriptors+2, rlDesc()), rlDesc(rlEntry("k", bad))),
	}
}

// The decoder accepts and rejects what proto.Unmarshal does and reads the
// same values, the pools reused from one request to the next.
func TestDecodeRateLimitMatchesProtoUnmarshal(t *testing.T) {
	d := NewRateLimitDecoder(testMaxDescriptors, testMaxEntries)
	var r RateLimitRequest
	rejected := map[string]bool{}
	for name, in := range rateLimitSeeds(t) {
		t.Run(name, func(t *testing.T) {
			if !compareRateLimit(t, d, &r, in) {
				rejected[name] = true
			}
		})
	}
	// The cases are only worth comparing if both outcomes occur.
	for _, name := range []string{"domain not UTF-8", "entry value not UTF-8", "truncated", "end group in an entry", "a bad entry past the bound", "a bad descriptor past the bound", "hits value overflowing", "limit multiplier malformed"} {
		if !rejected[name] {
			t.Errorf("%s: accepted", name)
		}
	}
	if rejected["Envoy's request"] || rejected["unknown fields of every wire type"] {
		t.Error("a valid request rejected")
	}
}

func TestDecodeRateLimitValues(t *testing.T) {
	d := NewRateLimitDecoder(testMaxDescriptors, testMaxEntries)
	var r RateLimitRequest
	in := rlReq(str(1, "d"), varint(3, 1<<32+5), rlDesc(rlEntry("k", "v"), rlLimit(varint(1, 5), varint(2, 3)), rlLimit(varint(1, 9)), rlHits(varint(1, 7)), varint(4, 2)))
	if err := d.Decode(in, &r); err != nil {
		t.Fatal(err)
	}
	m := r.Message()
	desc := m.Descriptors[0]
	if m.Domain != "d" || m.HitsAddend != 5 || len(m.Descriptors) != 1 || desc.Entries[0].Key != "k" || desc.Entries[0].Value != "v" ||
		desc.Limit.RequestsPerUnit != 9 || desc.Limit.Unit != 3 || desc.HitsAddend.Value != 7 || !desc.IsNegativeHits {
		t.Errorf("%v", m)
	}
	if !within(m.Domain, in) || !within(desc.Entries[0].Value, in) {
		t.Error("strings are not views into the input")
	}
	r.Reset()
	if m.Domain != "" || desc.Entries != nil && len(desc.Entries) != 0 || desc.Limit != nil || desc.IsNegativeHits || m.Descriptors != nil {
		t.Errorf("Reset kept %v", m)
	}
}

func TestDecodeRateLimitKeepsTheBounds(t *testing.T) {
	d := NewRateLimitDecoder(2, 3)
	var r RateLimitRequest
	many := func(n int, part []byte) []byte { return bytes.Repeat(part, n) }
	if err := d.Decode(rlReq(many(10, rlDesc(many(10, rlEntry("k", "v"))))), &r); err != nil {
		t.Fatal(err)
	}
	m := r.Message()
	if len(m.Descriptors) != 3 {
		t.Fatalf("kept %d descriptors, want 3", len(m.Descriptors))
	}
	for _, desc := range m.Descriptors {
		if len(desc.Entries) != 4 {
			t.Fatalf("kept %d entries, want 4", len(desc.Entries))
		}
	}
}

func TestDecodeRateLimitErrors(t *testing.T) {
	d := NewRateLimitDecoder(testMaxDescriptors, testMaxEntries)
	var r RateLimitRequest
	for _, tc := range []struct {
		in   []byte
		want error
	}{
		{rlReq(rlDesc(rlEntry("k", "\xff"))), ErrInvalidUTF8},
		{[]byte{0x0a, 0x05, 'a'}, ErrMalformed},
		{rlReq(rlDesc(protowire.AppendTag(nil, 5, protowire.EndGroupType))), ErrMalformed},
	} {
		if err := d.Decode(tc.in, &r); !errors.Is(err, tc.want) {
			t.Errorf("Decode(%x) = %v, want %v", tc.in, err, tc.want)
		}
	}
}

// A reused RateLimitRequest decodes without allocating.
func TestDecodeRateLimitAllocations(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	d := NewRateLimitDecoder(testMaxDescriptors, testMaxEntries)
	in := marshal(t, envoyRateLimitRequest())
	var r RateLimitRequest
	if a := testing.AllocsPerRun(100, func() {
		if err := d.Decode(in, &r); err != nil {
			t.Fatal(err)
		}
		r.Reset()
	}); a != 0 {
		t.Errorf("%v allocations per decode, want 0", a)
	}
}

// A request near the bounds leaves at most maxPooled parts of each kind
// in the pools.
func TestDecodeRateLimitPoolsBounded(t *testing.T) {
	d := NewRateLimitDecoder(testMaxDescriptors, testMaxEntries)
	var r RateLimitRequest
	if err := d.Decode(rlReq(bytes.Repeat(rlDesc(bytes.Repeat(rlEntry("k", "v"), testMaxEntries)), testMaxDescriptors)), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.entries) <= maxPooled {
		t.Fatalf("%d entries: the test wants more than %d", len(r.entries), maxPooled)
	}
	r.Reset()
	if len(r.entries) > maxPooled || cap(r.entries) > maxPooled || len(r.descs) > maxPooled {
		t.Errorf("kept %d entries (room for %d), %d descriptors", len(r.entries), cap(r.entries), len(r.descs))
	}
}

func rateLimitResponses() map[string]*rlsv3.RateLimitResponse {
	limit := &rlsv3.RateLimitResponse_RateLimit{Name: "per-tenant", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	return map[string]*rlsv3.RateLimitResponse{
		"empty": {},
		"allowed": {OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: limit, LimitRemaining: 99, DurationUntilReset: durationpb.New(60e9)},
			{Code: rlsv3.RateLimitResponse_OK},
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32},
		}},
		"denied with headers": {OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, UnitMultiplier: wrapperspb.UInt32(30)}, DurationUntilReset: &durationpb.Duration{Seconds: 30}},
		}, ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Limit", Value: "7"}, {Key: "RateLimit-Remaining", Value: "0"}, {Key: "RateLimit-Reset", Value: "30"}, {Key: "x-empty"}}},
		"odd values": {OverallCode: -1, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: 99, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: -3, UnitMultiplier: wrapperspb.UInt32(0)}, DurationUntilReset: &durationpb.Duration{Seconds: -5, Nanos: -7}},
			{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{}, DurationUntilReset: &durationpb.Duration{}},
		}},
	}
}

// The hand encoder writes what the deterministic marshaller writes, in the
// gRPC frame.
func TestAppendRateLimitResponseMatchesProtoMarshal(t *testing.T) {
	for name, m := range rateLimitResponses() {
		if !rateLimitEncodable(m) {
			t.Fatalf("%s: not encodable by hand", name)
		}
		got, err := AppendRateLimitResponse([]byte("xy"), m)
		if err != nil {
			t.Fatal(err)
		}
		want := marshal(t, m)
		if !bytes.Equal(got[:2], []byte("xy")) || got[2] != 0 || binary.BigEndian.Uint32(got[3:7]) != uint32(len(want)) || !bytes.Equal(got[7:], want) {
			t.Errorf("%s:\n got %x\nwant xy 00 %08x %x", name, got, len(want), want)
		}
	}
}

// What the hand encoder does not write takes the standard marshaller, with
// the same bytes.
func TestAppendRateLimitResponseFallsBack(t *testing.T) {
	unknownFields := &rlsv3.RateLimitResponse{}
	unknownFields.ProtoReflect().SetUnknown(varint(99, 1))
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	st.ProtoReflect().SetUnknown(varint(99, 1))
	for name, m := range map[string]*rlsv3.RateLimitResponse{
		"unknown fields":        unknownFields,
		"unknown status fields": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st}},
		"request headers":       {RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "a", Value: "b"}}},
		"raw body":              {RawBody: []byte("x")},
		"metadata":              {DynamicMetadata: &structpb.Struct{}},
		"quota":                 {Quota: &rlsv3.RateLimitResponse_Quota{Requests: 1}},
		"status quota":          {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		"header raw value":      {ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "a", RawValue: []byte("b")}}},
		"header key not UTF-8":  {ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "\xff"}}},
		"limit name not UTF-8":  {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "\xff"}}}},
	} {
		if rateLimitEncodable(m) {
			t.Errorf("%s: encodable by hand", name)
			continue
		}
		got, gerr := AppendRateLimitResponse(nil, m)
		want, werr := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if (gerr == nil) != (werr == nil) || (gerr == nil && !bytes.Equal(got[5:], want)) {
			t.Errorf("%s: got %x, %v; proto.Marshal %x, %v", name, got, gerr, want, werr)
		}
	}
}

// An encodable response is appended without allocating into a buffer
// with room.
func TestAppendRateLimitResponseAllocations(t *testing.T) {
	m := rateLimitResponses()["denied with headers"]
	buf := make([]byte, 0, 1024)
	if a := testing.AllocsPerRun(100, func() {
		if _, err := AppendRateLimitResponse(buf[:0], m); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("%v allocations per response, want 0", a)
	}
}

// FuzzRateLimitRequest: the decoder and proto.Unmarshal agree on every
// input, on acceptance and on what a decision reads; strings are views
// into the input.
func FuzzRateLimitRequest(f *testing.F) {
	for _, in := range rateLimitSeeds(f) {
		f.Add(in)
	}
	d := NewRateLimitDecoder(4, 4) // small bounds, so the fuzzer reaches them
	var r RateLimitRequest
	f.Fuzz(func(t *testing.T, in []byte) {
		if !compareRateLimit(t, d, &r, in) {
			return
		}
		if err := d.Decode(in, &r); err != nil {
			t.Fatal(err)
		}
		defer r.Reset()
		m := r.Message()
		if !within(m.Domain, in) {
			t.Fatalf("domain %q is not inside the input", m.Domain)
		}
		for _, desc := range m.Descriptors {
			for _, e := range desc.Entries {
				if !within(e.Key, in) || !within(e.Value, in) {
					t.Fatalf("entry %q=%q is not inside the input", e.Key, e.Value)
				}
			}
		}
	})
}
