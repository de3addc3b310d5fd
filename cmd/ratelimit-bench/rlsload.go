package main

import (
	"fmt"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
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
	rlsBenchDomain = "bench"
	// rlsProbeDomain is the preflight probe's domain: configured nowhere,
	// so the probe is answered OK without counting against any key.
	rlsProbeDomain = "ratelimit-bench-preflight"
)

// rlsDescriptorNames are the descriptors a call sends, in order: a load
// of --descriptors n sends the first n.
func rlsDescriptorNames() []string { return []string{"remote_address", "generic_key+tenant", "path"} }

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
	names := rlsDescriptorNames()
	if n < 1 || n > len(names) {
		return grpcLoad{}, fmt.Errorf("--descriptors %d: must be from 1 to %d", n, len(names))
	}
	return grpcLoad{method: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
		mix:    "rls domain=" + rlsBenchDomain + " descriptors=" + strings.Join(names[:n], ","),
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

// guberLoad is gubernator's GetRateLimits (pb.gubernator.V1), an anchor
// the bench measures beside ShouldRateLimit. gubernator has no
// configuration file: each call carries its limits, one RateLimitReq per
// descriptor the rls load would send, so both loads count the same keys.
// Any OVER_LIMIT is a denial.
func guberLoad(descriptors int, limit int64, per time.Duration) (grpcLoad, error) {
	l, err := rlsLoad(descriptors)
	if err != nil {
		return l, err
	}
	if limit < 1 || per < time.Millisecond {
		return l, fmt.Errorf("--limit %d per %v: the limit must be at least 1 and the window at least 1ms", limit, per)
	}
	l.method = "/pb.gubernator.V1/GetRateLimits"
	l.encode = func(r request, _ uint64) ([]byte, error) { return guberRequest(r, descriptors, limit, per), nil }
	l.judge = func(b []byte) (outcome, error) {
		over, err := guberStatus(b)
		return overLimit(over == 1), err
	}
	return l, nil
}

// guberRequest encodes GetRateLimitsReq by hand (gubernator's module needs
// a newer Go than the server's): requests = 1, each RateLimitReq with
// name = 1 (the domain and the descriptor's first key), unique_key = 2
// (its values), hits = 3, limit = 4, duration (ms) = 5; token bucket.
func guberRequest(r request, descriptors int, limit int64, per time.Duration) []byte {
	rr := rlsRequest(r, descriptors)
	var b []byte
	for _, d := range rr.Descriptors {
		var key []byte
		for i, e := range d.Entries {
			if i > 0 {
				key = append(key, '_')
			}
			key = append(key, e.Value...)
		}
		m := protowire.AppendTag(nil, 1, protowire.BytesType)
		m = protowire.AppendString(m, rr.Domain+"_"+d.Entries[0].Key)
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, key)
		for _, f := range []struct {
			num protowire.Number
			v   uint64
		}{{3, 1}, {4, uint64(limit)}, {5, uint64(per.Milliseconds())}} {
			m = protowire.AppendVarint(protowire.AppendTag(m, f.num, protowire.VarintType), f.v)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), m)
	}
	return b
}

// guberStatus reads GetRateLimitsResp: 1 when any RateLimitResp
// (responses = 1) has status (= 1) OVER_LIMIT (1), an error when one
// carries an error (= 5), else 0.
func guberStatus(b []byte) (over int32, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		resp, _ := protowire.ConsumeBytes(v) // whole: eachField checked it
		st, err := codeField(resp)
		if err != nil {
			return err
		}
		if st == 1 {
			over = 1
		}
		if e, _ := lastField(resp, 5, protowire.BytesType); len(e) > 0 {
			if msg, _ := protowire.ConsumeBytes(e); len(msg) > 0 {
				return fmt.Errorf("gubernator: %s", msg)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return over, nil
}
