// Package rlsconfig reads envoyproxy/ratelimit's YAML configuration as is,
// so that its users can point the same files at ratelimit-authz: parse and
// validate (Parse), load upstream's runtime directory layout (Load,
// LoadDir), find the most specific rule for a request descriptor
// (Config.Match), and name each rule's counters. docs/envoyproxy-ratelimit.md
// §1 and §3.1 are the reference; four extensions sit inside rate_limit:
// algorithm (fixed | sliding), overridable, charge, and count:
// concurrency with lease_ttl (requests in flight, the descriptor's own
// entry being the request id, left out of the counter key).
//
// Invariants:
//
//   - Config.Match is upstream's lookup, and a rule's counter key is a
//     function of the request's values alone: a request entry reaches a
//     descriptor only under the descriptor's own key, which is literal.
//   - Every bucket name a Config gives is unique across its domains, the
//     same on every node that loads the same files, at most MaxBucketName
//     bytes, and never a valid ext_authz bucket name.
//   - Stats keys and metric labels come from the configuration, never from
//     request values.
//   - Scalars, aliases and merge keys read as gopkg.in/yaml.v2 v2.4.0,
//     upstream's decoder, reads them.
//   - A Config is immutable and safe for concurrent use.
//
// Failure mode: Parse and Load report every problem of every file at once
// (file:line:column and upstream's message text) and return no Config, so a
// caller that serves a Config keeps it. What upstream would load but cannot
// be honoured here (quota_mode: true, a misplaced or repeated field, a window
// or limit the counters cannot keep) is a problem, never silently ignored.
// Hostile files cost bounded memory and time: MaxFileBytes, MaxDescriptors,
// MaxDepth, aliases and merges counted at every use, MaxProblems, and
// MaxFiles, MaxEntries, MaxDirDepth, MaxTotalBytes for a directory.
//
// What is read, how it differs from upstream and why, is in
// docs/design/envoyproxy-ratelimit-config.md.
package rlsconfig
