package checkwire

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// testNames are the headers the tests keep: what the shipped configuration
// reads, plus one header the sample requests repeat.
var testNames = []string{"x-tenant-id", "x-forwarded-for", "x-envoy-external-address", "x-login-account", "content-type", "content-length", "x-envoy-auth-partial-body"}

// compare decodes b both ways and fails t when they disagree: on whether b
// is a CheckRequest at all, or on any field of the Request. It returns
// whether b was accepted.
func compare(t testing.TB, d *Decoder, b []byte) bool {
	t.Helper()
	var m authv3.CheckRequest
	refErr := proto.Unmarshal(b, &m)
	var got checkreq.Request
	err := d.Decode(b, &got)
	if (refErr == nil) != (err == nil) {
		t.Fatalf("proto.Unmarshal: %v; Decode: %v (input %x)", refErr, err, b)
	}
	if err != nil {
		return false
	}
	want := d.FromMessage(&m)
	sameRequest(t, d, &got, &want)
	return true
}

func sameRequest(t testing.TB, d *Decoder, got, want *checkreq.Request) {
	t.Helper()
	if got.Method != want.Method || got.Path != want.Path || got.PeerAddress != want.PeerAddress || got.Body != want.Body {
		t.Fatalf("Decode = method %q path %q peer %q body %q; proto.Unmarshal = %q %q %q %q",
			got.Method, got.Path, got.PeerAddress, got.Body, want.Method, want.Path, want.PeerAddress, want.Body)
	}
	sameFields(t, "header", d.names, got.Headers, want.Headers)
	sameFields(t, "context extension", checkreq.ContextExtensionNames(), got.ContextExtensions, want.ContextExtensions)
}

func sameFields(t testing.TB, what string, names []string, got, want checkreq.Fields) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%ss: Decode kept %q, proto.Unmarshal %q", what, got, want)
	}
	for _, n := range names {
		g, gok := got.Get(n)
		w, wok := want.Get(n)
		if g != w || gok != wok {
			t.Fatalf("%s %q: Decode %q (%v), proto.Unmarshal %q (%v)", what, n, g, gok, w, wok)
		}
	}
}

// envoyRequest is a CheckRequest as Envoy 1.40 sends it for an API call
// with the usual ~15 headers.
func envoyRequest() *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "10.0.3.7", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 51234}},
		}}},
		Destination: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "10.0.3.2", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080}},
		}}},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(timestamppb.Now().AsTime().Truncate(1)),
			Http: &authv3.AttributeContext_HttpRequest{
				Id:     "13612356283726543210",
				Method: "POST", Path: "/api/activities?page=2", Host: "api.example.com", Scheme: "https",
				Protocol: "HTTP/1.1", Size: 312,
				Headers: map[string]string{
					":method": "POST", ":path": "/api/activities?page=2", ":authority": "api.example.com", ":scheme": "https",
					"user-agent":               "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
					"accept":                   "application/json, text/plain, */*",
					"accept-encoding":          "gzip, deflate, br",
					"accept-language":          "en-GB,en;q=0.9",
					"content-type":             "application/json",
					"content-length":           "312",
					"authorization":            "Bearer eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl",
					"x-tenant-id":              "acme",
					"x-forwarded-for":          "198.51.100.23,10.0.3.7",
					"x-forwarded-proto":        "https",
					"x-envoy-external-address": "198.51.100.23",
					"x-request-id":             "2f6b1c3e-8d4a-4a53-9f0e-0c1d2e3f4a5b",
				},
			},
		},
		ContextExtensions: map[string]string{"virtual_host": "api"},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.filters.http.jwt_authn": {Fields: map[string]*structpb.Value{"sub": structpb.NewStringValue("1234567890")}},
		}},
	}}
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
