package checkwire

import (
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/descriptors"
)

// BenchmarkDecode reads the same Envoy CheckRequest (~15 headers, peer
// addresses, metadata) both ways: proto.Unmarshal of the whole message,
// then copying out what the decision reads (the generic path), against
// the lean decoder.
func BenchmarkDecode(b *testing.B) {
	in := marshal(b, envoyRequest())
	d := NewDecoder(testNames, false)
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			var m authv3.CheckRequest
			if err := proto.Unmarshal(in, &m); err != nil {
				b.Fatal(err)
			}
			r := d.FromMessage(&m)
			_ = r
		}
	})
	b.Run("checkwire", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		var r descriptors.Request
		for b.Loop() {
			if err := d.Decode(in, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
