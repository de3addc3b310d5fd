package main

import (
	"fmt"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// RLS load: the descriptors Envoy's rate limit filter would send for one
// request of the example API, with a route configuration of up to three
// rate_limits entries:
//
//  1. remote_address                     ("remote_address", <client IP>)
//  2. generic_key + request_headers      ("generic_key", <route>), ("tenant", <x-tenant-id or "-">)
//  3. request_headers :path              ("path", <path>)
//
// rlsBenchConfig is the envoyproxy/ratelimit configuration of domain
// rlsBenchDomain that gives each of them one limit.
const (
	rlsBenchDomain  = "bench"
	maxRLSDescripts = 3
	// rlsProbeDomain is the preflight probe's domain: configured nowhere,
	// so the probe is answered OK without counting against any key.
	rlsProbeDomain = "ratelimit-bench-preflight"
)

// rlsBenchConfig returns the descriptor file of domain "bench" with every
// rule at perUnit requests per unit ("second", "minute", …).
func rlsBenchConfig(perUnit uint32, unit string) string {
	rl := fmt.Sprintf("{unit: %s, requests_per_unit: %d}", unit, perUnit)
	return "domain: " + rlsBenchDomain + "\ndescriptors:\n" +
		"  - key: remote_address\n    rate_limit: " + rl + "\n" +
		"  - key: generic_key\n    descriptors:\n      - key: tenant\n        rate_limit: " + rl + "\n" +
		"  - key: path\n    rate_limit: " + rl + "\n"
}

// rlsRequest builds the RateLimitRequest for r with the first n
// descriptors of the list above.
func rlsRequest(r request, n int) *rlsv3.RateLimitRequest {
	tenant := r.headers["x-tenant-id"]
	if tenant == "" {
		tenant = "-"
	}
	all := []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: r.clientIP}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: r.route}, {Key: "tenant", Value: tenant}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "path", Value: r.path}}},
	}
	domain := rlsBenchDomain
	if r.route == "unmatched" {
		domain = rlsProbeDomain
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: all[:n]}
}

// rlsLoad is ShouldRateLimit with the first n descriptors: OVER_LIMIT is
// a denial, any other overall_code lets the request through, as Envoy does.
func rlsLoad(n int) (grpcLoad, error) {
	if n < 1 || n > maxRLSDescripts {
		return grpcLoad{}, fmt.Errorf("--descriptors %d: must be from 1 to %d", n, maxRLSDescripts)
	}
	return grpcLoad{method: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", mix: describeRLS(n),
		encode: func(r request, _ uint64) ([]byte, error) { return proto.Marshal(rlsRequest(r, n)) },
		judge: func(b []byte) (outcome, error) {
			code, err := codeField(b) // overall_code
			return overLimit(code == int32(rlsv3.RateLimitResponse_OVER_LIMIT)), err
		}}, nil
}

// overLimit is the outcome of a rate limit service's answer.
func overLimit(over bool) outcome {
	if over {
		return outcome{class: classDenied, code: int(codes.ResourceExhausted)}
	}
	return outcome{class: classAllowed}
}

// describeRLS is the "mix" a run reports: domain and descriptors.
func describeRLS(n int) string {
	names := []string{"remote_address", "generic_key+tenant", "path"}
	return "rls domain=" + rlsBenchDomain + " descriptors=" + strings.Join(names[:n], ",")
}
