// Package checkh2 is a lean HTTP/2 server for Envoy's ext_authz Check
// (envoy.service.auth.v3.Authorization/Check), RLS ShouldRateLimit when
// given a rate limit service, and gRPC health
// (grpc.health.v1.Health/Check), and nothing else: every other method is
// answered UNIMPLEMENTED. It speaks HTTP/2 cleartext with prior knowledge
// (what Envoy's gRPC client speaks to a plain cluster) or TLS with ALPN h2.
//
// Invariants:
//
//   - One goroutine serves a connection: it reads a frame and, when a
//     request is complete, decodes it (internal/checkwire), decides (the
//     checkwire.Server or checkwire.RateLimitServer) and buffers the
//     response before it reads the next frame. The handler must therefore
//     not block: a call holds up every later request of its connection
//     while it runs. Both methods are served alike (bounds, stream states,
//     deadlines, stalls, resets).
//   - Every resource a peer can make the server hold is bounded:
//     connections, streams, a header list, a request message, the bytes and
//     responses held per connection, the streams remembered as reset, and
//     the time a connection may take to start, stay idle, stay silent and
//     accept writes (the Config fields say which bound is which).
//   - Stream states follow RFC 9113 §5.1, and a request's grpc-timeout is
//     checked when it is complete and again when its answer is written.
//   - A decision's checkwire.Hold is given back when its answer is not
//     taken (deadline passed, stream closed or reset before it was read).
//   - No GOAWAY names a higher stream than one sent before it; Shutdown
//     closes each connection in two steps, as grpc-go and net/http2 do, so
//     a peer knows which streams it may retry elsewhere.
//
// Failure mode: a bad request is answered on its stream (RST_STREAM with the
// code RFC 9113 gives, or a gRPC status: RESOURCE_EXHAUSTED for a message
// over MaxRecvMsgBytes, INTERNAL for a malformed grpc-timeout,
// DEADLINE_EXCEEDED once a deadline passed); a protocol error ends the
// connection with GOAWAY and its code; a flood (rapid reset beyond the
// answers the peer reads, pings, window changes) gets GOAWAY
// ENHANCE_YOUR_CALM. A connection idle or silent past
// its timeout gets GOAWAY NO_ERROR and is closed.
//
// The design (one goroutine per connection, bounds, stream states,
// deadlines, closing) is in docs/design/lean-http2.md.
package checkh2
