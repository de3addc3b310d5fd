package checkwire

import (
	"context"
	"sync"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// Server is the Authorization service on the lean path.
type Server interface {
	// Decoder returns the decoder of the next check: what the current
	// configuration reads.
	Decoder() *Decoder
	// CheckWire decides on req, valid until it returns. It may decode req
	// again with another Decoder (DecodeWith) when the configuration
	// changed since Decoder was called. The caller ends the Response's
	// Hold, if any.
	CheckWire(ctx context.Context, req *Request) (Response, error)
}

// Request is one Check call's request: the received bytes, referenced for
// the duration of the call, and what a Decoder read from them (views into
// those bytes). Not safe for concurrent use; the handler owns it.
type Request struct {
	d   *Decoder
	buf mem.Buffer // the received message, referenced; nil after Decode
	raw []byte     // the bytes given to Decode
	req checkreq.Request
}

// Decode decodes b with d into r, outside gRPC (in-process benchmarks and
// tests): b must not change while r is in use.
func (r *Request) Decode(d *Decoder, b []byte) error {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	r.raw = b
	return r.DecodeWith(d)
}

// Decoder is the decoder req was decoded with.
func (r *Request) Decoder() *Decoder { return r.d }

// Request is the decoded request; its strings are valid until the call
// returns (copy what must outlive it).
func (r *Request) Request() *checkreq.Request { return &r.req }

// DecodeWith decodes the received bytes again with d.
func (r *Request) DecodeWith(d *Decoder) error {
	r.d = d
	b := r.raw
	if r.buf != nil {
		b = r.buf.ReadOnlyData()
	}
	return d.Decode(b, &r.req)
}

// release drops the buffer and every view into it.
func (r *Request) release() {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	r.raw = nil
	h, e := r.req.Headers, r.req.ContextExtensions
	clear(h[:cap(h)])
	clear(e[:cap(e)])
	r.req = checkreq.Request{Headers: h[:0], ContextExtensions: e[:0]}
	r.d = nil
}

// Register registers srv as envoy.service.auth.v3.Authorization on s,
// decoding requests with the lean decoder. The gRPC server must use the
// Codec (grpc.ForceServerCodecV2(NewCodec())), or every Check fails to
// decode.
func Register(s grpc.ServiceRegistrar, srv Server) {
	s.RegisterService(ServiceDesc(), srv)
}

// ServiceDesc returns a service description of
// envoy.service.auth.v3.Authorization whose Check handler decodes into a
// pooled *Request for srv (a Server).
func ServiceDesc() *grpc.ServiceDesc {
	pool := &sync.Pool{New: func() any { return new(Request) }}
	return &grpc.ServiceDesc{
		ServiceName: authv3.Authorization_ServiceDesc.ServiceName,
		HandlerType: (*Server)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Check",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				s := srv.(Server)
				req := pool.Get().(*Request)
				defer func() {
					req.release()
					pool.Put(req)
				}()
				req.d = s.Decoder()
				if err := dec(req); err != nil {
					return nil, err
				}
				if interceptor == nil {
					return check(ctx, s, req)
				}
				info := &grpc.UnaryServerInfo{Server: srv, FullMethod: authv3.Authorization_Check_FullMethodName}
				return interceptor(ctx, req, info, func(ctx context.Context, r any) (any, error) {
					return check(ctx, s, r.(*Request))
				})
			},
		}},
		Streams:  []grpc.StreamDesc{},
		Metadata: authv3.Authorization_ServiceDesc.Metadata,
	}
}

// check answers one call of the gRPC service: what the decision reserved
// is given back when the call was cancelled or timed out meanwhile.
func check(ctx context.Context, s Server, req *Request) (any, error) {
	resp, err := s.CheckWire(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := Settle(ctx, resp.hold); err != nil {
		return nil, err
	}
	return resp.wire(), nil
}
