// Package descriptors turns one HTTP request, as Envoy's ext_authz
// CheckRequest describes it, into rate-limit descriptors: which configured
// buckets apply and the key each one counts under. It is a leaf: the caller
// reads the fields it needs out of the CheckRequest into a Request (only the
// headers HeaderNames lists, the body only when WantsBody; package
// checkwire decodes them straight from the wire), and applies limits,
// missing-key policy and metrics itself.
//
// # Which buckets apply
//
// Routes are tried in config order and the first match wins. A route
// matches when its method is "" or equals the request's (case-sensitive)
// and its template matches the path. The path is the raw :path cut at the
// first "?" or "#", normalised as Envoy's normalize_path and merge_slashes
// would (see normalizePath): "\" → "/", percent-escapes of unreserved
// characters decoded, "." and ".." segments resolved (never above the
// root), repeated slashes merged. Envoy already did this when the HCM is
// configured so; the server repeats it so that "//api///activities" or
// "/api/x/../activities" cannot dodge a limit when it is not. A path that
// needs none of this is not copied. Matching is case-sensitive and byte for
// byte otherwise (other escapes are not decoded); a trailing slash matters,
// as it does to Envoy: "/api/activities/" does not match "/api/activities".
// A {name} capture takes exactly one non-empty segment.
//
// Envoy can override the route per Envoy route through
// check_settings.context_extensions: ExtRoute names a route (by Route.Name)
// that then applies whatever the method (routes may share a name, one rule
// with several templates: the first whose template matches the path is
// taken, else the first of them); ExtBuckets lists bucket names that apply
// instead of the route's (unknown names are skipped and counted in
// Result.UnknownBuckets; a present but empty list exempts the request). An
// unknown ExtRoute is reported in Result.UnknownRoute and ignored.
//
// Route lookup: routes are indexed by their first literal segment; a path
// is only tried against the routes sharing its first segment plus those
// starting with a capture, in config order. That is enough for the tens to
// hundreds of routes a config holds, without the complexity of a full
// segment trie.
//
// # Keys
//
//   - tenant: the Config.TenantHeader value, as sent. The edge must strip a
//     client-supplied copy.
//   - ip: Result.ClientIP, the trusted client: x-envoy-external-address when
//     Config.UseExternalAddressHeader and the header is set; else, when
//     Config.TrustedHops = N > 0 and x-forwarded-for has at least N+1
//     entries (Envoy appended the peer), entry N counted from the right;
//     else the TCP peer. A chosen value that is not an IP address falls back
//     to the peer, and a peer that is not one either gives "" (missing):
//     never one shared key for every client. The address is canonicalised
//     (IPv4-mapped IPv6 unmapped, IPv6 lower-case and compressed). The key
//     of an ip-keyed bucket is that address for IPv4 and its network for
//     IPv6 ("2001:db8:1:2::/64", Config.IPv6Prefix, default /64): one host
//     usually owns a whole /64, and per-address keys would give it 2^64
//     budgets.
//   - account: every account the login presents, each normalised (trimmed,
//     lower-cased) and counted once: Config.AccountHeader and
//     Config.AccountBodyField of a form-urlencoded or JSON (top-level
//     string member) body. The application may read either, so a bucket
//     keyed by account has one descriptor per account (at most
//     MaxAccounts), and one more keyed UnreadableAccount when the request
//     names none, or one that cannot be read (below). Only computed when a
//     bucket that applies keys by account.
//   - path param: the raw (percent-encoded as sent) segment of the capture.
//   - header: the header value, as sent.
//
// Keys are substrings of the request (nothing is copied) except an account
// that had to be lower-cased or unescaped, a client IP that had to be
// canonicalised, or an IPv6 network.
//
// # Failure mode
//
// Describe never fails and never panics on hostile input; it decides
// nothing either. A key the request lacks is reported as "" and the caller
// applies its missing-key policy (allow or deny, counted); it must never
// count "" as a key.
//
// An account is never missing: a login that cannot be read is keyed
// UnreadableAccount (Result.AccountUnreadable), one key shared by every
// such login, and the caller counts it there or refuses it. Unreadable:
// no account at all; an account header that is blank, not UTF-8 or holds
// a comma (Envoy joins a repeated header with ","); a body that is
// malformed, not UTF-8, over 64 KiB, shorter than its content-length,
// not form-urlencoded or JSON, or not marked complete by Envoy
// (x-envoy-auth-partial-body is anything but "false": Envoy sets it on
// every buffered body, "true" when it cut the body at max_request_bytes);
// a field that appears more than once with different values, with a
// non-string value, or (JSON) under keys differing only in case. Parsers
// disagree about which copy wins, and an attacker must not have one
// account counted while the application checks another.
//
// A path longer than 8 KiB (without its query string) matches no route:
// Result.Route is -1 and Result.PathTooLong is set, so the caller can deny
// it rather than let it through unlimited. Keys are not truncated: the
// counter bounds and digests them. The body is only read up to 64 KiB and
// JSON nesting up to 64 levels (internal/jsonscan, the product's one JSON
// scanner).
//
// # Names
//
// This package defines, once for the whole product, what a bucket name
// (ValidBucketName), a header name (HeaderNameProblem), a path parameter's
// name (ValidParamName) and a method (ValidMethod) are, and when two routes
// are one route given twice (RouteKey). The configuration parser and the
// override store hold their input to these; New checks them again, so an
// Engine never holds anything else.
//
// # Concurrency and cost
//
// An Engine is immutable after New and safe for concurrent use. Describe
// does no I/O, starts no goroutine, and does not allocate on a typical
// request when dst has room for the descriptors (see the benchmarks and
// TestDescribeAllocs).
package descriptors
