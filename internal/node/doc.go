// Package node assembles one ratelimit-authz node from a Config: the
// in-memory counter, the tenant-override cache (with a database URL), the
// replicator (with a Cluster), the front ends it lists in frontends.go
// (the ext_authz Check, failed-login counting, RLQS, ShouldRateLimit),
// the listeners of package server, and the Prometheus registry every
// component reports to.
//
// Invariants:
//
//   - New builds every component and binds every listener (the address
//     accessors answer as soon as it returns) and makes no connection to
//     NATS; Run serves until its context ends, then shuts down. A Node whose
//     Run is never called must be released with Close. A Node holds no
//     package-level state: several may run in one process.
//   - Shutdown is ordered: the server drains and stops every front end
//     before the replicator stops, so its final batch carries every check
//     answered meanwhile.
//   - The node reads its configuration files itself (Config.RulesFile,
//     the RLS files): at start, at ReloadFiles (SIGHUP) and, with
//     Config.Watch, when they change.
//   - A reload (ReloadFiles, ReloadSources) compiles the sources into one
//     snapshot and has every component prepare it (an error changes
//     nothing), then swaps them all and drops the counts of the ids the
//     old snapshot had and the new one lacks; a bucket keeps its counts
//     while its name, window, algorithm and reserve hold. Reloads are
//     serialised; one changing the counter's bounds is refused.
//
// Failure mode: New returns an error for a Config it cannot serve (no
// rules, a negative interval, a listener that cannot be bound, an invalid
// cluster or listener setting) and then holds nothing. A database or a NATS
// server that is away or hung degrades the node, never stops it: the first
// load of the tenant overrides waits at most 5 s, then the node serves its
// snapshot file or the configured limits and says which; without NATS it
// counts alone, and readiness waits for the peers' warm start at most
// Cluster.WarmStartTimeout. A listener that fails ends Run, which returns
// its error.
//
// The design (lifecycle, start, shutdown, reload) is in docs/design/node.md.
package node
