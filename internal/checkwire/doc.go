// Package checkwire is the Check path's wire layer: a decoder of
// envoy.service.auth.v3.CheckRequest that reads only what a decision needs,
// the gRPC codec and service registration that put it on the
// Authorization service alone, and prebuilt encodings of constant
// responses.
//
// # What the decoder reads
//
// Decode walks the protobuf wire form once and keeps, as views into the
// received bytes (nothing copied): the method and path, the headers the
// descriptors Engine names (Engine.HeaderNames), the source peer's socket
// address, the context extensions the Engine reads, and the body (or
// raw_body) only when a rule reads it (Engine.WantsBody). Every other field
// and header is skipped without allocating: a request of 100k headers costs
// one pass over its bytes and keeps only the handful named.
//
// # Exactly what proto.Unmarshal accepts
//
// The skipped parts are still checked, against a schema compiled from the
// generated descriptors of CheckRequest and everything it can hold: so
// Decode accepts and rejects exactly the bytes proto.Unmarshal does, and
// reads the same values. Rejected: truncated varints and tags, lengths
// past the end of their message, field number 0 or above 2^29−1, reserved
// wire types, unbalanced or mismatched groups, malformed packed fields,
// invalid UTF-8 in any proto3 string field (a header value nobody reads,
// a metadata string, the host…), and nesting beyond the runtime's bound
// (10000, counted as the runtime counts it: per message and per map
// entry). Accepted as the runtime does: unknown fields of every wire type,
// a known field of the wrong wire type (an unknown field, skipped), map
// entries with a missing key or value (""), repeated fields and messages
// merged in order (the last scalar wins, map keys take their last value, a
// later oneof case replaces the source address). Rejection is a gRPC
// error (INTERNAL, as grpc-go's codec answers a message it cannot
// unmarshal), never a decision. The equivalence is held by tests on both
// paths and FuzzCheckWireEquivalence (internal/authz).
//
// # Lifetimes
//
// A Request's strings point into the received message: the codec keeps a
// reference to gRPC's receive buffer (so it is not recycled) until the
// Check handler returns, and the handler then drops every view. Whatever
// outlives the call must be copied: the counter copies the keys it stores,
// and authz copies the keys it puts in dynamic metadata.
//
// # Failure mode
//
// Decode never panics, reads nothing outside its input, allocates nothing
// (beyond the lookups' room, reused by the pooled Request), and recurses at
// most as deep as the protobuf runtime would. The Decoder and the Codec are
// immutable and safe for concurrent use.
package checkwire
