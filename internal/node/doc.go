// Package node assembles one ratelimit-authz node from a Config: the
// in-memory counter, the route matcher, the ext_authz Check service,
// failed-login counting (Envoy's access log and POST /v1/failures), the
// tenant-override cache (with a database URL), the replicator (with a
// Cluster), the listeners of package server, and the Prometheus registry
// every component reports to (with build_info, the Go and process
// collectors, and the counter's live_keys, max_keys, reserved_keys and
// keys_refused_total).
//
// # Lifecycle
//
// New builds every component and binds every listener, so the address
// accessors answer as soon as New returns (with port 0: the port the
// kernel chose); a connection made before Run waits in the listen queue.
// New makes no connection to NATS and holds none to Postgres. Run serves
// until its context ends and then shuts down; a Node whose Run is never
// called must be released with Close. A Node holds no package-level state:
// several may run in one process, each with its own registry.
//
// # Start
//
//   - The tenant overrides are loaded once in New, waiting at most 5 s. A
//     node that cannot reach Postgres starts anyway, on its snapshot file
//     or on the configured limits, and says which (log, /readyz,
//     metrics); the cache keeps retrying in Run. A hung database never
//     holds a start longer than that.
//   - The replicator connects in Run. NATS being away is not an error: the
//     node counts alone until it can reach it. Checks are answered from
//     the start; readiness (gRPC health SERVING, /readyz 200) waits for
//     the warm start from the peers, at most Cluster.WarmStartTimeout.
//
// # Shutdown
//
// When Run's context ends, the counter's sweeper stops and the override
// cache stops refreshing (it keeps serving what it holds and closes its
// Postgres connection), while the server reports NOT_SERVING, waits the
// drain delay (serving on every port, streams included), ends the
// access-log and RLQS streams, stops gRPC gracefully within
// the shutdown timeout and closes the HTTP listeners. Only then does the
// replicator stop: its final batch carries every check answered during
// the drain and the graceful stop, which a replicator stopped earlier
// would leave out of the other nodes' counts. A listener that fails ends
// Run the same way, and Run returns its error; options nats.go refuses
// (an unreadable credentials file) do too.
//
// # Reload
//
// Reload (ReloadSources, ReloadFrom) swaps in a new configuration while
// the node serves: every part of the new generation is built first (an
// error changes nothing), then each component takes it with Update, then
// the counts of buckets that went away are dropped. A bucket keeps its
// counter id (package wiring's IDs) and so its counts while its name,
// window, algorithm and reserve hold. The counter's bounds are sized at
// start: a reload changing them is refused. Reloads are serialised, and
// counted in config_reloads_total{result}.
//
// # Failure modes
//
// New returns an error for a Config it cannot serve (no rules, a negative
// interval, a listener that cannot be bound, an invalid cluster or
// listener setting) and then holds nothing. A database or a NATS server
// that is away or hung degrades the node (configured limits or the
// snapshot file; per-node counts), never stops it.
package node
