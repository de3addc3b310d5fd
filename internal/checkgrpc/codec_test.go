package checkgrpc

import (
	"bytes"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

func denied() *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: 8, Message: "rate limited"},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "retry-after", Value: "3"}}},
			Body:    `{"error":"rate_limited"}` + "\n",
		}},
	}
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The codec writes what the deterministic marshaller writes: by hand in
// one allocation for the responses the product builds, through the
// standard codec for any other message.
func TestCodecMarshal(t *testing.T) {
	c := NewCodec()
	detail, _ := anypb.New(wrapperspb.String("d"))
	for name, m := range map[string]*authv3.CheckResponse{
		"denied":         denied(),
		"status details": {Status: &rpcstatus.Status{Details: []*anypb.Any{detail}}},
	} {
		got, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if want := marshal(t, m); !bytes.Equal(got.Materialize(), want) {
			t.Errorf("%s:\n got %x\nwant %x", name, got.Materialize(), want)
		}
	}
	m := denied()
	if n := testing.AllocsPerRun(100, func() { c.Marshal(m) }); n > 1 {
		t.Errorf("a denial: %v allocations, want 1", n)
	}
	if _, err := c.Marshal(&authv3.CheckResponse{Status: &rpcstatus.Status{Message: "\xff"}}); err == nil {
		t.Error("the codec wrote a message proto.Marshal refuses")
	}
}

// A prebuilt response is its bytes, answered without allocating.
func TestCodecPrebuilt(t *testing.T) {
	m := &authv3.CheckResponse{Status: &rpcstatus.Status{}}
	p, err := checkwire.Prebuild(m)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCodec()
	got, err := c.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Materialize(), marshal(t, m)) {
		t.Fatalf("prebuilt %x", got.Materialize())
	}
	if n := testing.AllocsPerRun(100, func() { c.Marshal(p) }); n > 0 {
		t.Errorf("answering a prebuilt response allocates %v times", n)
	}
}

// A Check request decodes with its Decoder, its strings views into the
// received buffer until it is reset; any other message takes the
// standard codec.
func TestCodecUnmarshal(t *testing.T) {
	in := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
		Method: "POST", Path: "/a", Headers: map[string]string{"x-tenant-id": "acme", "other": "x"},
	}}}}
	c := NewCodec()
	var r checkwire.Request
	r.SetDecoder(checkwire.NewDecoder([]string{"x-tenant-id"}, false))
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(marshal(t, in))}, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.Request(); got.Method != "POST" || got.Path != "/a" || got.Headers.Value("x-tenant-id") != "acme" || len(got.Headers) != 1 {
		t.Fatalf("decoded %+v", got)
	}
	r.Reset()
	if got := r.Request(); got.Path != "" || len(got.Headers) != 0 {
		t.Fatalf("after Reset %+v", got)
	}
	var back authv3.CheckResponse
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(marshal(t, denied()))}, &back); err != nil || !proto.Equal(&back, denied()) {
		t.Fatalf("another message: %v %v", &back, err)
	}
}

func BenchmarkEncode(b *testing.B) {
	m := denied()
	c := NewCodec()
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.fallback.Marshal(m)
		}
	})
	b.Run("checkwire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.Marshal(m)
		}
	})
}
