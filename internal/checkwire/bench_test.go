package checkwire

import (
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
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
		var r checkreq.Request
		for b.Loop() {
			if err := d.Decode(in, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeRateLimit reads Envoy's RateLimitRequest both ways:
// proto.Unmarshal into a new message (the gRPC port), against the lean
// decoder into a reused RateLimitRequest; and encodes an answer both ways.
func BenchmarkDecodeRateLimit(b *testing.B) {
	in := marshal(b, envoyRateLimitRequest())
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			var m rlsv3.RateLimitRequest
			if err := proto.Unmarshal(in, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("checkwire", func(b *testing.B) {
		d := NewRateLimitDecoder(testMaxDescriptors, testMaxEntries)
		var r RateLimitRequest
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if err := d.Decode(in, &r); err != nil {
				b.Fatal(err)
			}
			r.Reset()
		}
	})
}

func BenchmarkEncodeRateLimit(b *testing.B) {
	m := rateLimitResponses()["allowed"]
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := (proto.MarshalOptions{Deterministic: true}).Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("checkwire", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := AppendRateLimitResponse(buf[:0], m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
