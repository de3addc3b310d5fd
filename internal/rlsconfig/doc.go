// Package rlsconfig reads envoyproxy/ratelimit's YAML configuration as is,
// so that its users can point the same files at ratelimit-authz: parse and
// validate, load upstream's runtime directory layout, find the most
// specific rule for a request descriptor, and name each rule's counters.
// docs/envoyproxy-ratelimit.md §1 and §3.1 are the reference.
//
// # Parsing
//
// Parse reads one domain per file (domain, descriptors: key, value,
// rate_limit {unit, requests_per_unit, unlimited, name, replaces},
// shadow_mode, detailed_metric, value_to_metric, share_threshold,
// quota_mode, metadata, descriptors) and reports every problem of every
// file at once, each as file:line:column and upstream's message text; it
// returns a Config only when there is none. Files are taken in name
// order, so which of two files a duplicate domain or key is reported on
// does not change between runs (upstream's order is random).
//
// Two extensions, inside rate_limit: algorithm: fixed | sliding
// (Options.DefaultAlgorithm otherwise), and overridable: true, which lets
// tenant overrides from Postgres replace the rule's limit under the
// bucket name rate_limit.name.
//
// Where this differs from upstream, deliberately:
//
//   - A request entry reaches a descriptor only under the descriptor's
//     own key. Upstream looks descriptors up by the string key + "_" +
//     value, so key "a" with value "b" also reaches a descriptor whose key
//     is "a_b", and a '*' in a key makes a wildcard over that string;
//     here a key is always literal. Such configurations are still
//     reported as upstream reports them (duplicate composite key).
//     This is what makes each rule's counter key a function of the
//     request's values alone.
//   - Stats keys (Rule.StatsKey) and every metric label come from the
//     configuration, never from request values: detailed_metric and
//     value_to_metric are accepted and validated but change nothing, since
//     a label per request value is unbounded cardinality an attacker
//     chooses.
//   - quota_mode: true is refused ("not supported"); quota_mode: false is
//     accepted.
//   - A field in the wrong place (unit in a descriptor, shadow_mode in
//     rate_limit) is a problem saying where it belongs (upstream checks
//     names against one flat list and ignores a misplaced one silently),
//     and so is a field given twice in one mapping.
//   - A window longer than counter.MaxScaleMS (unit: year), or
//     requests_per_unit above counter.MaxLimit, is a problem naming the
//     bound: the counters cannot keep it.
//
// docs/migrating-from-envoyproxy-ratelimit.md lists every kind of file
// upstream loads and Parse refuses; each problem says how to fix it.
//
// Scalars, aliases and merge keys are read as gopkg.in/yaml.v2 v2.4.0,
// upstream's decoder, reads them into its structs: booleans also in YAML
// 1.1 spellings (yes, no, on, off), integers with a sign or a base prefix,
// a !!binary value as the bytes it encodes, metadata keys of any scalar
// (1, true). A merge key (<<) stands, where it is written, for the pairs
// of the mapping it names, or of each mapping of a list, of which the
// earlier wins: the pair applied last holds, so a key written after the
// merge overrides a merged one, and a merge written after a key overrides
// that key. A rate_limit given twice that way combines its fields (upstream
// decodes both into one struct); a null one drops them.
//
// Hostile or mistaken files cost bounded memory and time: MaxFileBytes
// per file, MaxDescriptors over all files, MaxDepth levels, YAML aliases
// and merged pairs counted each time they are used (an alias or merge bomb
// is refused), merges of merges at most 64 deep, at most MaxProblems
// problems reported.
//
// # Matching and counter keys
//
// Config.Match is upstream's lookup (exact value, else the first matching
// wildcard value in file order, else the key without value; the depth must
// equal the rule's; no backtracking) and appends the rule's counter key:
// the request's values, or the wildcard value at share_threshold levels.
// It does not allocate beyond the key it grows. Every name a Config gives
// a bucket is unique across its domains, deterministic on every node that
// loads the same files, at most MaxBucketName bytes, and never a valid
// ext_authz bucket name.
//
// # Loading
//
// Load reads upstream's runtime layout in both RUNTIME_WATCH_ROOT modes
// and LoadDir a plain directory; both follow symbolic links, always skip
// a Kubernetes ConfigMap's ".." entries, and bound what a directory can
// cost (MaxFiles, MaxEntries, MaxDirDepth, MaxTotalBytes). Failure mode:
// Parse and Load return problems and no Config, so a caller that already
// serves a Config keeps it (upstream keeps the last good configuration
// too).
//
// A Config is immutable and safe for concurrent use.
package rlsconfig
