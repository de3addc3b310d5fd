// Package checkwire is the Check path's wire layer: a decoder of
// envoy.service.auth.v3.CheckRequest that reads only what a decision needs,
// a hand encoder of the CheckResponses the product builds, and prebuilt
// encodings of constant responses, all free of any gRPC server (package
// checkgrpc puts them on grpc-go; the lean listener frames them itself);
// and the lean listener's ShouldRateLimit wire layer: a
// RateLimitRequest decoder (RateLimitDecoder) and a RateLimitResponse
// encoder (AppendRateLimitResponse) held to the same invariants.
//
// Invariants:
//
//   - Decode walks the protobuf wire form once and keeps only what the
//     descriptors Engine reads (method, path, the headers it names, the
//     peer's address, the context extensions, the body only when a rule
//     reads it), as views into the received bytes: nothing copied, every
//     other field skipped without allocating.
//   - Decode accepts and rejects exactly the bytes proto.Unmarshal does, and
//     reads the same values: the skipped parts are checked against a schema
//     compiled from the generated descriptors (held by tests on both paths
//     and FuzzCheckWireEquivalence in internal/authz).
//   - A Request's strings point into the received buffer, kept until the
//     Check handler returns: whatever outlives the call must be copied.
//   - The Decoder and the RateLimitDecoder are immutable and
//     safe for concurrent use; a RateLimitRequest keeps at most one
//     descriptor and one entry past its decoder's bounds, and bounded pools.
//
// Failure mode: a request proto.Unmarshal would reject is a gRPC error
// (INTERNAL, as grpc-go's codec answers it), never a decision. Decode never
// panics, reads nothing outside its input, and recurses at most as deep as
// the protobuf runtime would.
//
// The design (what the decoder reads, what it accepts, lifetimes) is in
// docs/design/check-decoding.md.
package checkwire
