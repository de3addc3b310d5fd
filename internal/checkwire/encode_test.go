package checkwire

import (
	"bytes"
	"math"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func hvo(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

func responses() map[string]*authv3.CheckResponse {
	meta, _ := structpb.NewStruct(map[string]any{
		"ip": "192.0.2.1", "account": "", "route": "admin_login", "z": nil, "n": 0.0, "neg": -1.5, "t": true, "f": false,
		"failures": map[string]any{"login_ip": "192.0.2.1", "login_account": []any{"a@b", "c@d", 3.0, map[string]any{}}},
		"e":        map[string]any{}, "l": []any{},
	})
	return map[string]*authv3.CheckResponse{
		"empty":       {},
		"bare allow":  {Status: &rpcstatus.Status{}},
		"negative":    {Status: &rpcstatus.Status{Code: -7, Message: "m"}},
		"allow":       {Status: &rpcstatus.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: []*corev3.HeaderValueOption{hvo("ratelimit-policy", `"a";q=100;w=1`), hvo("ratelimit", `"a";r=99;t=1`)}}}},
		"empty ok":    {HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}},
		"login allow": {Status: &rpcstatus.Status{}, DynamicMetadata: meta},
		"denied": {Status: &rpcstatus.Status{Code: 8, Message: "rate limited"}, HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: []*corev3.HeaderValueOption{hvo("retry-after", "1"), hvo("content-type", "application/json"), {Header: &corev3.HeaderValue{Key: "x-empty"}, KeepEmptyValue: true}},
			Body:    `{"error":"rate_limited"}` + "\n",
		}}, DynamicMetadata: meta},
		"denied, empty status": {HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{Status: &typev3.HttpStatus{}}}},
		"big body":             {HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{Body: string(bytes.Repeat([]byte("x"), 5000))}}},
		"nan":                  {DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(math.NaN())}}},
	}
}

// The hand encoder writes what the deterministic marshaller writes, and
// says how long it is beforehand.
func TestEncodeMatchesProtoMarshal(t *testing.T) {
	for name, m := range responses() {
		if !Encodable(m) {
			t.Fatalf("%s: not encodable by hand", name)
		}
		got := AppendResponse(nil, m)
		if want := marshal(t, m); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", name, got, want)
		}
		if n := ResponseSize(m); n != len(got) {
			t.Errorf("%s: ResponseSize %d, encoded %d bytes", name, n, len(got))
		}
	}
}

// Anything else is left to the standard encoder, and still round-trips
// (AppendGRPC falls back to it).
func TestEncodeFallsBack(t *testing.T) {
	withUnknown := &authv3.CheckResponse{}
	withUnknown.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01})
	many := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := 0; i < maxSortedEntries+1; i++ {
		many.Fields[string(rune('a'+i))] = structpb.NewBoolValue(true)
	}
	detail, _ := anypb.New(wrapperspb.String("d"))
	for name, m := range map[string]*authv3.CheckResponse{
		"unknown fields":  withUnknown,
		"status details":  {Status: &rpcstatus.Status{Details: []*anypb.Any{detail}}},
		"error response":  {HttpResponse: &authv3.CheckResponse_ErrorResponse{ErrorResponse: &authv3.DeniedHttpResponse{Body: "e"}}},
		"ok headers":      {HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{hvo("a", "b")}}}},
		"raw value":       {HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "a", RawValue: []byte("b")}}}}}},
		"append":          {HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "a"}, Append: wrapperspb.Bool(true)}}}}},
		"large map":       {DynamicMetadata: many},
		"value with none": {DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"x": {}}}},
	} {
		if Encodable(m) {
			t.Fatalf("%s: encodable by hand", name)
		}
		got, err := Message(m).AppendGRPC(nil)
		if err != nil {
			t.Fatal(err)
		}
		var back authv3.CheckResponse
		if err := proto.Unmarshal(got[5:], &back); err != nil || !proto.Equal(&back, m) {
			t.Errorf("%s: round trip %v: %v", name, err, &back)
		}
	}
}

// A string that is not valid UTF-8, anywhere the hand encoder writes one,
// is left to the standard encoder, which refuses it as proto.Marshal does.
func TestEncodeRefusesInvalidUTF8(t *testing.T) {
	denied := func(d *authv3.DeniedHttpResponse) *authv3.CheckResponse {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: 8}, HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: d}}
	}
	for name, m := range map[string]*authv3.CheckResponse{
		"status message": {Status: &rpcstatus.Status{Message: "\xff"}},
		"body":           denied(&authv3.DeniedHttpResponse{Body: "\xff"}),
		"header key":     denied(&authv3.DeniedHttpResponse{Headers: []*corev3.HeaderValueOption{hvo("\xfe", "v")}}),
		"header value":   denied(&authv3.DeniedHttpResponse{Headers: []*corev3.HeaderValueOption{hvo("k", "\xfe")}}),
		"ok header":      {HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: []*corev3.HeaderValueOption{hvo("k", "\xfe")}}}},
		"metadata key":   {DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"\xff": structpb.NewBoolValue(true)}}},
		"metadata value": {DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("\xff")}}},
	} {
		if Encodable(m) {
			t.Errorf("%s: encodable by hand", name)
		}
		if _, want := proto.Marshal(m); want == nil {
			t.Fatalf("%s: proto.Marshal accepts it: the case shows nothing", name)
		}
		if _, err := Message(m).AppendGRPC(nil); err == nil {
			t.Errorf("%s: AppendGRPC wrote a message proto.Marshal refuses", name)
		}
	}
}

func TestPrebuilt(t *testing.T) {
	m := &authv3.CheckResponse{Status: &rpcstatus.Status{}}
	p, err := Prebuild(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Bytes(), marshal(t, m)) || p.Response().CheckResponse() != m || p.Response().Wire() != p {
		t.Fatalf("prebuilt %x", p.Bytes())
	}
}

// Encoding into a buffer with room allocates nothing.
func TestEncodeAllocations(t *testing.T) {
	buf := make([]byte, 0, 8192)
	for name, m := range responses() {
		if n := testing.AllocsPerRun(100, func() { AppendResponse(buf[:0], m) }); n > 0 {
			t.Errorf("%s: %v allocations, want none", name, n)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	m := responses()["denied"]
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			proto.MarshalOptions{Deterministic: true}.Marshal(m)
		}
	})
	b.Run("checkwire", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			AppendResponse(buf[:0], m)
		}
	})
}
