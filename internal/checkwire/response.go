package checkwire

import (
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
)

// Prebuilt is a constant CheckResponse encoded once (the bare allow, say):
// answering it costs no marshalling and no allocation. Immutable.
type Prebuilt struct {
	msg  *authv3.CheckResponse
	data []byte // read-only
}

// Prebuild encodes m once; m must not change afterwards.
func Prebuild(m *authv3.CheckResponse) (*Prebuilt, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("checkwire: prebuild a CheckResponse: %w", err)
	}
	return &Prebuilt{msg: m, data: b}, nil
}

// Message is the response Prebuilt encodes.
func (p *Prebuilt) Message() *authv3.CheckResponse { return p.msg }

// Bytes is the encoding of p's message; read-only.
func (p *Prebuilt) Bytes() []byte { return p.data }

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

// Wire is what a gRPC handler hands its codec: the Prebuilt, or the
// message; a pointer, so boxing it costs nothing.
func (r Response) Wire() any {
	if r.pre != nil {
		return r.pre
	}
	return r.msg
}
