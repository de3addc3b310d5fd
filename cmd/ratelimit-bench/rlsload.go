package main

import (
	"fmt"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// shouldRateLimitMethod is the full gRPC method name of Envoy's rate limit
// service call.
const shouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

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

// newRLSCaller opens n connections (see dial) to the targets for
// ShouldRateLimit: OVER_LIMIT is a denial, any other overall_code lets
// the request through, as Envoy does.
func newRLSCaller(targets []string, n, descriptors int) (*grpcCaller, error) {
	if descriptors < 1 || descriptors > maxRLSDescripts {
		return nil, fmt.Errorf("--descriptors %d: must be from 1 to %d", descriptors, maxRLSDescripts)
	}
	conns, err := dial(targets, n, rawCodec{read: codeField}) // overall_code
	if err != nil {
		return nil, err
	}
	return &grpcCaller{conns: conns, method: shouldRateLimitMethod, what: "RateLimitRequest",
		encode: func(r request, _ uint64) ([]byte, error) { return proto.Marshal(rlsRequest(r, descriptors)) },
		judge: func(code int32) (int, int) {
			if rlsv3.RateLimitResponse_Code(code) == rlsv3.RateLimitResponse_OVER_LIMIT {
				return classDenied, int(codes.ResourceExhausted)
			}
			return classAllowed, 0
		}}, nil
}

// describeRLS is the "mix" a run reports: domain and descriptors.
func describeRLS(n int) string {
	names := []string{"remote_address", "generic_key+tenant", "path"}
	return "rls domain=" + rlsBenchDomain + " descriptors=" + strings.Join(names[:n], ",")
}
