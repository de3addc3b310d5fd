package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// grpcLoad is one gRPC load: the method, how a generated request becomes
// its message and how an answer is judged, as Envoy judges it.
type grpcLoad struct {
	method string
	encode func(r request, id uint64) ([]byte, error)
	judge  func(answer []byte) (outcome, error) // nil: the answer is not read
	stream bool                                 // client-streaming: see streamCaller
	mix    string                               // what the run reports before the route mix; "" for none
}

// checkLoad is ext_authz's Check: any status but OK is a denial.
func checkLoad() grpcLoad {
	return grpcLoad{method: "/envoy.service.auth.v3.Authorization/Check",
		encode: func(r request, id uint64) ([]byte, error) { return proto.Marshal(checkRequest(r, id, time.Now())) },
		judge: func(b []byte) (outcome, error) {
			code, err := statusCode(b)
			if code == 0 {
				return outcome{class: classAllowed}, err
			}
			return outcome{class: classDenied, code: int(code)}, err
		}}
}

// envoyListener is the address Envoy reports as the request's destination.
const envoyListener = "127.0.0.1"

// checkRequest builds the CheckRequest Envoy would send for r, configured
// as envoy/ratelimit-authz.yaml is: use_remote_address (so Envoy sets
// x-envoy-external-address and appends the peer to x-forwarded-for), the
// body only on login routes (every other route disables buffering).
func checkRequest(r request, id uint64, now time.Time) *authv3.CheckRequest {
	h := make(map[string]string, len(r.headers)+10)
	for k, v := range r.headers {
		h[k] = v
	}
	h[":authority"], h[":method"], h[":path"], h[":scheme"] = "api.example.com", r.method, r.path, "http"
	h["x-forwarded-proto"], h["x-request-id"] = "http", requestID(id)
	h["x-envoy-external-address"], h["x-forwarded-for"] = r.clientIP, r.clientIP
	if r.body != "" {
		h["content-length"] = strconv.Itoa(len(r.body))
	}
	httpReq := &authv3.AttributeContext_HttpRequest{Id: strconv.FormatUint(id, 10), Method: r.method, Headers: h,
		Path: r.path, Host: "api.example.com", Scheme: "http", Protocol: "HTTP/1.1", Size: int64(len(r.body))}
	if rt, _ := findRoute(r.route); rt.login {
		httpReq.Body = r.body
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socketAddress(r.clientIP, uint32(32768+id%28000))},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress(envoyListener, 10000)},
		Request:     &authv3.AttributeContext_Request{Time: timestamppb.New(now), Http: httpReq},
	}}
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
		if b[i] = '-'; i != 8 && i != 13 && i != 18 && i != 23 {
			b[i] = hex[rng.IntN(16)]
		}
	}
	return string(b[:])
}

// wire is a message already in wire form: requests are encoded once,
// outside the timed call (and, with a pool, once per run), so the load
// tool spends its CPU on the transport, as Envoy does, rather than on
// building messages.
type wire []byte

// reply is what an answer is read into: judge's verdict on it.
type reply struct {
	judge func([]byte) (outcome, error)
	o     outcome
}

// rawCodec sends wire as it is and hands an answer to its reply's judge.
// Its name is "proto", so the server sees an ordinary
// application/grpc+proto call.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

// Marshal and Unmarshal are only ever given what grpcCaller and
// streamCaller pass: a wire and a *reply.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(wire))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) (err error) {
	r := v.(*reply)
	if r.judge == nil {
		return nil
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData() // the usual case: no copy
	} else {
		b = data.Materialize()
	}
	r.o, err = r.judge(b)
	return err
}

// The answers are read from their wire form, without unmarshalling: a
// judge takes no allocation and little CPU per call. Each reader checks
// that every field is whole and reads a scalar as protobuf does: the last
// occurrence wins, and a message sent in several parts is merged.

// statusCode reads CheckResponse.status.code (fields 1 and 1); an absent
// status is OK, as Envoy treats it.
func statusCode(b []byte) (code int32, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		msg, _ := protowire.ConsumeBytes(v) // whole: eachField checked it
		c, err := lastField(msg, 1, protowire.VarintType)
		if x, n := protowire.ConsumeVarint(c); n > 0 { // a part without a code keeps the code before
			code = int32(x)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	return code, nil
}

// codeField reads the varint field 1 of a message (google.rpc.Status.code,
// RateLimitResponse.overall_code, gubernator's RateLimitResp.status);
// absent is 0.
func codeField(b []byte) (int32, error) {
	v, err := lastField(b, 1, protowire.VarintType)
	if err != nil {
		return 0, err
	}
	x, _ := protowire.ConsumeVarint(v) // nil: 0
	return int32(x), nil
}

// lastField returns the wire value of the last field want of type typ in
// message b (nil if it has none).
func lastField(b []byte, want protowire.Number, typ protowire.Type) (val []byte, err error) {
	err = eachField(b, func(num protowire.Number, t protowire.Type, v []byte) error {
		if num == want && t == typ {
			val = v
		}
		return nil
	})
	return val, err
}

// eachField calls fn with every field of message b in order, with its
// wire value, and stops at the first that is not whole or fn's error.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		if err := fn(num, typ, b[n:n+m]); err != nil {
			return err
		}
		b = b[n+m:]
	}
	return nil
}

// grpcCaller sends one gRPC load's calls over its connections in turn.
type grpcCaller struct {
	grpcLoad
	conns []*grpc.ClientConn
}

// dialLoad opens n connections (at least one per target) for l, dealt to
// the targets in turn and established on first use.
func dialLoad(targets []string, n int, l grpcLoad) (caller, error) {
	c := &grpcCaller{grpcLoad: l}
	for i := range max(n, len(targets)) {
		conn, err := grpc.NewClient(targets[i%len(targets)], grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("connect to %s: %w", targets[i%len(targets)], err)
		}
		c.conns = append(c.conns, conn)
	}
	if l.stream {
		return &streamCaller{grpcCaller: c, streams: make([]stream, len(c.conns))}, nil
	}
	return c, nil
}

func (c *grpcCaller) prepare(r request, id uint64) (any, error) {
	b, err := c.encode(r, id)
	if err != nil {
		return nil, fmt.Errorf("encode the request of %s: %w", c.method, err)
	}
	return wire(b), nil
}

func (c *grpcCaller) call(ctx context.Context, seq uint64, p any) outcome {
	r := reply{judge: c.judge}
	if err := c.conns[seq%uint64(len(c.conns))].Invoke(ctx, c.method, p, &r); err != nil {
		return outcome{class: classError, code: -1, err: errKind(err)}
	}
	return r.o
}

func (c *grpcCaller) close() {
	for _, conn := range c.conns {
		conn.Close()
	}
}
