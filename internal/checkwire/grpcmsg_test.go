package checkwire

import (
	"encoding/binary"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
)

func TestAppendGRPCFramesWhatProtoMarshals(t *testing.T) {
	denied := &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: 8, Message: "rate limited"},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "retry-after", Value: "3"}}},
		}},
	}
	pre, err := Prebuild(&authv3.CheckResponse{Status: &rpcstatus.Status{}})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]Response{"message": Message(denied), "prebuilt": pre.Response()} {
		t.Run(name, func(t *testing.T) {
			prefix := []byte("xy")
			b, err := r.AppendGRPC(prefix)
			if err != nil {
				t.Fatal(err)
			}
			if string(b[:2]) != "xy" || b[2] != 0 {
				t.Fatalf("prefix or flag wrong: % x", b[:3])
			}
			if n := binary.BigEndian.Uint32(b[3:7]); int(n) != len(b)-7 {
				t.Fatalf("length %d, message of %d bytes", n, len(b)-7)
			}
			var got authv3.CheckResponse
			if err := proto.Unmarshal(b[7:], &got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&got, r.CheckResponse()) {
				t.Fatalf("decoded %v, want %v", &got, r.CheckResponse())
			}
		})
	}
	if _, err := (Response{}).AppendGRPC(nil); err == nil {
		t.Fatal("an empty Response encoded without error")
	}
}
