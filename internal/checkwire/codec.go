package checkwire

import (
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Codec is a gRPC server codec (grpc.ForceServerCodecV2) that decodes a
// *Request with its Decoder, encodes a *Prebuilt as its bytes and a
// CheckResponse of the shapes this product answers by hand (encode.go);
// every other message (health, RLS, access log, reflection) goes to the
// standard proto codec, so the codec changes
// nothing for the other services. Safe for concurrent use.
type Codec struct {
	fallback encoding.CodecV2
}

// NewCodec returns the codec; register the Authorization service with
// Register for its requests to take the lean path.
func NewCodec() *Codec {
	return &Codec{fallback: encoding.GetCodecV2(protocodec.Name)}
}

// Name is the standard codec's: the content-subtype stays "proto".
func (c *Codec) Name() string { return protocodec.Name }

// Unmarshal decodes data into v. A *Request keeps a reference to data's
// buffer until it is released, its strings being views into it.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*Request)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	r.buf = data.MaterializeToBuffer(mem.DefaultBufferPool())
	return r.d.Decode(r.buf.ReadOnlyData(), &r.req)
}

// Marshal encodes v.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *Prebuilt:
		return m.data, nil // read-only: the transport only reads it, Free is a no-op
	case *authv3.CheckResponse:
		if encodable(m) {
			return encodeResponse(m), nil
		}
	}
	return c.fallback.Marshal(v)
}

// Prebuilt is a constant CheckResponse encoded once (the bare allow, say):
// answering it costs no marshalling and no allocation. Immutable.
type Prebuilt struct {
	msg  *authv3.CheckResponse
	data mem.BufferSlice
}

// Prebuild encodes m once; m must not change afterwards.
func Prebuild(m *authv3.CheckResponse) (*Prebuilt, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("checkwire: prebuild a CheckResponse: %w", err)
	}
	return &Prebuilt{msg: m, data: mem.BufferSlice{mem.SliceBuffer(b)}}, nil
}

// Message is the response Prebuilt encodes.
func (p *Prebuilt) Message() *authv3.CheckResponse { return p.msg }

// Response is what a Server answers: a message encoded on the way out, or
// a Prebuilt, and what the decision reserved (Holding).
type Response struct {
	msg  *authv3.CheckResponse
	pre  *Prebuilt
	hold Hold
}

// Holding is r with h, what its decision reserved for the request.
func (r Response) Holding(h Hold) Response {
	r.hold = h
	return r
}

// Hold is what the decision reserved (nil: nothing): the transport ends
// it once it knows whether the answer was taken.
func (r Response) Hold() Hold { return r.hold }

// Message answers m.
func Message(m *authv3.CheckResponse) Response { return Response{msg: m} }

// Response answers p's message with its prebuilt encoding.
func (p *Prebuilt) Response() Response { return Response{pre: p} }

// CheckResponse is the message the response holds.
func (r Response) CheckResponse() *authv3.CheckResponse {
	if r.pre != nil {
		return r.pre.msg
	}
	return r.msg
}

// wire is what the handler hands gRPC: a pointer, so boxing it costs
// nothing.
func (r Response) wire() any {
	if r.pre != nil {
		return r.pre
	}
	return r.msg
}
