// Package checkh2 is a lean HTTP/2 server for Envoy's ext_authz Check
// (envoy.service.auth.v3.Authorization/Check) and gRPC health
// (grpc.health.v1.Health/Check), and nothing else: every other method is
// answered UNIMPLEMENTED.
//
// # One goroutine per connection
//
// Each connection is served by one goroutine that reads a frame, and when
// a request is complete decodes it (pkg/checkwire), decides (the
// checkwire.Server), and writes the response HEADERS, DATA and trailers
// into a buffer, all before it reads the next frame. The buffer is flushed
// when the next frame (a header block with all its CONTINUATIONs) is not
// already fully received, so a busy connection answers many checks with
// one write, and a check costs no hand-off between goroutines. The handler
// must therefore not block: a check holds up every later request of its
// connection while it runs.
//
// It speaks HTTP/2 cleartext with prior knowledge (what Envoy's gRPC
// client speaks to a plain cluster) or TLS with ALPN h2.
//
// # Bounds
//
// Every resource a peer can make the server hold is bounded: connections
// (MaxConnections), streams per connection (MaxConcurrentStreams, excess
// refused with RST_STREAM REFUSED_STREAM), a request's header list
// (MaxHeaderListBytes, CONTINUATION included), a request message
// (MaxRecvMsgBytes, larger: RESOURCE_EXHAUSTED), the request bytes held per
// connection (its receive window), the responses waiting for the peer's
// send window (one per open stream), the buffers a connection keeps for
// its next streams (64 KiB, however large its requests were), the
// streams it remembers having reset (1024: frames the peer still sends on
// them are ignored, RFC 9113 §5.1), the time a connection may take to
// start (HandshakeTimeout), stay silent without streams (IdleTimeout) or
// with streams (ReadTimeout), and take to accept our writes
// (WriteTimeout). A peer that resets streams faster than MaxResetsPerSecond
// or pings more often than PingMinInterval (more than twice in a row) gets
// GOAWAY ENHANCE_YOUR_CALM.
//
// # Deadlines
//
// The handler runs synchronously and does not wait, so a request's
// grpc-timeout is checked before it is handled (an expired one is
// answered DEADLINE_EXCEEDED) rather than carried in the context.
package checkh2
