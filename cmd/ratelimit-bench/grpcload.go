package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// checkMethod is the full gRPC method name of Envoy's ext_authz Check.
const checkMethod = "/envoy.service.auth.v3.Authorization/Check"

// envoyListener is the address Envoy reports as the request's destination.
const envoyListener = "127.0.0.1"

// checkRequest builds the CheckRequest Envoy would send for r, configured
// as envoy/ratelimit-authz.yaml is: use_remote_address (so Envoy sets
// x-envoy-external-address and appends the peer to x-forwarded-for), the
// body only on login routes (every other route disables buffering).
func checkRequest(r request, id uint64, now time.Time) *authv3.CheckRequest {
	reqID := requestID(id)
	h := make(map[string]string, len(r.headers)+10)
	for k, v := range r.headers {
		h[k] = v
	}
	h[":authority"] = "api.example.com"
	h[":method"] = r.method
	h[":path"] = r.path
	h[":scheme"] = "http"
	h["x-forwarded-proto"] = "http"
	h["x-request-id"] = reqID
	h["x-envoy-external-address"] = r.clientIP
	h["x-forwarded-for"] = r.clientIP
	if r.body != "" {
		h["content-length"] = strconv.Itoa(len(r.body))
	}
	httpReq := &authv3.AttributeContext_HttpRequest{
		Id:       strconv.FormatUint(id, 10),
		Method:   r.method,
		Headers:  h,
		Path:     r.path,
		Host:     "api.example.com",
		Scheme:   "http",
		Protocol: "HTTP/1.1",
		Size:     int64(len(r.body)),
	}
	if isLogin(r.route) {
		httpReq.Body = r.body
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socketAddress(r.clientIP, uint32(32768+id%28000))},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress(envoyListener, 10000)},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(now),
			Http: httpReq,
		},
	}}
}

func isLogin(name string) bool {
	r, ok := findRoute(name)
	return ok && r.login
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// requestID is a UUID-shaped id, deterministic in n, like Envoy's
// x-request-id.
func requestID(n uint64) string {
	rng := rand.New(rand.NewPCG(n, 0x1d))
	const hex = "0123456789abcdef"
	var b [36]byte
	for i := range b {
		switch i {
		case 8, 13, 18, 23:
			b[i] = '-'
		default:
			b[i] = hex[rng.IntN(16)]
		}
	}
	return string(b[:])
}

// encodedCheck is a CheckRequest already in wire form: requests are encoded
// once, outside the timed call (and, with a pool, once per run), so the
// load tool spends its CPU on the transport, as Envoy does, rather than on
// building messages.
type encodedCheck struct{ data []byte }

// decision is the part of an answer the tool reads: CheckResponse's
// status.code, or RateLimitResponse's overall_code.
type decision struct{ code int32 }

// rawCodec sends encodedCheck bytes as they are and reads only the code
// of the answer, with read. Its name is "proto", so the server sees an
// ordinary application/grpc+proto call.
type rawCodec struct {
	read func([]byte) (int32, error)
}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*encodedCheck)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.data)}, nil
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	d, ok := v.(*decision)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	code, err := c.read(b)
	d.code = code
	return err
}

// dial opens n connections (at least one per target), dealt to the
// targets in turn, each with codec. Connections are established lazily,
// on first use.
func dial(targets []string, n int, codec rawCodec) ([]*grpc.ClientConn, error) {
	if len(targets) == 0 {
		return nil, errors.New("no target")
	}
	n = max(n, len(targets))
	var conns []*grpc.ClientConn
	for i := range n {
		conn, err := grpc.NewClient(targets[i%len(targets)],
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec)),
		)
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("connect to %s: %w", targets[i%len(targets)], err)
		}
		conns = append(conns, conn)
	}
	return conns, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, conn := range conns {
		conn.Close()
	}
}

// statusCode reads CheckResponse.status.code (fields 1 and 1) from the wire
// form; an absent status is OK, as Envoy treats it.
func statusCode(b []byte) (int32, error) {
	v, err := lastField(b, 1, protowire.BytesType)
	if err != nil || v == nil {
		return 0, err
	}
	msg, _ := protowire.ConsumeBytes(v) // whole: lastField consumed it
	return codeField(msg)
}

// codeField reads the varint field 1 of a message from its wire form
// (google.rpc.Status.code, RateLimitResponse.overall_code); absent is 0.
func codeField(b []byte) (int32, error) {
	v, err := lastField(b, 1, protowire.VarintType)
	if err != nil || v == nil {
		return 0, err
	}
	x, _ := protowire.ConsumeVarint(v) // whole: lastField consumed it
	return int32(x), nil
}

// lastField returns the wire value of the last field want of type typ in
// message b (nil if it has none), having checked that every field is
// whole; the last occurrence of a scalar wins, as protobuf reads it.
func lastField(b []byte, want protowire.Number, typ protowire.Type) ([]byte, error) {
	var val []byte
	for len(b) > 0 {
		num, t, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, t, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		if num == want && t == typ {
			val = b[:n]
		}
		b = b[n:]
	}
	return val, nil
}

// grpcCaller sends one gRPC method's calls over several connections,
// spread over one or more targets (nodes): Checks, or ShouldRateLimit.
type grpcCaller struct {
	conns  []*grpc.ClientConn
	method string
	what   string // the request's message, for errors
	encode func(r request, id uint64) ([]byte, error)
	// judge classes an answer by its code (see rawCodec), as Envoy does,
	// and says what code to count it under.
	judge func(code int32) (class, counted int)
}

// newGRPCCaller opens n connections (see dial) to the targets for Check:
// any status but OK is a denial.
func newGRPCCaller(targets []string, n int) (*grpcCaller, error) {
	conns, err := dial(targets, n, rawCodec{read: statusCode})
	if err != nil {
		return nil, err
	}
	return &grpcCaller{conns: conns, method: checkMethod, what: "CheckRequest",
		encode: func(r request, id uint64) ([]byte, error) { return proto.Marshal(checkRequest(r, id, time.Now())) },
		judge: func(code int32) (int, int) {
			if codes.Code(code) == codes.OK {
				return classAllowed, 0
			}
			return classDenied, int(code)
		}}, nil
}

func (c *grpcCaller) prepare(r request, id uint64) (any, error) {
	b, err := c.encode(r, id)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", c.what, err)
	}
	return &encodedCheck{data: b}, nil
}

func (c *grpcCaller) call(ctx context.Context, seq uint64, p any) outcome {
	var d decision
	conn := c.conns[seq%uint64(len(c.conns))]
	if err := conn.Invoke(ctx, c.method, p, &d); err != nil {
		return outcome{class: classError, code: -1, err: grpcErrKind(err)}
	}
	class, code := c.judge(d.code)
	return outcome{class: class, code: code}
}

func grpcErrKind(err error) string {
	s, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	msg := s.Message()
	if len(msg) > 120 {
		msg = msg[:120] + "…"
	}
	return s.Code().String() + ": " + msg
}

func (c *grpcCaller) close() { closeAll(c.conns) }
