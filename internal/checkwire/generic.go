package checkwire

import (
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// FromMessage is the reference path: the Request that d reads from the
// wire form of req, taken from the message that proto.Unmarshal built.
// Decode must agree with it on every input (the equivalence tests hold
// them to it). The lookups are allocated, one each, only when there is
// something to hold.
func (d *Decoder) FromMessage(req *authv3.CheckRequest) checkreq.Request {
	attrs := req.GetAttributes()
	h := attrs.GetRequest().GetHttp()
	in := checkreq.Request{
		Method:      h.GetMethod(),
		Path:        h.GetPath(),
		PeerAddress: attrs.GetSource().GetAddress().GetSocketAddress().GetAddress(),
	}
	if d.wantBody {
		in.Body = h.GetBody()
		if in.Body == "" && len(h.GetRawBody()) > 0 { // pack_as_bytes
			in.Body = string(h.GetRawBody())
		}
	}
	if m := h.GetHeaders(); len(d.names) > 0 && len(m) > 0 {
		in.Headers = checkreq.AppendMap(make(checkreq.Fields, 0, len(d.names)), m, d.names)
	}
	if m := attrs.GetContextExtensions(); len(m) > 0 {
		in.ContextExtensions = checkreq.AppendMap(make(checkreq.Fields, 0, 2), m, checkreq.ContextExtensionNames())
	}
	return in
}
