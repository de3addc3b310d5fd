// Package server runs the node's listeners and shuts them down in order.
//
//   - gRPC, the Check port: Envoy's ext_authz Check and grpc.health.v1, and
//     the access-log service unless it has its own port.
//   - gRPC, the access-log port (optional, Config.AccessLogAddr): the
//     access-log service and grpc.health.v1 only, so that the Check port
//     can be reachable from more places than the one that may report
//     failed logins.
//   - HTTP, the admin port: /metrics, /healthz, /readyz and, when the
//     failures service is given, /v1/failures.
//   - HTTP, the profile port (optional, Config.PprofAddr): /debug/pprof/
//     without /debug/pprof/cmdline. Profiles are never served on the
//     admin port.
//
// Each gRPC listener is plaintext, TLS or mTLS (a client CA, and an
// allow-list of the SAN names a client certificate must carry: a
// certificate of the CA without one fails the handshake, so the client
// never reaches a service). Each is bounded (Bounds): connections open at
// once (one more is closed on accept), concurrent streams per connection
// (extra streams are refused), the size of a received message
// (RESOURCE_EXHAUSTED) and of the request's HTTP/2 headers (the stream is
// reset), the handshake time, idle connections, and keepalive pings (a
// client that pings too often gets GOAWAY ENHANCE_YOUR_CALM). Past a
// bound the client is refused, never served without limit: a refusal of
// Check is a gRPC error, which Envoy turns into its status_on_error.
//
// Shutdown: readiness and health go NOT_SERVING, a drain delay lets Envoy
// and load balancers notice (every port goes on serving, streams
// included), the long-lived access-log and RLQS streams are ended,
// then GracefulStop (of both gRPC listeners) lets in-flight checks finish,
// with a deadline after which remaining streams are cut, then the HTTP
// listeners close. Readiness can also wait for other components
// (ReadyAfter), such as a cluster node's warm start, and its body can
// carry other components' state (ReadyDetail).
package server
