// Package match turns one HTTP request, as Envoy's ext_authz
// CheckRequest describes it, into rate-limit descriptors: which configured
// buckets apply and the key each one counts under. It is a leaf: the caller
// reads the fields it needs out of the CheckRequest into a checkreq.Request
// (only the headers HeaderNames lists, the body only when WantsBody; package
// checkwire decodes them straight from the wire), and applies limits,
// missing-key policy and metrics itself. It also defines, once for the
// product, what a bucket name, a header name, a path parameter's name and a
// method are (ValidBucketName, HeaderNameProblem, ValidParamName,
// ValidMethod) and when two routes are one (RouteKey).
//
// Invariants: routes are tried in config order and the first match wins,
// on the path normalised as Envoy's normalize_path and merge_slashes would,
// so "//api///x" or "/api/y/../x" cannot dodge a limit; the ip key is the
// trusted client (Config.TrustedHops, Config.UseExternalAddressHeader),
// canonicalised, and an IPv6 client's /64 (Config.IPv6Prefix), never one
// key shared by every client; an account is read from the header and the
// body alike and counted once each. An Engine is immutable after New and
// safe for concurrent use; Describe does no I/O and does not allocate on a
// typical request when dst has room.
//
// Failure mode: Describe never fails, never panics on hostile input, and
// decides nothing. A key the request lacks is "" and the caller applies its
// missing-key policy (it must never count "" as a key). A login whose
// account cannot be read (absent, malformed, ambiguous, a body cut or over
// 64 KiB) is keyed UnreadableAccount. A path over 8 KiB matches no route
// and sets Result.PathTooLong, so the caller can deny it.
//
// The design (which buckets apply, keys, the failure mode in detail) is in
// docs/design/routes-and-keys.md.
package match
