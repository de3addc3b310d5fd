package checkgrpc

import (
	"context"
	"sync"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// Register registers srv as envoy.service.auth.v3.Authorization on s,
// decoding requests with the lean decoder. The gRPC server must use the
// Codec (grpc.ForceServerCodecV2(NewCodec())), or every Check fails to
// decode.
func Register(s grpc.ServiceRegistrar, srv checkwire.Server) {
	s.RegisterService(ServiceDesc(), srv)
}

// ServiceDesc returns a service description of
// envoy.service.auth.v3.Authorization whose Check handler decodes into a
// pooled *checkwire.Request for srv (a checkwire.Server).
func ServiceDesc() *grpc.ServiceDesc {
	pool := &sync.Pool{New: func() any { return new(checkwire.Request) }}
	return &grpc.ServiceDesc{
		ServiceName: authv3.Authorization_ServiceDesc.ServiceName,
		HandlerType: (*checkwire.Server)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Check",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				s := srv.(checkwire.Server)
				req := pool.Get().(*checkwire.Request)
				defer func() {
					req.Reset()
					pool.Put(req)
				}()
				req.SetDecoder(s.Decoder())
				if err := dec(req); err != nil {
					return nil, err
				}
				if interceptor == nil {
					return check(ctx, s, req)
				}
				info := &grpc.UnaryServerInfo{Server: srv, FullMethod: authv3.Authorization_Check_FullMethodName}
				return interceptor(ctx, req, info, func(ctx context.Context, r any) (any, error) {
					return check(ctx, s, r.(*checkwire.Request))
				})
			},
		}},
		Streams:  []grpc.StreamDesc{},
		Metadata: authv3.Authorization_ServiceDesc.Metadata,
	}
}

// check answers one call of the gRPC service: what the decision reserved
// is given back when the call was cancelled or timed out meanwhile.
func check(ctx context.Context, s checkwire.Server, req *checkwire.Request) (any, error) {
	resp, err := s.CheckWire(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := Settle(ctx, resp.Hold()); err != nil {
		return nil, err
	}
	return resp.Wire(), nil
}

// Settle ends h (nil: nothing reserved) for a call whose handler ran
// under ctx: while ctx is live the answer goes out and h is kept; once
// ctx is done (the stream reset, the deadline passed) h is given back
// and the call's status is ctx's error. A reset that arrives after the
// answer was handed to the transport is not seen here; a transport that
// sees it (checkh2) holds the Hold until the peer has read the answer.
func Settle(ctx context.Context, h checkwire.Hold) error {
	if err := ctx.Err(); err != nil {
		if h != nil {
			h.Cancel()
		}
		return status.FromContextError(err).Err()
	}
	if h != nil {
		h.Keep()
	}
	return nil
}
