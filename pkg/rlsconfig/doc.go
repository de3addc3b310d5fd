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
//     and so is a field given twice.
//   - Booleans may be spelled as YAML 1.1 does (yes, no, on, off), as
//     upstream's YAML 1.1 decoder reads them; YAML merge keys (<<) are not
//     supported (an unknown key).
//   - A window longer than counter.MaxScaleMS, or requests_per_unit above
//     counter.MaxLimit, is a problem naming the bound: the counters cannot
//     keep it.
//
// Hostile or mistaken files cost bounded memory and time: MaxFileBytes
// per file, MaxDescriptors over all files, MaxDepth levels, YAML aliases
// counted each time they are used (an alias bomb is refused), at most
// MaxProblems problems reported.
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
