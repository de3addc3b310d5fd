package checkh2_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

const rlsPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// A grpc-go client gets from ShouldRateLimit on the lean listener what
// it gets from the same service on grpc-go (the gRPC port): the same
// responses, message for message, as a tenant fills its limit, and the
// same refusals.
func TestGRPCClientRateLimit(t *testing.T) {
	clock := &testclock.Clock{}
	clock.Set(time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC))
	_, addr := serve(t, checkh2.Config{RateLimit: checkh2.NewTestRLS(t, clock.Now)})
	lean := rlsv3.NewRateLimitServiceClient(dialGRPC(t, addr))

	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, checkh2.NewTestRLS(t, clock.Now))
	ref := rlsv3.NewRateLimitServiceClient(dialGRPC(t, serveLoopback(t, g)))

	many := checkh2.RLSRequest("allowed", "x")
	for range 70 {
		many.Descriptors = append(many.Descriptors, many.Descriptors[0])
	}
	over := 0
	for i, req := range []*rlsv3.RateLimitRequest{
		checkh2.RLSRequest("tenant", "t1"), checkh2.RLSRequest("tenant", "t1"), checkh2.RLSRequest("tenant", "t1"),
		checkh2.RLSRequest("tenant", "t1"), checkh2.RLSRequest("tenant", "t2"), checkh2.RLSRequest("denied", "t1"),
		checkh2.RLSRequest("allowed", "t1"), checkh2.RLSRequest("nothing", "t1"),
		{Domain: "lean"}, {Domain: "elsewhere", Descriptors: many.Descriptors[:1]}, many,
	} {
		want, werr := ref.ShouldRateLimit(ctx(t), req)
		got, gerr := lean.ShouldRateLimit(ctx(t), req)
		if status.Code(gerr) != status.Code(werr) || status.Convert(gerr).Message() != status.Convert(werr).Message() || !proto.Equal(got, want) {
			t.Fatalf("call %d: lean listener %v, %v; gRPC %v, %v", i, got, gerr, want, werr)
		}
		if want.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			over++
		}
	}
	if over != 2 { // the 4th call of t1, and denied
		t.Fatalf("%d calls over the limit, want 2", over)
	}

	h := healthpb.NewHealthClient(dialGRPC(t, addr))
	if resp, err := h.Check(ctx(t), &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of the rate limit service where it is served: %v, %v", resp, err)
	}
}

// Requests the server refuses are refused on ShouldRateLimit as on Check:
// a truncated, oversized or undecodable message, an expired deadline, and
// a request the service finds malformed; the connection goes on.
func TestRateLimitRefused(t *testing.T) {
	_, addr := serve(t, checkh2.Config{RateLimit: checkh2.NewTestRLS(t, nil), MaxRecvMsgBytes: 1 << 10})
	refuses(t, addr, (*h2).rateLimit, []refusal{
		{"message over the max", func(c *h2) {
			c.headers(1, rlsPath, false)
			c.fr.WriteData(1, false, []byte{0, 0, 0, 8, 0})
		}, "8", true},
		{"truncated message", func(c *h2) {
			c.headers(1, rlsPath, false)
			msg := grpcMessage(c.t, checkh2.RLSRequest("tenant", "t"))
			c.fr.WriteData(1, true, msg[:len(msg)-3])
		}, "13", false},
		{"truncated RateLimitRequest", func(c *h2) {
			b, _ := proto.Marshal(checkh2.RLSRequest("tenant", "t"))
			b = b[:len(b)-2]
			c.headers(1, rlsPath, false)
			c.fr.WriteData(1, true, append([]byte{0, 0, 0, 0, byte(len(b))}, b...))
		}, "13", false},
		{"value not UTF-8", func(c *h2) {
			c.headers(1, rlsPath, false)
			// proto.Marshal refuses it: the wire form by hand.
			entry := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff")
			desc := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
			b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "lean")
			b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), desc)
			c.fr.WriteData(1, true, append([]byte{0, 0, 0, 0, byte(len(b))}, b...))
		}, "13", false},
		{"no domain", func(c *h2) {
			c.headers(1, rlsPath, false)
			c.fr.WriteData(1, true, grpcMessage(c.t, &rlsv3.RateLimitRequest{Descriptors: checkh2.RLSRequest("tenant", "t").Descriptors}))
		}, "3", false},
		{"expired grpc-timeout", func(c *h2) {
			c.headers(1, rlsPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "1n"})
			time.Sleep(time.Millisecond)
			c.fr.WriteData(1, true, grpcMessage(c.t, checkh2.RLSRequest("tenant", "t")))
		}, "4", false},
	})
}

func (c *h2) rateLimit(id uint32) {
	c.t.Helper()
	c.headers(id, rlsPath, false)
	if err := c.fr.WriteData(id, true, grpcMessage(c.t, checkh2.RLSRequest("allowed", "h"))); err != nil {
		c.t.Fatal(err)
	}
}

// A ShouldRateLimit stream stalled either way is handled as a Check's:
// a request that never ends is a read timeout, an answer into a closed
// window waits for the window without holding up the connection's other
// calls.
func TestRateLimitStalled(t *testing.T) {
	_, addr := serve(t, checkh2.Config{RateLimit: checkh2.NewTestRLS(t, nil), ReadTimeout: 300 * time.Millisecond})
	t.Run("request", func(t *testing.T) {
		c := dial(t, addr)
		c.headers(1, rlsPath, false)
		msg := grpcMessage(t, checkh2.RLSRequest("tenant", "t"))
		c.fr.WriteData(1, false, msg[:4]) // and never the rest
		ga := c.closed()
		if ga == nil || ga.ErrCode != http2.ErrCodeNo || ga.Debug != "read timeout" || ga.LastStreamID != 1 {
			t.Fatalf("a stalled request: GOAWAY %+v, want NO_ERROR after stream 1 saying read timeout", ga)
		}
	})
	t.Run("answer", func(t *testing.T) {
		c := dial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		c.rateLimit(1) // its answer waits for stream 1's window
		c.check(3)     // as does this one's,
		c.fr.WriteWindowUpdate(3, 1<<20)
		if _, st := c.response(3); st != "0" { // which opens first
			t.Fatalf("stream 3: grpc-status %q", st)
		}
		c.fr.WriteWindowUpdate(1, 1<<20)
		data, st := c.response(1)
		var resp rlsv3.RateLimitResponse
		if st != "0" || len(data) < 5 || proto.Unmarshal(data[5:], &resp) != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("stream 1: grpc-status %q, %v", st, &resp)
		}
	})
}

// Without a rate limit service ShouldRateLimit is UNIMPLEMENTED, and its
// health unknown.
func TestRateLimitNotServed(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	cc := dialGRPC(t, addr)
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx(t), checkh2.RLSRequest("tenant", "t")); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ShouldRateLimit: %v, want Unimplemented", err)
	}
}
