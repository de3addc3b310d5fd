// Package checkh2 is a lean HTTP/2 server for Envoy's ext_authz Check
// (envoy.service.auth.v3.Authorization/Check) and gRPC health
// (grpc.health.v1.Health/Check), and nothing else: every other method is
// answered UNIMPLEMENTED.
//
// # One goroutine per connection
//
// Each connection is served by one goroutine that reads a frame, and when
// a request is complete decodes it (internal/checkwire), decides (the
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
// start (HandshakeTimeout), stay without streams (IdleTimeout, from its
// last stream whatever else it sends, as grpc-go's MaxConnectionIdle), stay
// silent with streams (ReadTimeout), and take to accept our writes
// (WriteTimeout). A peer that resets open streams faster than
// MaxResetsPerSecond (rapid reset; resets of streams already answered are
// free, as a client cancels in a burst what a stalled server answered as
// it woke) or pings more often than PingMinInterval (more than twice in a row) gets
// GOAWAY ENHANCE_YOUR_CALM, as does one that changes
// SETTINGS_INITIAL_WINDOW_SIZE with streams open more than twice in a
// second: each change walks every open stream.
//
// # Stream states
//
// Stream states are kept as RFC 9113 §5.1 has them: DATA on a closed or
// half-closed (remote) stream gets RST_STREAM STREAM_CLOSED (once: what
// the peer still sends on a stream this server reset is ignored); a
// HEADERS or PRIORITY frame making a stream depend on itself gets
// RST_STREAM PROTOCOL_ERROR; a request with a connection-specific header
// (connection, keep-alive, proxy-connection, transfer-encoding, upgrade,
// or te other than "trailers") gets RST_STREAM PROTOCOL_ERROR, as grpc-go
// answers a connection header; HEADERS on a stream already opened (a
// reused or lower identifier, or a client's trailers, which gRPC requests
// never have) ends the connection with GOAWAY PROTOCOL_ERROR, as grpc-go
// ends it.
//
// # Deadlines
//
// A request's grpc-timeout (up to 8 digits and a unit, as the gRPC spec
// writes it; anything else is answered HTTP 400 and INTERNAL, as grpc-go
// answers it) is checked when the request is complete and again when its
// answer is written: once passed, the answer is DEADLINE_EXCEEDED. The
// handler never waits, so its context is the connection's, with no
// deadline of the request's.
//
// # Closing
//
// Shutdown closes each connection in two steps, as grpc-go and net/http2
// do: GOAWAY naming every stream and a PING, the streams that arrive
// meanwhile (sent before the peer read the GOAWAY) served; then, on the
// PING's ack or a second after it, GOAWAY naming the last stream
// received, so the peer knows every later stream was not processed and
// may retry it elsewhere. The streams in progress finish, and the
// connection closes once none is left, or when Shutdown's context ends.
//
// A connection without streams for IdleTimeout since its last one (PINGs
// and SETTINGS do not count) gets GOAWAY NO_ERROR and is closed; one with streams open silent for ReadTimeout
// gets GOAWAY NO_ERROR with the debug data "read timeout" and is closed,
// the GOAWAY written within WriteTimeout or not at all. A protocol error
// or a flood gets GOAWAY with its code. No GOAWAY names a higher stream
// than one sent before it. A client's GOAWAY refuses only streams a
// server would open: the client's own, sent after it, are served until it
// closes the connection.
package checkh2
